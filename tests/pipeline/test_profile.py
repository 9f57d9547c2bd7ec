import dataclasses
import json
import math
from pathlib import Path

import pytest

from baselines import zb_h2
from pipeline.errors import ConfigError
from pipeline.profile import Profile
from pipeline.simulator import CommMode, simulate
from pipeline.topology import Link

BASE = {"stages": 4, "microbatches": 12, "t_f": 10, "t_b": 10, "t_w": 10}


def test_scalars_expand_and_no_delays_are_zero() -> None:
    assert Profile.from_dict(BASE).delay_ms == (0.0, 0.0, 0.0)
    profile = Profile.from_dict({**BASE, "delay_ms": [20, 0, 0]})
    assert profile.t_f_ms == (10.0,) * 4
    assert profile.delay_ms == (20.0, 0.0, 0.0)
    assert profile.mem_limit is None
    assert profile.transfer_ms(0) == 20.0
    assert profile.copy_ms() == 0.0


def test_transfer_adds_latency_and_serialisation() -> None:
    profile = Profile.from_dict(
        {
            **BASE,
            "delay_ms": [5, 0, 0],
            "message_bytes": 1_000_000,
            "link_latency_ms": 0.5,
            "link_bandwidth_gbps": 8,
            "copy_gbps": 16,
        }
    )
    # 1 MB at 8 Gbit/s is 1 ms on the wire; at 16 Gbit/s 0.5 ms per copy.
    assert profile.transfer_ms(0) == pytest.approx(6.5)
    assert profile.transfer_ms(1) == pytest.approx(1.5)
    assert profile.copy_ms() == pytest.approx(0.5)


def test_dict_round_trip() -> None:
    profile = Profile.from_dict({**BASE, "t_b": [1, 2, 3, 4], "mem_limit": 7, "num_delegates": 2})
    assert Profile.from_dict(profile.to_dict()) == profile
    assert Profile.from_dict({**BASE, "num_delegates": 12}).delegate_count() == 12  # the most
    dp = Profile.from_dict(
        {
            **BASE,
            "dp": 3,
            "allreduce_bytes": [4, 3, 2, 1],
            "dp_bucket_bytes": 2,
            "dp_bandwidth_gbps": 100,
            "dp_delay_ms": {"dp1:0-1": 30, "dp2:0-2": 5, "dp3:1-2": 0},
            "optimizer_ms": 2,
            "state_bytes": [40, 30, 20, 10],
        }
    )
    assert Profile.from_dict(dp.to_dict()) == dp
    assert [dp.state_bytes(s) for s in range(4)] == [40, 30, 20, 10]  # what a swap moves
    assert dp.to_dict()["dp_delay_ms"] == {"dp1:0-1": 30.0, "dp2:0-2": 5.0}
    assert hash(dp) == hash(Profile.from_dict(dp.to_dict()))  # a planner's cache key


