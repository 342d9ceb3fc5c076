"""What the host CPU is, read once from ``/proc/cpuinfo``: the choices that depend on its
instructions (which 8-bit product, how wide XLA vectorizes) ask here."""

from __future__ import annotations

import functools


@functools.cache
def cpu_info() -> frozenset[str]:
    """The words of ``/proc/cpuinfo``: its flags (``avx512f``, ``amx_int8``...) and vendor
    (``AuthenticAMD``, ``GenuineIntel``) among them; empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(f.read().split())
    except OSError:
        return frozenset()
