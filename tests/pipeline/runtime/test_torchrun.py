"""The torchrun worker: its command line, what it computes with, and the one clock rank 0
puts every rank's records on."""

import itertools
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.checks import MAX_SEED
from pipeline.metrics import compute_metrics
from pipeline.runtime.compute import EmulatedCompute
from pipeline.runtime.config import RankResult
from pipeline.runtime.pool import assemble_timeline
from pipeline.runtime.torchrun import compute_backend, on_one_clock, parse_worker_args
from pipeline.timeline import Timeline
from pipeline.torchrun_launch import torchrun_commands

PLAN = ["--profile", "p.json", "--schedule", "s.json", "--out", "out"]


def test_a_megatron_worker_draws_its_weights_and_tokens_from_the_seed_it_is_given() -> None:
    """The worker built MegatronCompute(model) with seed 0, whatever the spec's seed."""
    pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
    from pipeline.runtime.megatron import MegatronCompute
    from pipeline.runtime.megatron.model import microbatch_tokens

    megatron = [*PLAN, "--compute", "megatron", "--model", "tiny"]
    computes = [
        compute_backend(parse_worker_args([*megatron, *seed]))
        for seed in ([], ["--seed", "7"], ["--seed", str(MAX_SEED)])
    ]
    megatrons = [c for c in computes if isinstance(c, MegatronCompute)]
    assert len(megatrons) == 3 and [c.seed for c in megatrons] == [0, 7, MAX_SEED]
    tokens = [microbatch_tokens(c.preset, c.seed, 0)[0] for c in megatrons]
    assert not tokens[0].equal(tokens[1]) and not tokens[1].equal(tokens[2])


def test_the_emulated_worker_takes_a_seed_and_a_seed_out_of_range_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert isinstance(compute_backend(parse_worker_args([*PLAN, "--seed", "3"])), EmulatedCompute)
    for bad in ("-1", str(MAX_SEED + 1)):
        with pytest.raises(SystemExit):
            parse_worker_args([*PLAN, "--seed", bad])
        assert f"--seed must be in 0..{MAX_SEED}" in capsys.readouterr().err


def test_a_launch_id_is_32_hex_digits(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_worker_args([*PLAN, "--launch-id", "0f" * 16]).launch_id == "0f" * 16
    assert parse_worker_args(PLAN).launch_id is None  # `launch` without --spec: none
    for bad in ("0f" * 15, "../x", "0F" * 16):
        with pytest.raises(SystemExit):
            parse_worker_args([*PLAN, "--launch-id", bad])
        assert "--launch-id must be 32 hex digits" in capsys.readouterr().err


def _result(rank: int, op_start_s: float, op_end_s: float) -> RankResult:
    """Stage `rank`'s records: one forward of microbatch 0 and its step, in host seconds."""
    return RankResult(
        rank=rank, stage=rank, replica=0, pid=100 + rank,
        ops=[("F", 0, op_start_s, op_end_s)], sends=[], receives=[],
        step_start=op_end_s, step_end=op_end_s + 0.001, bytes_sent=0,
    )  # fmt: skip


def test_rank_0_puts_every_rank_on_one_clock_counting_each_host_from_its_first_rank() -> None:
    """Ranks 0 and 1 share host 0's clock and count from rank 1's earlier barrier exit (10.0
    s); rank 2 is on host 1, whose clock is its own (500.0 s at its exit). All start at 2 s."""
    stamped = [
        (0, 10.002, _result(0, 10.003, 10.013)),
        (0, 10.000, _result(1, 10.014, 10.024)),
        (1, 500.000, _result(2, 500.025, 500.035)),
    ]
    results = on_one_clock(stamped, 2.0)
    assert [r.ops[0][2:] for r in results] == [
        pytest.approx((2.003, 2.013)),
        pytest.approx((2.014, 2.024)),
        pytest.approx((2.025, 2.035)),
    ]
    timeline = assemble_timeline(3, 0, 0.0, 2.0, results)
    (iteration,) = timeline.iterations
    assert iteration.start_ms == pytest.approx(2000.0)
    assert iteration.end_ms == pytest.approx(2036.0)  # the last rank's step end
    assert compute_metrics(timeline, 0).iteration_time_ms == pytest.approx(35.0)


def test_one_node_without_a_port_has_its_store_bind_a_free_one_itself() -> None:
    """A port picked before torchrun and closed could be another process's by the time
    torchrun's store bound it (address already in use): now the store binds port 0."""
    (command,) = torchrun_commands(
        num_nodes=1, procs_per_node=2, master_addr="127.0.0.1", master_port=None, worker_args=[]
    )
    argv = shlex.split(command)
    store = argv[argv.index("--node-rank=0") + 1 : argv.index("pipeline.runtime.torchrun") - 1]
    assert store == [
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        "--local-addr=127.0.0.1",
        # it hosts the store whatever its host's name resolves to (an address of this host
        # off loopback, where the name resolves to 127.0.0.1, waited as a client of port 0)
        "--rdzv-conf=is_host=1",
    ]
    (command,) = torchrun_commands(
        num_nodes=1, procs_per_node=2, master_addr="::1", master_port=None, worker_args=[]
    )
    assert "--rdzv-endpoint=[::1]:0" in shlex.split(command)
    given = torchrun_commands(
        num_nodes=2, procs_per_node=1, master_addr="h0", master_port=29501, worker_args=[]
    )
    for command in given:
        assert "--master-addr=h0" in command and "--master-port=29501" in command
        assert "rdzv" not in command
    with pytest.raises(ValueError, match="2 nodes need node 0's port"):
        torchrun_commands(
            num_nodes=2, procs_per_node=1, master_addr="h0", master_port=None, worker_args=[]
        )


@pytest.mark.multiprocess
def test_a_torchrun_run_keeps_every_stage_on_one_clock_per_iteration(tmp_path: Path) -> None:
    """Stages 1 and 2 used to count from their own iteration start while stage 0 counted
    from the run's: messages arrived before they were sent, ops lay outside their iteration
    and the iteration times were a max over mixed clocks."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"stages": 3, "microbatches": 4, "t_f": 5, "t_b": 5, "t_w": 5}))
    out = subprocess.run(
        [
            sys.executable, "-m", "harness", "launch", "--profile", str(profile),
            "--policy", "zb-h2", "--run", "--iterations", "3", "--out", str(tmp_path / "run"),
        ],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    timeline = Timeline.from_dict(json.loads(Path(printed["timeline"]).read_text()))
    assert [r.iteration for r in timeline.iterations] == [0, 1, 2]
    for before, after in itertools.pairwise(timeline.iterations):
        assert after.start_ms == before.end_ms  # one clock: each starts where the last ended
    for record, printed_ms in zip(timeline.iterations, printed["iteration_times_ms"], strict=True):
        ops = [op for op in timeline.ops if op.iteration == record.iteration]
        assert len(ops) == 3 * 4 * 3  # every stage's F, B and W of each microbatch
        assert all(record.start_ms <= op.start_ms <= op.end_ms <= record.end_ms for op in ops)
        last_op_end_ms = max(op.end_ms for op in ops)
        assert printed_ms == pytest.approx(last_op_end_ms - record.start_ms)
        assert record.end_ms - record.start_ms == pytest.approx(printed_ms + record.step_time_ms)
    assert len(timeline.messages) == 3 * 2 * 2 * 4  # 2 links x (activation, gradient) x N
    late = [m for m in timeline.messages if m.arrival_ms < m.send_start_ms]
    assert late == []  # no message arrives before it was sent