def test_the_dp_step_s_keys_and_their_defaults() -> None:
    plain = Profile.from_dict(BASE)
    assert (plain.num_replicas, plain.allreduce_bytes, plain.optimizer_ms) == (
        1,
        (0,) * 4,
        (0.0,) * 4,
    )
    assert plain.dp_bucket_bytes == 80_000_000 and not plain.has_dp_step
    assert plain.stage_state_bytes == () and plain.to_dict()["state_bytes"] is None
    dp = Profile.from_dict(
        {**BASE, "dp": 2, "allreduce_bytes": 10**9, "dp_delay_ms": {"dp1:0-1": 30}}
    )
    assert dp.allreduce_bytes == (10**9,) * 4 and dp.has_dp_step
    assert dp.state_bytes(2) == 8 * 10**9  # no state_bytes: mixed-precision Adam's 8 x
    assert dp.dp_delay_for(Link.dp(1, 0)) == 30.0 and dp.dp_delay_for(Link.dp(0, 0)) == 0.0
    # DP messages use the PP links' latency and bandwidth unless dp_bandwidth_gbps is given.
    wired = Profile.from_dict({**BASE, "link_latency_ms": 0.5, "link_bandwidth_gbps": 8})
    assert wired.dp_wire_ms(1_000_000) == pytest.approx(1.5)
    faster = Profile.from_dict({**BASE, "link_bandwidth_gbps": 8, "dp_bandwidth_gbps": 16})
    assert faster.dp_wire_ms(1_000_000) == pytest.approx(0.5)
    assert dp.with_delays([5]).dp_delay_ms == dp.dp_delay_ms  # PP delays only
    assert dp.with_delays([], {}).dp_delay_ms == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": 1}, "unknown profile key"),
        # keys that are no names (YAML's `1:`, `null:`) were a TypeError from sorting them
        ({1: 2, "x": 3}, r"unknown profile key\(s\) 1, x; valid keys: stages, microbatches, "),
        ({None: 1}, r"unknown profile key\(s\) None; valid keys: "),
        ({"t_f": None}, "missing required key"),
        ({"microbatches": 3}, "must be >= stages"),
        ({"stages": 0}, r"stages must be in 1\.\.512, got 0"),
        ({"stages": 10**6}, r"stages must be in 1\.\.512"),
        ({"microbatches": 10**9}, r"microbatches must be in 1\.\.4096"),
        ({"stages": 2.5}, "stages must be an integer"),
        ({"stages": True}, "stages must be an integer"),
        ({"t_f": [1, 2, 3]}, "t_f has 3 entries"),
        ({"t_b": -1}, r"t_b must be finite and in 0..3600000 ms"),
        ({"t_w": math.inf}, "t_w must be finite"),
        ({"t_w": math.nan}, "t_w must be finite"),
        ({"t_f": 1e300}, r"t_f must be finite and in 0\.\.3600000 ms, got 1e\+300"),
        ({"delay_ms": [1]}, "delay_ms has 1 entry; 4 stages have 3 links, one delay each"),
        ({"t_f": "10"}, "t_f must be a number"),
        ({"delay_ms": [1, 2, 3, 4]}, "delay_ms has 4 entries"),
        ({"delay_ms": [1, -2]}, r"delay_ms\[1\] must be finite and in 0..3600000 ms"),
        ({"delay_ms": 5}, "delay_ms must be a list"),
        ({"mem_limit": 0}, "mem_limit must be finite and > 0"),
        ({"mem_limit": 0.5}, r"mem_limit 0\.5 admits no schedule: .* must be >= 1$"),
        ({"num_delegates": 0}, "num_delegates must be >= 1"),
        # one per microbatch at most (10**9 were a MemoryError in the simulator)
        (
            {"num_delegates": 13},
            r"num_delegates \(13\) must be at most microbatches \(12\): a PP link direction "
            "carries one message per microbatch an iteration",
        ),
        ({"num_delegates": 10**9}, r"num_delegates \(1000000000\) must be at most microbatches"),
        ({"link_bandwidth_gbps": -1}, "link_bandwidth_gbps must be finite and > 0"),
        ({"message_bytes": -5}, r"message_bytes must be in 0\.\.1099511627776, got -5"),
        # rates at least 1 Mbit/s and bytes at most 1 TiB: 1e24 bytes at 1e-300 Gbit/s was an
        # internal OverflowError, 65536 bytes at 1e-305 Gbit/s an iteration of 300 digits
        ({"message_bytes": 10**24}, r"message_bytes must be in 0\.\.1099511627776"),
        ({"link_bandwidth_gbps": 1e-305}, r"link_bandwidth_gbps must be >= 0\.001 Gbit/s"),
        ({"copy_gbps": 1e-300}, r"copy_gbps must be >= 0\.001 Gbit/s"),
        ({"delegate_gbps": 0.0009}, r"delegate_gbps must be >= 0\.001 Gbit/s"),
        ({"dp_bandwidth_gbps": 1e-300}, r"dp_bandwidth_gbps must be >= 0\.001 Gbit/s"),
        ({"allreduce_bytes": 2**40 + 1}, r"allreduce_bytes must be in 0\.\.1099511627776"),
        ({"dp_bucket_bytes": 10**24}, r"dp_bucket_bytes must be in 1\.\.1099511627776"),
        ({"state_bytes": 10**24}, r"state_bytes must be in 0\.\.1099511627776"),
        # and a message's time at its rate at most an hour (1 GB at 1 Mbit/s: 8e6 ms)
        (
            {"message_bytes": 10**9, "link_bandwidth_gbps": 0.001},
            r"message_bytes at link_bandwidth_gbps takes 8e\+06 ms a message: more than 3600000",
        ),
        (
            {"message_bytes": 10**9, "delegate_gbps": 0.001},
            "message_bytes at delegate_gbps takes 8e",
        ),
        ({"message_bytes": 10**9, "copy_gbps": 0.001}, r"message_bytes at copy_gbps \(a copy\)"),
        (
            {
                "dp": 2,
                "allreduce_bytes": 10**9,
                "dp_bucket_bytes": 10**9,
                "dp_bandwidth_gbps": 0.001,
            },
            "a DP ring chunk at dp_bandwidth_gbps takes 4e",
        ),
        ({"dp": 0}, r"dp must be in 1\.\.1024"),
        # counted before anything lists the buckets (2**40 of them were a MemoryError)
        (
            {"dp": 2, "allreduce_bytes": 2**40, "dp_bucket_bytes": 1},
            r"the DP all-reduce is 17,592,186,044,416 messages an iteration \(4 stages' rings "
            r"of 2 replicas, 1-byte buckets\): more than the simulator times \(4,000,000\); "
            r"give fewer replicas or larger buckets \(dp_bucket_bytes\)$",
        ),
        ({"allreduce_bytes": [1, 2]}, "allreduce_bytes has 2 entries"),
        ({"allreduce_bytes": -1}, "allreduce_bytes must be in 0"),
        ({"allreduce_bytes": 1.5}, "allreduce_bytes must be an integer"),
        ({"dp_bucket_bytes": 0}, "dp_bucket_bytes must be in 1"),
        ({"optimizer_ms": [1]}, "optimizer_ms has 1 entries"),
        # a list given is no absent key (both were read as all 0)
        ({"allreduce_bytes": []}, r"allreduce_bytes has 0 entries, expected one per stage \(4\)"),
        ({"optimizer_ms": []}, r"optimizer_ms has 0 entries, expected one per stage \(4\)"),
        ({"state_bytes": [1]}, "state_bytes has 1 entries"),
        ({"state_bytes": -1}, "state_bytes must be in 0"),
        ({"dp_delay_ms": {"dp1:0-1": 5}}, "link dp1:0-1 does not exist with 4 stages and 1"),
        ({"dp": 2, "dp_delay_ms": {"0-1": 5}}, "0-1 is a PP link"),
        ({"dp": 2, "dp_delay_ms": {"dp4:0-1": 5}}, "link dp4:0-1 does not exist"),
        ({"dp": 2, "dp_delay_ms": {"dp1:0-1": -5}}, r"dp_delay_ms\[dp1:0-1\] must be finite"),
        ({"dp": 2, "dp_delay_ms": [5]}, "dp_delay_ms must map DP links to delays"),
        # one link spelled twice (the last one's delay won), zeros too (they are left out)
        (
            {"dp": 2, "dp_delay_ms": {"dp0:0-1": 5, "dp0:0-01": 40}},
            r"^dp_delay_ms: link dp0:0-1 given twice, as 'dp0:0-1' and 'dp0:0-01'$",
        ),
        (
            {"dp": 2, "dp_delay_ms": {"dp0:0-1": 0, " dp0:0-1 ": 0}},
            "dp_delay_ms: link dp0:0-1 given twice, as 'dp0:0-1' and ' dp0:0-1 '",
        ),
    ],
)
def test_bad_profiles_are_clear_errors(change: dict, message: str) -> None:
    data = {**BASE, **change}
    data = {k: v for k, v in data.items() if not (k == "t_f" and v is None)}
    with pytest.raises(ConfigError, match=message):
        Profile.from_dict(data)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read profile"):
        Profile.from_file(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json is not valid JSON"):
        Profile.from_file(broken)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**BASE, "microbatches": 2}))
    with pytest.raises(ConfigError, match=r"bad.json: microbatches \(2\) must be >= stages"):
        Profile.from_file(bad)


