"""`run --backend megatron` and `profile --backend megatron`, run as a user runs them."""

import csv
import json
import math
from pathlib import Path

import pytest

from harness.experiment import run_experiment
from harness.spec import load_spec
from pipeline.profile import Profile
from pipeline.runtime.devices import choose_devices, describe_pool, num_visible_gpus
from pipeline.runtime.megatron.model import get_preset
from tests.harness.test_cli import cli

pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
pytestmark = pytest.mark.multiprocess


def test_the_same_model_trains_alike_at_any_stage_count(tmp_path: Path, fig4_path: Path) -> None:
    """Through the CLI: 1, 2 and 4 stages under 1F1B, ZB-H1 and ZB-H2 (one spec per stage
    count: its three systems share one pool of workers) and the Fig. 4 order (x = [7, 5, 3,
    1]) start from the same weights and train alike: the same losses to 1e-5 relative, the
    first one before any update. Digests may differ between stage counts and orders (sums in
    another order: the parameters are bounded to 1e-5 of one process's in test_numerics.py);
    each is a sha256, and the same run twice gives the same one."""
    losses: dict[str, list[float]] = {}
    digests: dict[str, str] = {}
    for stages in (1, 2, 4):
        spec = tmp_path / f"s{stages}.yaml"
        spec.write_text(
            json.dumps(
                {
                    "name": f"s{stages}",
                    "model": "tiny",
                    "profile": Profile.uniform(stages, 12, 1, 1, 1).to_dict(),
                    "systems": ["1f1b", "zb-h1", "zb-h2"],
                    "backend": "megatron",
                    "num_iterations": 3,
                    "num_warmup_iterations": 0,
                }
            )
        )
        # In this process: its workers' fork server has megatron-core imported already
        # (conftest.py), where each CLI process's own server imported it again (3-4 s of CPU
        # each); `run --spec` through the CLI is test_cli.py's, the fig4 run's below.
        run_experiment(load_spec(spec), tmp_path / f"s{stages}", progress=lambda _: None)
        with (tmp_path / f"s{stages}" / "iterations.csv").open() as rows:
            for row in csv.DictReader(rows):
                losses.setdefault(f"S={stages} {row['system']}", []).append(float(row["loss"]))
        with (tmp_path / f"s{stages}" / "runs.csv").open() as rows:
            digests |= {
                f"S={stages} {r['system']}": r["params_sha256"] for r in csv.DictReader(rows)
            }
    profile = tmp_path / "4.json"
    profile.write_text(json.dumps(Profile.uniform(4, 12, 1, 1, 1).to_dict()))
    fig4 = cli(
        "run", "--backend", "megatron", "--model", "tiny", "--profile", str(profile),
        "--schedule", str(fig4_path), "--iterations", "3", "--warmup-iterations", "0",
        "--format", "json",
    )  # fmt: skip
    assert fig4.returncode == 0, fig4.stderr
    losses["S=4 fig4"] = json.loads(fig4.stdout)["losses"]
    assert len(losses) == 10
    reference = losses["S=1 1f1b"]
    for name, run in losses.items():
        assert run == pytest.approx(reference, rel=1e-5), name
    assert reference[-1] < reference[0]
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in digests.values())
    assert digests["S=1 zb-h1"] == digests["S=1 zb-h2"]  # one stage: the same sums


