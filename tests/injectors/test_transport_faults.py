"""Transport-level faults, measured in a real emulated run (gloo, real processes)."""

import statistics

import pytest

from baselines import zb_h2
from injectors.transport_faults import LinkFault, TransportFaultHook
from pipeline.errors import ConfigError
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerLinkFailure, WorkerPool


def test_jitter_is_seeded_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("injectors.transport_faults.time.sleep", slept.append)
    hook = TransportFaultHook.on_links({"0-1": LinkFault(delay_ms=10, jitter_ms=4)}, seed=7)
    for m in range(50):
        hook("0-1", "forward", 0, "F", m, 0)
    again: list[float] = []
    monkeypatch.setattr("injectors.transport_faults.time.sleep", again.append)
    other = TransportFaultHook.on_links({"0-1": LinkFault(delay_ms=10, jitter_ms=4)}, seed=7)
    for m in range(50):
        other("0-1", "forward", 0, "F", m, 0)
    assert slept == again
    assert all(0.006 <= s <= 0.014 for s in slept) and len(set(slept)) > 40
    hook("1-2", "forward", 0, "F", 0, 0)  # no fault on that link: no sleep
    assert len(slept) == 50


def test_stall_and_bandwidth(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("injectors.transport_faults.time.sleep", slept.append)
    hook = TransportFaultHook({("0-1", "backward"): LinkFault(stall_ms=50, bandwidth_mbps=100)})
    hook("0-1", "backward", 3, "B", 0, 125_000)  # 1 Mbit at 100 Mbit/s = 10 ms, + the stall
    hook("0-1", "backward", 3, "B", 1, 125_000)
    hook("0-1", "forward", 3, "F", 1, 125_000)  # other direction: untouched
    assert slept == pytest.approx([0.060, 0.010])


def test_bad_fault_values() -> None:
    with pytest.raises(ConfigError, match="delay_ms must be finite and >= 0"):
        LinkFault(delay_ms=-1)
    with pytest.raises(ConfigError, match="bandwidth_mbps must be > 0"):
        LinkFault(bandwidth_mbps=0)


@pytest.mark.multiprocess
def test_faults_act_on_real_sends() -> None:
    profile = Profile.uniform(3, 6, 5, 5, 5, message_bytes=125_000)
    schedule = zb_h2(profile)
    delay = TransportFaultHook.on_links({"0-1": LinkFault(delay_ms=20)})
    capped = TransportFaultHook.on_links({"1-2": LinkFault(bandwidth_mbps=50)})
    failed = TransportFaultHook.on_links({"1-2": LinkFault(failed=True)})
    with WorkerPool(3, timeout_s=20) as pool:
        pool.run_iteration(IterationConfig(0, schedule, profile))  # warm-up
        timeline = pool.run_iteration(IterationConfig(1, schedule, profile, fault_hook=delay))
        slow = [m.send_end_ms - m.send_start_ms for m in timeline.messages if m.link == "0-1"]
        fast = [m.send_end_ms - m.send_start_ms for m in timeline.messages if m.link == "1-2"]
        # The delay is a floor (load only adds); the other link's sends stay well under it.
        assert min(slow) >= 20.0 and statistics.median(fast) < 10.0
        timeline = pool.run_iteration(IterationConfig(2, schedule, profile, fault_hook=capped))
        # 1 Mbit at 50 Mbit/s: 20 ms per message on 1-2 only.
        capped_sends = [
            m.send_end_ms - m.send_start_ms for m in timeline.messages if m.link == "1-2"
        ]
        assert min(capped_sends) >= 20.0 and statistics.median(capped_sends) < 40.0
        with pytest.raises(WorkerLinkFailure, match=r"link 1-2 \(.*\) has failed"):
            pool.run_iteration(IterationConfig(3, schedule, profile, fault_hook=failed))
