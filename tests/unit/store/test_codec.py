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
