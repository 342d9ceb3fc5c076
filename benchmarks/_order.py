"""Orders for timing engines against each other in one process.

onnxruntime's worker threads keep spinning after its call returns and slow whatever runs
right after it (two identical jonnx models measured 254 against 180 ms at batch 1, the one
following onnxruntime slower). Rotating one fixed order does not help: in every rotation the
same engine follows onnxruntime (two identical MobileNetV2 models measured 9.5 against 8.6 ms,
the one listed after onnxruntime slower). These orders let each engine follow each other
equally often.
"""

from __future__ import annotations


def balanced_orders(n: int) -> list[list[int]]:
    """A Williams design: ``n`` orders of ``range(n)`` (``2n`` for odd ``n``) in which each
    engine comes right after each other one equally often."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(v + shift) % n for v in first] for shift in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 else rows
