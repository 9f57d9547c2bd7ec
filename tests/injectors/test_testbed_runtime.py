"""The runtime's workers inside the testbed: network-level faults act on real gloo traffic."""

import dataclasses
import os
import statistics
import time
from pathlib import Path

import pytest

from baselines import one_f_one_b
from injectors.testbed import Testbed
from injectors.wire import WireState
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
from tests.fidelity import HANG

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI has it)"),
]

MIB = 1 << 20
_MEASURED = 5
"""Iterations measured after a warm-up: their median stands beside a busy neighbour that
delays the wire's process through one or two of them (with two measured, one such iteration
once moved a median from 180 to 428 ms beside another test's workers)."""


def _ms(schedule: Schedule, profile: Profile, mode: CommMode) -> float:
    return compute_metrics(simulate(schedule, profile, mode)).iteration_time_ms


def _assert_delayed_alike(
    by_network: list[float],
    by_hook: list[float],
    schedule: Schedule,
    delayed: Profile,
    undelayed: list[float] | None = None,
) -> None:
    """Both runs (their measured iterations) pay the delay once: load only adds time, so the
    simulator's times with the delay are floors of their medians (ideal: the network delays
    arrivals only; direct: the hook also holds the sender; without the delay both would take
    75 ms), and the fastest iteration of each (load cannot lower a minimum) is below the
    floor the delay paid twice would set. Load that lasts through all of them lifts that
    minimum: where the same run's `undelayed` iterations (if given, taken in turn with
    delayed ones) show it, by more than half the gap between paying once and twice, the
    bound is that midpoint plus what load added to their fastest (the gap's other half then
    still tells once from twice). The network run is within 10 % of the hook's on a quiet
    machine (BENCHMARKS.md); a ratio of the two, measured one after the other, is not
    bounded (a busy neighbour once moved a median 2.4x): above, each median only by a hang
    guard."""
    ideal, direct = _ms(schedule, delayed, CommMode.IDEAL), _ms(schedule, delayed, CommMode.DIRECT)
    twice = delayed.with_delays([2 * d for d in delayed.delay_ms])
    free = delayed.with_delays([0.0 for _ in delayed.delay_ms])
    loaded_ms = 0.0  # what load added to the fastest undelayed iteration (75 ms here)
    if undelayed:
        loaded_ms = max(0.0, min(undelayed) - _ms(schedule, free, CommMode.DIRECT))
    network, hook = statistics.median(by_network), statistics.median(by_hook)
    assert network >= 0.98 * ideal and hook >= 0.98 * direct, (by_network, by_hook)
    twice_ideal, twice_direct = (_ms(schedule, twice, m) for m in (CommMode.IDEAL, CommMode.DIRECT))
    network_bound = max(twice_ideal, (ideal + twice_ideal) / 2 + loaded_ms)  # 235 ms, quiet
    hook_bound = max(twice_direct, (direct + twice_direct) / 2 + loaded_ms)  # 275 ms, quiet
    assert min(by_network) < network_bound, (by_network, undelayed)
    assert min(by_hook) < hook_bound, (by_hook, undelayed)
    assert max(network, hook) < HANG * direct, (by_network, by_hook, direct)


def test_a_bandwidth_cap_slows_the_run_as_bytes_over_rate_predict() -> None:
    """1 MiB messages over a 100 Mbit/s cap on the only link: 84 ms per message."""
    profile = Profile.uniform(2, 4, 5, 5, 5, message_bytes=MIB)
    schedule = one_f_one_b(profile)
    with Testbed(2) as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        bed.cap_bandwidth(1, 0, plane=0, rate_mbit=100)
        with WorkerPool(2, launch=bed.launcher(), timeout_s=30) as pool:
            assert len(set(pool.pids)) == 2
            times = [
                compute_metrics(
                    pool.run_iteration(IterationConfig(i, schedule, profile)), i
                ).iteration_time_ms
                for i in range(1 + _MEASURED)
            ]
    capped = Profile.uniform(2, 4, 5, 5, 5, message_bytes=MIB, link_bandwidth_gbps=0.1)
    predicted = compute_metrics(simulate(schedule, capped, CommMode.DIRECT)).iteration_time_ms
    assert predicted > 400  # the cap dominates: the free-wire prediction is 75 ms
    # Load only adds time: the cap sets a floor, less the first frame of each message that
    # htb lets through at once (9,000 bytes: 0.7 ms of 84 here). bench_injectors.py. Above
    # it, the fastest iteration (load cannot lower a minimum) is near the prediction: an
    # overcount of the cap (per direction twice, or in Mbyte/s) would double it at least.
    measured = times[1:]  # after the warm-up iteration
    assert 0.95 * predicted <= statistics.median(measured), (measured, predicted)
    assert min(measured) < 1.5 * predicted, (measured, predicted)


