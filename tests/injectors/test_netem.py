"""The netlink requests of the testbed's netem path, rendered with pyroute2's own message
objects and read back (pure: no namespace, no sch_netem needed)."""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroute2.iproute.linux import get_arguments_processor
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWQDISC
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec
from pyroute2.netlink.rtnl.tcmsg.sched_htb import get_class_parameters

from injectors.kernel_probe import NETEM_ENV, per_link_path
from injectors.netem import (
    NETEM_LIMIT_PACKETS,
    NETEM_TICK_NS,
    netem_cannot,
    netem_message,
    netem_request,
)
from injectors.peer_tc import (
    CAP_FILTER_PRIO,
    HTB_ROOT,
    NETEM_FILTER_PRIO,
    UNCAPPED_BYTES_S,
    add_netem_class,
    add_peer_class,
    change_peer_class,
    htb_burst_bytes,
    set_netem,
)
from injectors.wire import HEALTHY, WireState
from pipeline.errors import ConfigError

U32_MAX = (1 << 32) - 1


class _Recorder:
    """Stands in for an IPRoute: records what the netem path asks of it."""

    def __init__(self) -> None:
        self.tc_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.sent: list[Any] = []

    def get_qdiscs(self, index: int) -> list[Any]:
        return []

    def tc(self, *args: Any, **kwargs: Any) -> None:
        self.tc_calls.append((args, kwargs))

    def nlm_request_batch(self, msgs: list[Any]) -> None:
        self.sent.extend(msgs)


def _wire_bytes(msg: Any) -> Any:
    """`msg` encoded as the kernel gets it and decoded again (pyroute2's parser)."""
    msg.encode()
    back = tcmsg(msg.data)
    back.decode()
    return back


def _options(state: WireState) -> Any:
    return _wire_bytes(netem_message(7, 0x2010000, 0x10201, state)).get_attr("TCA_OPTIONS")


def test_the_tick_is_the_kernel_s() -> None:
    """netem's latency unit here is 64 ns (what /proc/net/psched says pyroute2 should use)."""
    assert tick_in_usec * NETEM_TICK_NS == pytest.approx(1000.0)


def test_a_delay_goes_out_in_ticks() -> None:
    options = _options(WireState(delay_ms=20.0))
    assert options["delay"] * NETEM_TICK_NS == 20_000_000  # ns
    assert options["jitter"] == 0 and options["loss"] == 0
    assert options["limit"] == NETEM_LIMIT_PACKETS
    assert options.get_attr("TCA_NETEM_RATE")["rate"] == 0  # sent, to clear an old one


def test_jitter_goes_out_in_ticks_around_the_delay() -> None:
    options = _options(WireState(delay_ms=10.0, jitter_ms=2.5))
    assert options["delay"] * NETEM_TICK_NS == 10_000_000
    assert options["jitter"] == 2_500_000 // NETEM_TICK_NS  # 39062.5 ticks: pyroute2 truncates


def test_loss_goes_out_as_netem_s_32_bit_fraction() -> None:
    assert _options(WireState(loss_pct=12.5))["loss"] == U32_MAX // 8
    assert _options(WireState(loss_pct=1.0))["loss"] == U32_MAX // 100
    assert _options(WireState(loss_pct=100.0))["loss"] == U32_MAX


def test_a_cap_goes_out_as_netem_s_byte_rate() -> None:
    rate = _options(WireState(delay_ms=5.0, rate_bit_s=40e6)).get_attr("TCA_NETEM_RATE")
    assert rate["rate"] == 5_000_000  # bytes/s
    assert (rate["packet_overhead"], rate["cell_size"], rate["cell_overhead"]) == (0, 0, 0)
    assert _options(WireState(rate_bit_s=1.0)).get_attr("TCA_NETEM_RATE")["rate"] == 1


def test_down_loses_everything_and_nothing_else_matters() -> None:
    for state in (WireState(down=True), WireState(down=True, delay_ms=5.0, stall_ms=100.0)):
        options = _options(state)
        assert options["loss"] == U32_MAX
        assert options["delay"] == 0 and options["jitter"] == 0


