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
        little = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
        shape = ",".join(str(size) for size in values.shape)
        digest.update(f"{name}\0{values.dtype.name}\0{shape}\0".encode())
        digest.update(little.tobytes())
    return digest.hexdigest()


def whole_model_params(results: Sequence[RankResult]) -> list[tuple[str, np.ndarray]]:
    """The whole model's parameters from replica 0's stages (DP replicas hold equal copies),
    in stage order, each name once."""
    stages = sorted((r for r in results if r.replica == 0), key=lambda r: r.stage)
    seen: set[str] = set()
    params = []
    for result in stages:
        if result.step_output.params is None:
            raise ValueError(f"rank {result.rank} returned no parameters (collect_params)")
        for name, values in result.step_output.params:
            if name not in seen:
                seen.add(name)
                params.append((name, values))
    return params
