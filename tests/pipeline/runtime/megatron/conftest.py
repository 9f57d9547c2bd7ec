import pytest
import torch

pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> None:
    """The numerics contract holds with one intra-op thread everywhere (workers set it too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