def test_healthy_is_a_netem_that_does_nothing() -> None:
    options = _options(HEALTHY)
    assert (options["delay"], options["jitter"], options["loss"]) == (0, 0, 0)
    assert (options["gap"], options["duplicate"]) == (0, 0)
    assert options.get_attr("TCA_NETEM_RATE")["rate"] == 0
    assert options.get_attr("TCA_NETEM_CORR") is None  # no correlation, no reordering
    assert options.get_attr("TCA_NETEM_REORDER") is None


def test_the_largest_expressible_values_fit_netem_s_fields() -> None:
    options = _options(WireState(delay_ms=274_877.906, jitter_ms=2147.483, rate_bit_s=U32_MAX * 8))
    assert options["delay"] <= U32_MAX and options["jitter"] * NETEM_TICK_NS < 1 << 31
    assert options.get_attr("TCA_NETEM_RATE")["rate"] == U32_MAX
    assert netem_cannot(WireState(delay_ms=274_877.907)) is not None
    assert netem_cannot(WireState(jitter_ms=2147.484)) is not None
    assert netem_cannot(WireState(rate_bit_s=U32_MAX * 8 + 8)) is not None


@given(
    st.floats(0, 200_000),
    st.floats(0, 2000),
    st.floats(0, 100),
    st.one_of(st.none(), st.floats(8, 34e9)),
)
def test_every_expressible_state_goes_out_to_the_microsecond(
    delay_ms: float, jitter_ms: float, loss_pct: float, rate_bit_s: float | None
) -> None:
    state = WireState(delay_ms, jitter_ms, rate_bit_s=rate_bit_s, loss_pct=loss_pct)
    assert netem_cannot(state) is None
    options = _options(state)
    assert abs(options["delay"] * NETEM_TICK_NS - delay_ms * 1e6) <= 500 + NETEM_TICK_NS
    assert abs(options["jitter"] * NETEM_TICK_NS - jitter_ms * 1e6) <= 500 + NETEM_TICK_NS
    assert abs(options["loss"] - loss_pct / 100 * U32_MAX) <= 1
    sent_rate = options.get_attr("TCA_NETEM_RATE")["rate"]
    assert sent_rate == (0 if rate_bit_s is None else max(1, round(rate_bit_s / 8)))


def test_the_message_is_what_pyroute2_s_tc_renders_less_its_broken_rate() -> None:
    """Without a rate, pyroute2's tc("replace", "netem", ...) renders the same message (with
    one, 0.9.7 also puts the rate at the top, as a TCA_RATE it cannot encode: why the testbed
    sends its own)."""
    state = WireState(delay_ms=3.0, jitter_ms=1.0, loss_pct=2.0)
    request = {k: v for k, v in netem_request(state).items() if k != "rate"}
    processed = get_arguments_processor(
        "tc",
        "replace",
        {"kind": "netem", "index": 7, "handle": 0x2010000, "parent": 0x10201} | request,
    )
    ours = _wire_bytes(netem_message(7, 0x2010000, 0x10201, state))
    for field in ("family", "index", "handle", "parent"):
        assert ours[field] == processed.get_value(field, default=0, mode="field")
    assert ours.get_attr("TCA_KIND") == "netem"
    theirs = dict(processed["options"])
    for key in ("delay", "jitter", "loss", "limit", "gap", "duplicate"):
        assert ours.get_attr("TCA_OPTIONS")[key] == int(theirs[key]), key


def test_set_netem_sends_one_replace_of_the_destination_s_leaf() -> None:
    ipr = _Recorder()
    set_netem(ipr, 7, 3, WireState(delay_ms=20.0, rate_bit_s=8e6))
    (msg,) = ipr.sent
    assert msg["header"]["type"] == RTM_NEWQDISC
    assert msg["header"]["flags"] == NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    back = _wire_bytes(msg)
    assert (back["index"], back["handle"], back["parent"]) == (7, 0x2030000, 0x10203)
    assert back.get_attr("TCA_OPTIONS")["delay"] * NETEM_TICK_NS == 20_000_000
    assert back.get_attr("TCA_OPTIONS").get_attr("TCA_NETEM_RATE")["rate"] == 1_000_000
    assert ipr.tc_calls == []


