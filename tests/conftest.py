"""Test-wide settings. JAX's global flags are left at their defaults: tests that need 64-bit
types enable them locally with ``jax.enable_x64(True)``."""
