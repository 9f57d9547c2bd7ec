"""One digest of a model's parameters: runs that must not change a model prove it by equal
digests (same model, seed and schedule: the same bits).

`params_sha256` hashes, for each parameter in the whole model's order (the one-stage model's
`named_parameters()`, each name once: the tied output weight is the embedding's): its name
(UTF-8), a NUL byte, its dtype's name (e.g. "float32"), a NUL byte, its shape as decimal sizes
joined by "," and a NUL byte, then its values as raw little-endian bytes in C order (a
contiguous CPU copy, no rounding).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from pipeline.runtime.config import RankResult

__all__ = ["params_sha256", "whole_model_params"]


def params_sha256(params: Iterable[tuple[str, np.ndarray]]) -> str:
    digest = hashlib.sha256()
    for name, values in params:
        shape = ",".join(str(size) for size in values.shape)
        digest.update(f"{name}\0{values.dtype.name}\0{shape}\0".encode())
        digest.update(_bytes(values))
    return digest.hexdigest()


def whole_model_params(results: Sequence[RankResult]) -> list[tuple[str, np.ndarray]]:
    """The whole model's parameters from replica 0's stages, in stage order, each name once.
    Every other copy that `results` hold (another replica's, the last stage's copy of the tied
    weight) must have the same bits: the digest reads one copy, so a copy that drifted from it
    (in the last step, or on a replica whose gradients never reach replica 0's again) would
    leave the digest unchanged. ValueError names the first that differs."""
    ordered = sorted(results, key=lambda r: (r.replica, r.stage))
    first: dict[str, tuple[int, np.ndarray]] = {}
    params = []
    for result in ordered:
        if result.step_output.params is None:
            if result.replica == 0:
                raise ValueError(f"rank {result.rank} returned no parameters (collect_params)")
            continue  # nothing to compare
        for name, values in result.step_output.params:
            held = first.get(name)
            if held is None:
                if result.replica != 0:
                    raise ValueError(f"rank {result.rank} holds {name!r}, which replica 0 lacks")
                first[name] = (result.rank, values)
                params.append((name, values))
            elif not _same_bits(held[1], values):
                raise ValueError(
                    f"rank {result.rank}'s {name!r} differs from rank {held[0]}'s copy: the "
                    "copies of a parameter must hold the same bits"
                )
    return params


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and values' bits as the digest reads them (NaN payloads and
    signed zeros included)."""
    return a.dtype.name == b.dtype.name and a.shape == b.shape and _bytes(a) == _bytes(b)


def _bytes(values: np.ndarray) -> bytes:
    """The values' raw little-endian bytes in C order: what the digest hashes."""
    return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes()