def test_run_megatron_reports_one_falling_loss_per_iteration(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1}))
    out = cli(
        "run", "--backend", "megatron", "--model", "tiny", "--profile", str(profile),
        "--policy", "zb-h1", "--iterations", "3", "--format", "json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["backend"], data["model"], data["policy"]) == ("megatron", "tiny", "zb-h1")
    # Which process group and devices the workers took (on the CPU: gloo, no copies).
    chosen = [choose_devices(rank, 2, num_visible_gpus()) for rank in range(2)]
    assert data["devices"] == describe_pool(chosen)
    if not num_visible_gpus():
        assert data["devices"] == "gloo: 2 worker(s) on the CPU"
    assert len(data["losses"]) == len(data["iteration_times_ms"]) == 3
    assert all(math.isfinite(x) for x in data["losses"])
    assert data["losses"][-1] < data["losses"][0]
    assert data["seed"] == 0
    seeded = cli(
        "run", "--backend", "megatron", "--model", "tiny", "--profile", str(profile),
        "--policy", "zb-h1", "--iterations", "3", "--format", "json", "--seed", "7",
    )  # fmt: skip
    assert seeded.returncode == 0, seeded.stderr
    other = json.loads(seeded.stdout)
    assert other["seed"] == 7  # other initial weights and tokens
    assert other["params_sha256"] != data["params_sha256"]
    assert all(a != b for a, b in zip(other["losses"], data["losses"], strict=True))


def test_profile_writes_a_file_schedule_and_simulate_accept(tmp_path: Path) -> None:
    """(--tf32 is accepted, and said to change nothing on a machine without a GPU.)"""
    path = tmp_path / "measured.json"
    out = cli(
        "profile", "--backend", "megatron", "--model", "tiny", "--stages", "2",
        "--iterations", "1", "--out", str(path), "--format", "json", "--tf32",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    if num_visible_gpus() == 0:
        assert "--tf32 has no effect without a GPU" in out.stderr
    measured = Profile.from_file(path)  # the strict profile reader accepts it
    assert (measured.num_stages, measured.num_microbatches) == (2, 4)
    assert all(t > 0 for t in measured.t_f_ms + measured.t_b_ms + measured.t_w_ms)
    assert measured.message_bytes == 16 * 2 * 64 * 4  # [seq, batch, hidden] float32
    assert json.loads(out.stdout) == json.loads(path.read_text())
    planned = cli("schedule", "--profile", str(path), "--policy", "zb-h2", "--format", "json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["iteration_time_ms"] > 0
    simulated = cli(
        "simulate", "--profile", str(path), "--policy", "1f1b", "--comm", "direct",
        "--format", "json",
    )  # fmt: skip
    assert simulated.returncode == 0, simulated.stderr
    assert json.loads(simulated.stdout)["iteration_time_ms"] > 0


def test_falcon_trains_megatron_through_the_faults_of_its_dp_ring(tmp_path: Path) -> None:
    """PP 2 x DP 2 with 20 ms on DP link dp1:0-1, ZB and Falcon on one pool: megatron's real
    gradients go over the DP ring (every link direction's chunks add up to its stage's
    gradient bytes), the slow link's sends carry the injected delay as every other message's
    do, and Falcon, whatever it decides from the measured times, trains like ZB."""
    spec = tmp_path / "s.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "dp",
                "model": "tiny",
                "profile": {"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1, "dp": 2},
                "systems": ["zb", "falcon"],
                "backend": "megatron",
                "link_sets": [["dp1:0-1"]],
                "delays_ms": [20],
                "num_iterations": 4,
                "num_warmup_iterations": 1,
            }
        )
    )
    out = cli("run", "--spec", str(spec), "--out", str(tmp_path), "--run-id", "dp")
    assert out.returncode == 0, out.stderr
    losses: dict[str, list[float]] = {}
    with (tmp_path / "dp" / "iterations.csv").open() as rows:
        for row in csv.DictReader(rows):
            losses.setdefault(row["system"], []).append(float(row["loss"]))
    assert len(losses["zb"]) == 4
    assert losses["falcon"] == pytest.approx(losses["zb"], rel=1e-5)
    assert losses["zb"][-1] < losses["zb"][0]
    gradient_bytes = get_preset("tiny").gradient_bytes(2)
    with (tmp_path / "dp" / "messages.csv").open() as rows:
        ring = [r for r in csv.DictReader(rows) if r["link"].startswith("dp")]
    for system in ("zb", "falcon"):
        rows = [r for r in ring if r["system"] == system]
        assert {r["iteration"] for r in rows} == {"0", "1", "2", "3"}
        for r in rows:  # D = 2: each direction sends the stage's gradient in two halves
            assert int(r["num_bytes"]) == gradient_bytes[int(r["link"][2])], r
    for r in (r for r in ring if r["system"] == "zb"):
        delayed = r["link"] == "dp1:0-1"
        assert float(r["fault_ms"]) == (20.0 * int(r["num_messages"]) if delayed else 0.0), r
