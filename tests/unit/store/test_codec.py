import numpy as np

from liveloop.store import codec


def test_ids_round_trip_and_size():
    ids = [0, 1, 50_000, 2**31 - 1]
    blob = codec.encode_ids(ids)
    assert len(blob) == 4 * len(ids)  # 4 bytes a token
    assert codec.decode_ids(blob).tolist() == ids


def test_floats_are_float32_exact():
    values = [-0.125, -3.5, 0.0]
    assert codec.decode_floats(codec.encode_floats(values)).tolist() == values
    x = np.float32(-1.2345678)
    assert codec.decode_floats(codec.encode_floats([x]))[0] == x


def test_mask_round_trip():
    assert codec.decode_mask(codec.encode_mask([1, 0, 1])).tolist() == [1, 0, 1]


def test_tuples_and_arrays_encode_to_the_same_bytes():
    """The write path packs tuples with struct; numpy arrays and odd values take numpy's path."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 2**31 - 1, 257)
    assert codec.encode_ids(tuple(ids.tolist())) == codec.encode_ids(ids) == ids.astype("<i4").tobytes()
    values = (-rng.exponential(1.0, 257)).astype(np.float32)
    assert codec.encode_floats(tuple(values.tolist())) == codec.encode_floats(values) == values.astype("<f4").tobytes()
    # numpy scalars, -inf, and a finite value beyond float32 (numpy rounds it to -inf)
    assert codec.encode_ids((np.int64(3), 4)) == np.asarray([3, 4], "<i4").tobytes()
    odd = (float("-inf"), -1e39, -0.5)
    with np.errstate(over="ignore"):
        assert codec.encode_floats(odd) == np.asarray(odd, dtype=np.float64).astype("<f4").tobytes()
        assert codec.decode_floats(codec.encode_floats(odd)).tolist() == [float("-inf"), float("-inf"), -0.5]
    assert codec.encode_ids(()) == b"" and codec.encode_floats(()) == b""