def test_a_network_delay_slows_the_run_like_the_same_delay_in_the_fault_hook() -> None:
    """20 ms one way on the pair's plane, against a 20 ms sleep before every send on the same
    link (the paper's injection). 8 KiB messages fit TCP's initial window; 64 KiB ones also
    pay slow-start round trips after each idle gap and came out 13 % slower."""
    profile = Profile.uniform(2, 4, 5, 5, 5, message_bytes=8 << 10)
    schedule = one_f_one_b(profile)

    def measured_ms(pool: WorkerPool, *hook_profiles: Profile) -> list[list[float]]:
        """Per profile, its measured iterations' times (the profiles take turns)."""
        times: list[list[float]] = [[] for _ in hook_profiles]
        for i in range(1 + _MEASURED * len(hook_profiles)):
            k = (i - 1) % len(hook_profiles)
            config = IterationConfig(i, schedule, hook_profiles[k])
            time_ms = compute_metrics(pool.run_iteration(config), i).iteration_time_ms
            if i:  # after the warm-up iteration
                times[k].append(time_ms)
        return times

    with Testbed(2) as bed:
        with WorkerPool(2, launch=bed.launcher(), timeout_s=30) as pool:
            # the undelayed iterations, in turn with the delayed: what load adds meanwhile
            by_hook, undelayed = measured_ms(pool, profile.with_delays([20.0]), profile)
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20))
        with WorkerPool(2, launch=bed.launcher(), timeout_s=30) as pool:
            (by_network,) = measured_ms(pool, profile)
    _assert_delayed_alike(by_network, by_hook, schedule, profile.with_delays([20.0]), undelayed)


def test_a_stall_on_both_directions_holds_each_direction_s_first_message() -> None:
    """A 200 ms stall on both directions of the only link, set at an iteration boundary: the
    first message each way waits it (the simulator: 418 ms for this iteration). The stall
    once went to the first frame with data, the "receive ready" each worker sends as it
    posts its receives at the iteration's start: the backward one held the first activation
    (whose send waits for it), and the gradients crossed unstalled (200 ms in all)."""
    stall_ms = 200.0
    profile = Profile.uniform(2, 2, 2, 2, 2, message_bytes=4096)
    schedule = one_f_one_b(profile)
    with Testbed(2) as bed, WorkerPool(2, launch=bed.launcher(), timeout_s=30) as pool:
        pool.run_iteration(IterationConfig(0, schedule, profile))  # connected, warm
        stalled = WireState(stall_ms=stall_ms)
        bed.set_wire(0, 1, plane=0, forward=stalled, backward=stalled)
        timeline = pool.run_iteration(IterationConfig(1, schedule, profile))
    first = {
        m.direction: m.arrival_ms - m.wire_start_ms
        for m in timeline.messages
        if m.iteration == 1 and m.microbatch == 0
    }
    # Load only adds time: the held frame left the sender after its send started.
    assert first.keys() == {"forward", "backward"}
    assert all(held_ms >= stall_ms for held_ms in first.values()), first
    assert compute_metrics(timeline, 1).iteration_time_ms >= 2 * stall_ms


def test_a_delay_on_one_direction_holds_the_other_direction_s_first_message() -> None:
    """gloo sends a message only once its receiver's "receive ready" has crossed back (docs/
    design.md): with 60 ms on the gradients' direction only, the iteration's first
    activation, on an undelayed direction, arrives no earlier than 60 ms after stage 1
    posted its receives, which it does on the iteration's config, after the iteration
    before has ended: 60 ms after that end at least (the next iteration starts about the
    pool's round trips and start margin, some 25 ms, after it: the activation is held about
    35 ms into it, where the simulator's, and the hook's, would be there within a few). Load
    only makes the post, and so the arrival, later."""
    reverse_ms = 60.0
    profile = Profile.uniform(2, 2, 2, 2, 2, message_bytes=4096)
    schedule = one_f_one_b(profile)
    with Testbed(2) as bed, WorkerPool(2, launch=bed.launcher(), timeout_s=30) as pool:
        pool.run_iteration(IterationConfig(0, schedule, profile))  # connected, warm
        bed.set_wire(0, 1, plane=0, forward=WireState(), backward=WireState(delay_ms=reverse_ms))
        before = pool.run_iteration(IterationConfig(1, schedule, profile))  # the wire's ARP
        timeline = pool.run_iteration(IterationConfig(2, schedule, profile))
    ended_ms = before.iterations[-1].end_ms
    first = next(
        m
        for m in timeline.messages
        if m.iteration == 2 and m.direction == "forward" and m.microbatch == 0
    )
    assert first.arrival_ms - ended_ms >= reverse_ms, (ended_ms, first)


