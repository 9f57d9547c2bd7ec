"""The process-group backend and devices each worker takes (the choice, not a fake CUDA): gloo
for every topology, NCCL's point-to-point not being what the runtime's messages need."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from pipeline.runtime.devices import WHY_NOT_NCCL, RankDevices, choose_devices, describe_pool
from pipeline.runtime.torchrun import host_placement


def test_no_gpu_is_gloo_on_the_cpu() -> None:
    assert choose_devices(3, 4, 0) == RankDevices("gloo", "cpu", "cpu")
    assert not choose_devices(3, 4, 0).host_copies


def test_a_gpu_each_is_still_gloo_through_host_copies() -> None:
    """NCCL was chosen here: it ignores the tags the runtime's pre-posted receives rely on
    (two neighbours deadlock at their first message) and refuses the host tensors of the
    delegates' port exchange. The pool's line says so."""
    chosen = [choose_devices(r, 2, 8) for r in range(2)]
    assert chosen == [RankDevices("gloo", "cuda:0", "cpu"), RankDevices("gloo", "cuda:1", "cpu")]
    assert describe_pool(chosen) == (
        f"gloo: 2 worker(s), a GPU each, messages through host copies ({WHY_NOT_NCCL})"
    )
    assert WHY_NOT_NCCL.startswith("not NCCL: it ignores the tags")


def test_ranks_sharing_one_gpu_talk_gloo_through_host_copies() -> None:
    """S = 2 on a one-GPU machine: NCCL would refuse two ranks on cuda:0."""
    chosen = [choose_devices(r, 2, 1) for r in range(2)]
    assert chosen == [RankDevices("gloo", "cuda:0", "cpu")] * 2
    assert chosen[0].host_copies
    assert chosen[0].describe() == "gloo, compute on cuda:0, messages through host copies"
    assert describe_pool(chosen) == (
        f"gloo: 2 worker(s) share 1 GPU(s), messages through host copies ({WHY_NOT_NCCL})"
    )


@given(num_workers=st.integers(1, 64), num_gpus=st.integers(0, 16))
def test_every_pool_is_gloo_with_messages_on_the_host(num_workers: int, num_gpus: int) -> None:
    chosen = [choose_devices(r, num_workers, num_gpus) for r in range(num_workers)]
    assert {d.process_group for d in chosen} == {"gloo"}
    assert all(d.message_device == "cpu" for d in chosen)  # gloo sends host memory
    assert all(d.host_copies == (num_gpus > 0) for d in chosen)
    used = {d.compute_device for d in chosen}
    assert used == (
        {"cpu"} if num_gpus == 0 else {f"cuda:{i}" for i in range(min(num_gpus, num_workers))}
    )


def test_describes_a_pool_in_one_line() -> None:
    assert (
        describe_pool([choose_devices(r, 4, 0) for r in range(4)]) == "gloo: 4 worker(s) on the CPU"
    )
    assert describe_pool([]) == ""  # (pools on GPUs: the tests above)


@pytest.mark.parametrize(
    ("rank", "num_workers", "num_gpus"), [(2, 2, 0), (-1, 2, 0), (0, 0, 0), (0, 1, -1)]
)
def test_an_impossible_placement_is_refused(rank: int, num_workers: int, num_gpus: int) -> None:
    with pytest.raises(ConfigError, match="is not a placement"):
        choose_devices(rank, num_workers, num_gpus)


def test_a_job_over_several_hosts_chooses_per_host() -> None:
    """torchrun over two hosts of 4 GPUs, 2 workers each: rank 3 is its host's second worker
    and computes on its host's second GPU (by its global rank it would take cuda:3)."""
    environ = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert host_placement(environ) == (1, 2)
    assert choose_devices(*host_placement(environ), 4) == RankDevices("gloo", "cuda:1", "cpu")


def test_only_a_backend_that_computes_on_a_gpu_takes_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host with GPUs the emulated backend's workers (which sleep) stay off them: each
    made a CUDA context there all the same (memory and start-up for nothing, a refusal on an
    exclusive-process GPU), and its pool's line said it computed on the GPU. The megatron
    backend's take one."""
    from pipeline.runtime import worker
    from pipeline.runtime.compute import EmulatedCompute
    from pipeline.runtime.megatron import MegatronCompute

    monkeypatch.setattr(worker, "num_visible_gpus", lambda: 1)
    emulated = [worker.worker_devices(EmulatedCompute(), r, 2) for r in range(2)]
    assert emulated == [RankDevices("gloo", "cpu", "cpu")] * 2
    assert describe_pool(emulated) == "gloo: 2 worker(s) on the CPU"
    megatron = worker.worker_devices(MegatronCompute("tiny"), 1, 2)
    assert megatron == RankDevices("gloo", "cuda:0", "cpu")