def test_a_netem_class_is_uncapped_and_its_filter_comes_before_a_cap_s() -> None:
    ipr = _Recorder()
    add_netem_class(ipr, 7, 3, "10.1.0.4", mtu_bytes=9000)
    (root, _), (klass, class_kw), (flt, filter_kw) = ipr.tc_calls
    assert root == ("add", "htb", 7, HTB_ROOT)
    assert klass == ("add-class", "htb", 7, 0x10203)
    assert class_kw["rate"] == class_kw["ceil"] == UNCAPPED_BYTES_S
    assert class_kw["burst"] == class_kw["cburst"] == UNCAPPED_BYTES_S // 10_000 + 1  # 0.1 ms
    assert flt == ("add-filter", "u32", 7)
    assert filter_kw["target"] == 0x10203 and filter_kw["keys"] == ["0x0a010004/0xffffffff+16"]
    assert filter_kw["prio"] == NETEM_FILTER_PRIO < CAP_FILTER_PRIO


@pytest.mark.parametrize(
    ("rate_bytes_s", "burst_bytes"),
    [
        (625_000_000, 62_500),  # 5 Gbit/s: 0.1 ms of it (pyroute2's default: 1,600 bytes)
        (12_500_000, 9_000),  # 100 Mbit/s: one 9,000-byte frame, more than 0.1 ms of it
        (62, 3_720),  # 0.0005 Mbit/s: 60 s of it (a frame: 145 s, past 32 bits of ticks)
        (1, 60),
    ],
)
def test_an_htb_class_s_burst_is_a_tenth_of_a_millisecond_of_it_and_a_frame_at_least(
    rate_bytes_s: int, burst_bytes: int
) -> None:
    assert htb_burst_bytes(rate_bytes_s, 9000) == burst_bytes
    ipr = _Recorder()
    add_peer_class(ipr, 7, 0x10011, rate_bytes_s, "10.1.0.2", CAP_FILTER_PRIO, mtu_bytes=9000)
    change_peer_class(ipr, 7, 0x10011, rate_bytes_s, mtu_bytes=9000)
    (_, (added, add_kw), _, (changed, change_kw)) = ipr.tc_calls
    assert (added[0], changed[0]) == ("add-class", "change-class")
    for kw in (add_kw, change_kw):
        assert (kw["burst"], kw["cburst"], kw["mtu"]) == (burst_bytes, burst_bytes, 9000)
        (_, parms), *_ = get_class_parameters(kw)["attrs"]  # pyroute2's message, as sent
        assert parms["buffer"] == parms["cbuffer"] < 1 << 32  # ticks


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (WireState(normal_ms=(50.0, 10.0), redraw_every_ms=(100.0, 200.0)), "redrawn"),
        (WireState(stall_ms=300.0), "stall"),
        (WireState(delay_ms=300_000.0), "32 bits of ticks"),
        (WireState(jitter_ms=3000.0), "the kernel clips netem's"),
        (WireState(delay_ms=float("inf")), "32 bits of ticks"),
        (WireState(rate_bit_s=40e9), "byte rate is 32 bits"),
    ],
)
def test_what_netem_cannot_express_is_refused_with_the_reason(state: WireState, why: str) -> None:
    reason = netem_cannot(state)
    assert reason is not None and why in reason
    with pytest.raises(ConfigError, match="netem cannot express"):
        netem_request(state)


def test_the_automatic_choice_follows_the_probe_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NETEM_ENV, raising=False)
    every = {kind: (True, "attached") for kind in ("netem", "htb", "u32")}
    assert per_link_path(every).netem
    assert per_link_path(every).detail == "kernel netem"
    without = per_link_path({**every, "netem": (False, "(2, 'No such file or directory')")})
    assert not without.netem and without.detail == "userspace delay wire (no sch_netem)"
    # netem alone cannot give each peer its own: htb classes and u32 filters do.
    alone = per_link_path({"netem": (True, "attached")})
    assert not alone.netem and alone.detail == "userspace delay wire (no sch_htb, cls_u32)"
    assert not per_link_path({}).netem  # not probed (no root): the wire
    monkeypatch.setenv(NETEM_ENV, "0")
    forced = per_link_path(every)
    assert not forced.netem and forced.detail == "userspace delay wire (ADAPTRA_BENCH_NETEM=0)"


def test_a_testbed_told_to_take_the_wire_never_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    import injectors.testbed

    def no_probe(*_: object) -> None:
        raise AssertionError("probed")

    monkeypatch.setattr(injectors.testbed, "kernel_features", no_probe)
    monkeypatch.setattr(injectors.testbed, "per_link_path", no_probe)
    assert not injectors.testbed.Testbed(2, netem=False).uses_netem
