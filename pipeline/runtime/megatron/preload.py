"""Imported by the workers' fork server for a megatron pool (`WORKER_IMPORTS`): the
megatron-core modules a stage's worker uses, imported once there (about 2.5 s of CPU here)
instead of once in each worker. Megatron's import-time warnings stay quiet, as in a worker."""

from pipeline.runtime.megatron.shim import quiet_megatron

with quiet_megatron():
    import megatron.core.models.gpt
    import megatron.core.models.gpt.gpt_layer_specs
    import megatron.core.parallel_state
    import megatron.core.process_groups_config
    import megatron.core.tensor_parallel  # noqa: F401