def test_run_injects_a_profile_delay_in_the_network_like_the_hook(tmp_path) -> None:
    """`run --inject network`: the profile's 20 ms on link 0-1 goes onto the testbed's wire."""
    import json
    import subprocess
    import sys

    from injectors.ownership import OwnerRecord

    shape = {"stages": 2, "microbatches": 4, "t_f": 5, "t_b": 5, "t_w": 5, "message_bytes": 8192}
    delayed, free = tmp_path / "p.json", tmp_path / "free.json"
    delayed.write_text(json.dumps({**shape, "delay_ms": [20]}))
    free.write_text(json.dumps({**shape, "delay_ms": [0]}))

    def namespaces() -> set[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return {line.split()[0] for line in listed.splitlines() if line.strip()}

    def owned_by(pid: int) -> set[str]:
        """The namespaces whose testbed's owner record names process `pid` (another test's
        testbeds, and another run's leftovers, are not this run's)."""
        return {n for r in OwnerRecord.read_all() if r.pid == pid for n in r.namespaces}

    def measured_ms(injection: str, profile: Path = delayed) -> tuple[list[float], set[str]]:
        """The run's measured iterations, and the namespaces its testbed made (seen while
        it ran); checks that they are gone, with their owner record, once it ends."""
        run = subprocess.Popen(
            [sys.executable, "-m", "harness", "run", "--backend", "emulated", "--profile",
             str(profile), "--policy", "1f1b", "--iterations", "5", "--format", "json",
             "--inject", injection],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        made: set[str] = set()
        deadline = time.monotonic() + 120
        try:
            while run.poll() is None and time.monotonic() < deadline:
                made |= owned_by(run.pid)
                time.sleep(0.05)
            # A hang bound: the run has ended, but its testbed's processes may hold its pipes
            # a moment longer on a loaded host (1 s was not enough beside 3 busy tests).
            out, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        assert run.returncode == 0, err
        assert not made & namespaces() and not owned_by(run.pid)  # the testbed is gone
        return [float(t) for t in json.loads(out)["iteration_times_ms"]], made

    (by_network, made), (by_hook, none) = measured_ms("network"), measured_ms("hook")
    # a testbed of a switch and two hosts (and maybe a probe of the kernel's netem); none
    # for the hook
    assert {"sw", "h0", "h1"} <= {n.rsplit("-", 1)[1] for n in made} and none == set(), made
    assert len(by_network) == len(by_hook) == 5
    slow = Profile.uniform(2, 4, 5, 5, 5, message_bytes=8192).with_delays([20.0])
    try:
        _assert_delayed_alike(by_network, by_hook, one_f_one_b(slow), slow)
    except AssertionError:
        # Load that lasts through a run's five iterations lifts its fastest over the bound
        # (393 ms against 235 once, beside two busy processes): delay-free runs of both
        # injections measure what load adds now, which widens it; a quiet run is not made to
        # pay for them (about 30 s).
        undelayed = measured_ms("network", free)[0] + measured_ms("hook", free)[0]
        _assert_delayed_alike(by_network, by_hook, one_f_one_b(slow), slow, undelayed)


def test_run_caps_the_network_at_a_profile_s_float_bandwidth(tmp_path) -> None:
    """`run --inject network` with `link_bandwidth_gbps: 0.25` (tc rates are ints to
    pyroute2: a float rate once crashed): 256 KiB messages take 8.4 ms on the wire."""
    import json
    import subprocess
    import sys

    profile = Profile.uniform(2, 2, 1, 1, 1, message_bytes=256 << 10, link_bandwidth_gbps=0.25)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile.to_dict()))
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--backend", "emulated", "--profile",
         str(path), "--policy", "1f1b", "--iterations", "2", "--format", "json",
         "--inject", "network"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    times = json.loads(out.stdout)["iteration_times_ms"]
    predicted = compute_metrics(simulate(one_f_one_b(profile), profile, CommMode.DIRECT))
    free_wire = dataclasses.replace(profile, link_bandwidth_gbps=None)
    free = compute_metrics(simulate(one_f_one_b(profile), free_wire, CommMode.DIRECT))
    assert predicted.iteration_time_ms > 3 * free.iteration_time_ms  # the cap dominates
    # htb lets the first 9,000-byte frame of each burst through at once (0.29 ms of a
    # message's 8.4 ms): a little under the prediction, never far.
    assert all(t >= 0.90 * predicted.iteration_time_ms for t in times), times
