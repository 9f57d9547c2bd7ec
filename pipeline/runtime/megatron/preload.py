"""Imported by the workers' fork server for a megatron pool (`WORKER_IMPORTS`): the
megatron-core modules a stage's worker uses, imported once there (about 2.5 s of CPU here)
instead of once in each worker. Megatron's import-time warnings stay quiet, as in a worker.

An import that fails is left to the workers: the fork server survives only an ImportError
from a module it preloads, and dies on any other (a megatron-core built for another torch
raises AttributeError), which would fail every later pool of the process, emulated ones
too, with an EOFError. Each worker then imports megatron-core itself, and its failure names
its rank and the error, as without the preload."""

import contextlib

from pipeline.runtime.megatron.shim import quiet_megatron

with quiet_megatron(), contextlib.suppress(Exception):
    import megatron.core.models.gpt
    import megatron.core.models.gpt.gpt_layer_specs
    import megatron.core.parallel_state
    import megatron.core.process_groups_config
    import megatron.core.tensor_parallel  # noqa: F401
