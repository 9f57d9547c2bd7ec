"""The transport's gloo failures, over stand-ins for gloo's calls (no processes): each names the
send or the wait, keeps its kind (TimeoutError, ConnectionError) and chains gloo's error."""

import datetime as dt

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from pipeline.runtime import transport as transport_module
from pipeline.runtime.remote_error import (
    RemoteError,
    WorkerCrash,
    WorkerTimeout,
    worker_error,
)
from pipeline.runtime.transport import (
    ACTIVATION,
    GRADIENT,
    DelegateOffer,
    DirectTransport,
    Message,
    StateOffer,
)

RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:39"
TIMED_OUT = "[../gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting 2000ms for send"
PAIR_CLOSED = "Application timeout caused pair closure"


class _Hook:
    """A fault hook that records its calls and injects nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def __call__(self, *args: object) -> float:
        self.calls.append(args)
        return 0.0


def _failing_send(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    def isend(tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        raise RuntimeError(text)

    monkeypatch.setattr(transport_module.dist, "isend", isend)


@pytest.mark.parametrize(
    ("text", "kind"),
    [(RESET, ConnectionError), (TIMED_OUT, TimeoutError), (PAIR_CLOSED, TimeoutError)],
)
def test_a_failed_send_names_the_message_its_peer_and_link(
    monkeypatch: pytest.MonkeyPatch, text: str, kind: type[Exception]
) -> None:
    _failing_send(monkeypatch, text)
    hook = _Hook()
    transport = DirectTransport(hook, 30.0)
    payload = torch.zeros(8)
    with pytest.raises(kind) as info:
        transport.send(2, "1-2", Message(4, ACTIVATION, 3, 1), payload)
    assert type(info.value) is kind
    assert str(info.value) == (
        f"sending the activation of microbatch 3 to rank 2 on link 1-2 failed: {text}"
    )
    assert isinstance(info.value.__cause__, RuntimeError)  # gloo's, kept
    assert str(info.value.__cause__) == text
    assert len(hook.calls) == 1  # the fault hook ran first
    assert transport.bytes_sent == 0  # nothing went


def test_a_failed_gradient_and_all_reduce_send_are_named_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _failing_send(monkeypatch, RESET)
    transport = DirectTransport(_Hook(), 30.0)
    with pytest.raises(ConnectionError, match=r"^sending the gradient of microbatch 0 to rank 1 "):
        transport.send(1, "1-2", Message(0, GRADIENT, 0, 0), torch.zeros(1))
    with pytest.raises(
        ConnectionError,
        match=r"^sending all-reduce chunk 4 to rank 5 on link dp1:0-1 failed: \[\.\./third",
    ):
        transport.send_dp(5, "dp1:0-1", "forward", 0, 4, torch.zeros(1))


class _FailingWork:
    def __init__(self, text: str) -> None:
        self.text = text

    def wait(self, timeout: dt.timedelta) -> None:
        raise RuntimeError(self.text)


@pytest.mark.parametrize(("text", "kind"), [(RESET, ConnectionError), (TIMED_OUT, TimeoutError)])
def test_a_failed_wait_names_what_it_waited_for(
    monkeypatch: pytest.MonkeyPatch, text: str, kind: type[Exception]
) -> None:
    def irecv(tensor: torch.Tensor, src: int, tag: int = 0) -> dist.Work:
        return _FailingWork(text)  # type: ignore[return-value]

    monkeypatch.setattr(transport_module.dist, "irecv", irecv)
    transport = DirectTransport(_Hook(), 30.0)
    pending = transport.post_receive(3, Message(0, GRADIENT, 2, 0), torch.zeros(1))
    with pytest.raises(kind, match=r"^waiting for the gradient of microbatch 2 from rank 3 failed"):
        pending.wait(2.0)
    chunk = transport.post_dp_receive(5, 7, torch.zeros(1))
    with pytest.raises(kind, match=r"^waiting for all-reduce chunk 7 from rank 5 failed: "):
        chunk.wait(2.0)


def test_a_send_s_failure_keeps_its_kind_across_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the worker reports (strings and ints) and what the controller raises for it."""
    for text, expected in ((RESET, WorkerCrash), (TIMED_OUT, WorkerTimeout)):
        _failing_send(monkeypatch, text)
        transport = DirectTransport(_Hook(), 30.0)
        with pytest.raises(OSError) as info:
            transport.send(2, "1-2", Message(0, ACTIVATION, 3, 0), torch.zeros(1))
        remote = RemoteError.from_exception(
            info.value, rank=1, stage=1, replica=0, iteration=0, op="F3"
        )
        assert remote.cause_type_name == "builtins.RuntimeError"
        error = worker_error(remote)
        assert type(error) is expected
        assert str(error) == (
            f"rank 1 (stage 1), iteration 0, op F3: {remote.short_type_name}: sending the "
            f"activation of microbatch 3 to rank 2 on link 1-2 failed: {text}"
        )


_PORTS = st.integers(1, 65535)
_NICS = st.lists(st.integers(0, 7), unique=True, max_size=8).map(tuple)


@given(st.lists(_PORTS, max_size=16).map(tuple), _NICS)
def test_a_delegate_offer_reads_back_as_it_was_written(
    ports: tuple[int, ...], nics_down: tuple[int, ...]
) -> None:
    """The receivers' offer, as it goes between workers (a file of the pool's folder): its
    ports and its host's NICs down, both (the NICs were once dropped on the way)."""
    offer = DelegateOffer(ports, nics_down)
    assert DelegateOffer.from_json(offer.to_json()) == offer


@given(_PORTS, _NICS)
def test_a_state_offer_reads_back_as_it_was_written(port: int, nics_down: tuple[int, ...]) -> None:
    offer = StateOffer(port, nics_down)
    assert StateOffer.from_json(offer.to_json()) == offer