def test_the_delegate_count_rule_keeps_sending_up_with_production() -> None:
    """docs/paper.md: the artifact used D = 3 at 30 ms and D = 6 at 60 ms (ops of ~10 ms)."""
    base = Profile.uniform(4, 12, 10, 10, 10)
    assert [base.with_delays([d, 0, 0]).delegates_needed() for d in (0, 10, 30, 60)] == [1, 1, 3, 6]
    assert base.with_delays([30, 0, 0]).delegates_needed(extra_delay_ms=30) == 6
    assert base.with_delays([0, 0, 500]).delegates_needed() == 12  # one per microbatch at most
    slow_b = Profile.from_dict(
        {"stages": 3, "microbatches": 6, "t_f": 10, "t_b": [20, 20, 5], "t_w": 10,
         "delay_ms": [0, 20]}
    )  # fmt: skip
    assert slow_b.delegates_needed() == 4  # stage 2 makes a gradient every 5 ms
    # an op of 5e-324 ms made the ratio inf: an internal OverflowError; one per microbatch
    tiny = Profile.from_dict({**slow_b.to_dict(), "t_b": [20, 20, 5e-324]})
    assert tiny.delegates_needed() == 6
    # a stage whose op takes 0 ms, on a link whose message holds its delegate no time: one
    # delegate keeps up (the rule asked for one per microbatch)
    free = Profile.from_dict({**slow_b.to_dict(), "t_f": [0, 10, 10], "delay_ms": [0, 0]})
    assert free.delegates_needed() == 1
    assert base.with_delays([60, 0, 0]).delegate_count() == 6
    assert dataclasses.replace(base, num_delegates=2).with_delays([60, 0, 0]).delegate_count() == 2


def test_the_delegate_count_rule_takes_a_delegates_own_rate() -> None:
    """100 MB messages, 10 ms ops: the link's wire takes 0.8 ms (1000 Gbit/s), a delegate's
    20 ms (its own 40 Gbit/s), so each delegate sends one message per 20 ms and two keep up
    with a message per 10 ms: with them every message is there 20 ms after it was sent; with
    one (the link's wire time alone would give) they queue, the 7th 80 ms after."""
    profile = Profile.uniform(
        4, 12, 10, 10, 10, message_bytes=100_000_000, link_bandwidth_gbps=1000.0,
        delegate_gbps=40.0,
    )  # fmt: skip
    assert (profile.wire_ms(), profile.delegated_wire_ms()) == pytest.approx((0.8, 20.0))
    assert profile.delegates_needed() == 2
    assert profile.with_delays([30, 0, 0]).delegates_needed() == 5  # (30 + 20) / 10
    in_flight_ms = {
        num_delegates: {
            round(m.arrival_ms - m.send_start_ms, 6)
            for m in simulate(zb_h2(delegated), delegated, CommMode.DELEGATED).messages
        }
        for num_delegates in (1, profile.delegate_count())
        for delegated in [dataclasses.replace(profile, num_delegates=num_delegates)]
    }
    assert in_flight_ms == {1: {20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0}, 2: {20.0}}
