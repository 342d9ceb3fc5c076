"""Counting XLA compilations in a test, with ``jax.monitoring``'s backend-compile event."""

from __future__ import annotations

import contextlib

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles: list[str] = []
_listening = False


@contextlib.contextmanager
def count_compiles():
    """Yields a list that receives one entry per XLA backend compilation in the block."""
    global _listening
    # Listeners cannot be removed: register one for the whole session.
    if not _listening:
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, duration, **kw: _compiles.append(event) if event == _COMPILE_EVENT else None
        )
        _listening = True
    start = len(_compiles)
    found: list[str] = []
    yield found
    found.extend(_compiles[start:])
