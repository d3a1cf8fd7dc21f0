"""Hands the learner's freed heap back to the operating system between bursts of steps.

A step of a real model allocates and frees a few hundred megabytes of activations, gradients and
logits in blocks that glibc's allocator keeps for reuse rather than returning: measured on SmolLM2
(bench/learner_real.py, the default's LoRA learner), the process held 1.45 GiB after four steps and
1.04 GiB after one `malloc_trim(0)`, which took 35 ms. The loop calls `trim()` when it goes idle,
never between the steps of a burst.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to hand back this way
        return None


def trim() -> bool:
    """Return the allocator's free pages to the OS; False where the C library has no malloc_trim."""
    fn = _libc_trim()
    if fn is None:
        return False
    fn(0)
    return True
