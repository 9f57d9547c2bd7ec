"""The `megatron` backend: megatron-core GPT stages with a true B/W split (see backend.py).

Importing this package does not import megatron-core; its modules do when called, and a
megatron pool's worker fork server imports it once (`WORKER_IMPORTS`).
"""

from pipeline.runtime.megatron.backend import MegatronCompute
from pipeline.runtime.megatron.model import MODELS, GPTPreset, get_preset

__all__ = ["MODELS", "WORKER_IMPORTS", "GPTPreset", "MegatronCompute", "get_preset"]

WORKER_IMPORTS = ("pipeline.runtime.megatron.preload",)
"""What a megatron pool's workers import from their fork server (`preload_in_workers`)."""
