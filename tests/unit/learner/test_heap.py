"""learner/heap.py: freed heap blocks that glibc keeps go back to the OS."""

import ctypes
import ctypes.util

import psutil
import pytest

from liveloop.learner import heap

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


@pytest.mark.skipif(heap._libc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
def test_trim_returns_freed_blocks_below_the_top_of_the_heap():
    # 256 MB in 64 KB blocks (below the mmap threshold: heap), written so they are resident, then freed
    # with one block above them kept: glibc's own trimming releases only the top of the heap, so
    # without trim() the 256 MB stay resident
    blocks = [libc.malloc(64 << 10) for _ in range(4096)]
    for b in blocks:
        libc.memset(b, 1, 64 << 10)
    pin = libc.malloc(64 << 10)
    proc = psutil.Process()
    for b in blocks:
        libc.free(b)
    held = proc.memory_info().rss
    assert heap.trim()
    released = held - proc.memory_info().rss
    libc.free(pin)
    assert released > 200 << 20, f"trim released {released >> 20} MB of 256"
