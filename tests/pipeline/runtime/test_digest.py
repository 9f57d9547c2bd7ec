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
        _result(0, 1, (("embedding", tied.copy()),)),  # another replica: compared, not hashed
        _result(1, 1, None),  # a rank of another replica that returned none: nothing to compare
        _result(0, 0, (("embedding", tied), ("layer.0", layer))),
    ]
    names = [name for name, _ in whole_model_params(results)]
    assert names == ["embedding", "layer.0", "layer.1"]
    with pytest.raises(ValueError, match="rank 0 returned no parameters"):
        whole_model_params([_result(0, 0, None)])


ONES, ZEROS = np.ones(2, np.float32), np.zeros(2, np.float32)


@pytest.mark.parametrize(
    ("rank", "hashed", "drifted"),
    [
        (2, ONES, np.nextafter(ONES, np.inf)),  # another replica's, one ulp off
        (1, ONES, np.nextafter(ONES, np.inf)),  # the last stage's copy of the tied weight
        (1, ZEROS, -ZEROS),  # -0.0 == 0.0, but not the same bits
    ],
    ids=["replica", "tied-copy", "signed-zero"],
)
def test_a_copy_that_differs_from_the_hashed_one_is_refused(
    rank: int, hashed: np.ndarray, drifted: np.ndarray
) -> None:
    """The digest reads replica 0's first copy of each parameter: a copy that drifted from it
    (in the last step, or on another replica) left the digest as it was, as if the run had
    trained one model."""
    copies = {r: drifted if r == rank else hashed for r in (0, 1, 2)}
    results = [  # ranks 0 and 1: stages 0 and 1 of replica 0; rank 2: stage 0 of replica 1
        _result(0, 0, (("embedding", copies[0]),)),
        _result(1, 0, (("embedding", copies[1]),)),
        RankResult(
            2, 0, 1, 0, [], [], [], 0.0, 0.0, 0, StepOutput(params=(("embedding", copies[2]),))
        ),
    ]
    with pytest.raises(ValueError, match=f"rank {rank}'s 'embedding' differs from rank 0's"):
        whole_model_params(results)
