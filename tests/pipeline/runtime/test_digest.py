"""The parameter digest: its encoding, byte order and what changes it."""

import hashlib

import numpy as np
import pytest

from pipeline.runtime.config import RankResult, StepOutput
from pipeline.runtime.digest import params_sha256, whole_model_params


def test_the_digest_is_sha256_over_name_dtype_shape_and_little_endian_bytes() -> None:
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    bias = np.array([0.5, -1.0], dtype=np.float64)
    expected = hashlib.sha256(
        b"w\0float32\x002,3\0" + weight.astype("<f4").tobytes() + b"b\0float64\x002\0"
        b"\x00\x00\x00\x00\x00\x00\xe0?\x00\x00\x00\x00\x00\x00\xf0\xbf"
    ).hexdigest()
    assert params_sha256([("w", weight), ("b", bias)]) == expected
    big_endian = weight.astype(">f4")  # the same values in the other byte order
    assert params_sha256([("w", big_endian), ("b", bias)]) == expected
    assert params_sha256([("w", weight.T.copy().T), ("b", bias)]) == expected  # any layout


@pytest.mark.parametrize(
    "change",
    [
        lambda w: [("w2", w)],  # the name
        lambda w: [("w", w.reshape(3, 2))],  # the shape
        lambda w: [("w", w.astype(np.float64))],  # the dtype
        lambda w: [("w", np.nextafter(w, np.inf))],  # one ulp everywhere
    ],
)
def test_any_change_changes_the_digest(change) -> None:
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert params_sha256(change(weight)) != params_sha256([("w", weight)])


def _result(stage: int, replica: int, params: tuple | None) -> RankResult:
    return RankResult(stage, stage, replica, 0, [], [], [], 0.0, 0.0, 0, StepOutput(params=params))


def test_the_whole_model_is_replica_0_s_stages_in_order_each_name_once() -> None:
    tied, layer = np.ones(2, np.float32), np.zeros(3, np.float32)
    results = [
        _result(1, 0, (("layer.1", layer), ("embedding", tied))),  # the tied output copy
        _result(0, 1, (("embedding", tied + 1),)),  # another replica: not read
        _result(0, 0, (("embedding", tied), ("layer.0", layer))),
    ]
    names = [name for name, _ in whole_model_params(results)]
    assert names == ["embedding", "layer.0", "layer.1"]
    with pytest.raises(ValueError, match="rank 0 returned no parameters"):
        whole_model_params([_result(0, 0, None)])
