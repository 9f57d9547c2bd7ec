"""The `megatron` backend: megatron-core GPT stages with a true B/W split (see backend.py).

Importing this package does not import megatron-core; its modules do when called.
"""

from pipeline.runtime.megatron.backend import MegatronCompute
from pipeline.runtime.megatron.model import MODELS, GPTPreset, get_preset

__all__ = ["MODELS", "GPTPreset", "MegatronCompute", "get_preset"]
