"""Compact binary encoding of token arrays for the store's BLOB/BYTEA columns.

Token ids are little-endian int32, logprobs little-endian float32, masks uint8: 4 bytes a token
instead of ~8-20 as JSON text, and a zero-copy numpy view on read.

Records arrive as tuples of Python numbers (what the engine streamed), so the write path packs them
with `struct` (one C call, a third of the cost of building a numpy array first); numpy arrays take
numpy's path. Both give the same bytes.
"""

import struct
from collections.abc import Sequence

import numpy as np

_IDS = np.dtype("<i4")
_FLOATS = np.dtype("<f4")
_MASK = np.dtype("u1")


def encode_ids(ids: Sequence[int] | np.ndarray) -> bytes:
    if isinstance(ids, (tuple, list)):
        try:
            return struct.pack(f"<{len(ids)}i", *ids)
        except struct.error:
            pass  # not plain ints (numpy scalars, bools, out of range): numpy decides
    return np.asarray(ids, dtype=_IDS).tobytes()


def decode_ids(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=_IDS)


def encode_floats(values: Sequence[float] | np.ndarray) -> bytes:
    if isinstance(values, (tuple, list)):
        try:
            return struct.pack(f"<{len(values)}f", *values)
        except (struct.error, OverflowError):
            pass  # a finite value beyond float32 (numpy rounds it to inf) or not a number
    return np.asarray(values, dtype=_FLOATS).tobytes()


def decode_floats(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=_FLOATS)


def encode_mask(mask: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(mask, dtype=_MASK).tobytes()


def decode_mask(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=_MASK)
