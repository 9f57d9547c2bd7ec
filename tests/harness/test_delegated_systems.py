"""Adaptra's systems in real runs over the delegate transport (the CLI, and in-process)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from harness.policies import system_controller
from harness.runner import run_configuration
from pipeline.link_terms import NO_LINK_TERMS
from pipeline.profile import Profile
from tests.fidelity import check_fidelity
from tests.harness.test_cli import cli

pytestmark = pytest.mark.multiprocess


def _run(*args: str) -> dict:
    out = cli("run", *args, "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_megatron_through_the_delegates_trains_exactly_as_direct(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 4, "microbatches": 8, "t_f": 1, "t_b": 1,
                                   "t_w": 1, "num_delegates": 2}))  # fmt: skip
    args = ("--backend", "megatron", "--profile", str(profile), "--policy", "zb-h2")
    direct = _run(*args, "--comm", "direct", "--iterations", "3")
    delegated = _run(*args, "--comm", "delegated", "--iterations", "3")
    assert delegated["comm"] == "delegated" and len(delegated["losses"]) == 3
    assert delegated["losses"] == direct["losses"]  # the same bytes arrive: bit for bit
    assert delegated["params_sha256"] == direct["params_sha256"]


def test_delegates_remove_the_slow_links_head_of_line_blocking() -> None:
    """S=4, N=12, 10 ms ops, 40 ms on link 0-1: ZB over direct against ZB over delegates
    (adaptra-cpu) and Adaptra over delegates, each next to the simulator's prediction. Over
    direct each activation on link 0-1 holds its sender the 40 ms (head-of-line blocking);
    over delegates the sender only copies it out and a delegate waits the 40 ms on the wire.
    What load can only lengthen is bounded below; the sender's median hold over delegates
    is bounded above by the delay (a sender that slept it would hold every message at least
    that long; load stretches a few holds, not the median; an iteration's time is bounded
    only by a hang guard: load lengthens it)."""
    profile = Profile.uniform(
        4, 12, 10, 10, 10, delay_ms=[40, 0, 0], message_bytes=1 << 20, num_delegates=3
    )
    predicted = {"zb": 1050.0, "adaptra-cpu": 640.0, "adaptra": 430.0}
    for system, predicted_ms in predicted.items():
        sim = run_configuration(system_controller(system, profile), num_iterations=3)
        assert statistics.median(sim.iteration_times_ms) == predicted_ms
        run = run_configuration(
            system_controller(system, profile, link_terms=NO_LINK_TERMS),
            backend="emulated",
            num_iterations=3,
            delegated=system != "zb",
        )
        check_fidelity(statistics.median(run.iteration_times_ms), predicted_ms, system)
        assert run.timeline is not None
        sent = [  # the measured iterations' (the warm-up, iteration 0, is in the timeline)
            m
            for m in run.timeline.messages
            if (m.link, m.direction) == ("0-1", "forward") and m.iteration >= 1
        ]
        assert len(sent) == 3 * 12
        held_ms = [m.send_end_ms - m.send_start_ms for m in sent]
        if system == "zb":
            assert min(held_ms) >= 40.0, system
        else:
            assert statistics.median(held_ms) < 40.0, (system, held_ms)
            assert min(m.arrival_ms - m.wire_start_ms for m in sent) >= 40.0, system


def test_a_spec_runs_the_delegated_systems_on_the_emulated_runtime(tmp_path: Path) -> None:
    from harness.results import RUNS_COLUMNS, read_csv_rows
    from harness.saved import read_timeline

    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({
        "name": "d", "model": "m", "systems": ["zb", "adaptra-cpu"], "backend": "emulated",
        "profile": {"stages": 2, "microbatches": 4, "t_f": 5, "t_b": 5, "t_w": 5},
        "links": ["0-1"], "delays_ms": [20], "num_iterations": 2,
    }))  # fmt: skip
    out = cli("run", "--spec", str(spec), "--out", str(tmp_path), "--run-id", "r")
    assert out.returncode == 0, out.stderr
    runs = {r["system"]: r for r in read_csv_rows(tmp_path / "r" / "runs.csv", RUNS_COLUMNS)}
    assert (runs["zb"]["comm"], runs["adaptra-cpu"]["comm"]) == ("direct", "delegated")
    # ZB sent nothing over delegates; Adaptra-CPU over all it started: 20 ms held per 5 ms
    # made, capped at one per microbatch
    assert (runs["zb"]["num_delegates"], runs["adaptra-cpu"]["num_delegates"]) == ("0", "4")
    # The trainer's sends: over direct each holds the stage for the link's 20 ms; handed to
    # a delegate, the median less than that (a sender that slept the delay would hold each
    # at least that long; load stretches a few holds, not the median: the wall times can
    # turn around).
    direct = read_timeline(tmp_path / "r", ("m", "zb", "0-1@20ms", "0"))
    saved = read_timeline(tmp_path / "r", ("m", "adaptra-cpu", "0-1@20ms", "0"))
    assert direct is not None and saved is not None
    assert min(m.send_end_ms - m.send_start_ms for m in direct.messages if m.link == "0-1") >= 20
    handed = statistics.median(m.send_end_ms - m.send_start_ms for m in saved.messages)
    assert handed < 20
    workers = {pid for record in saved.iterations for pid in record.pids}
    assert saved.messages and all(m.carrier_pid not in workers for m in saved.messages)
