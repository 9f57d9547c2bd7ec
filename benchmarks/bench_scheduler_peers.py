"""Adaptra (ours) against the Adaptra authors' own scheduler code, branch by branch.

Run: python benchmarks/bench_scheduler_peers.py --pipemorph-dir DIR [--pipemorph-git GITDIR]
     [--branches main simulator_new AE extended_experiments] [--seeds 5] [--sweep-seeds 50]
     [--out peers.csv]

DIR holds one extracted tree per branch of github.com/wutianyuan1/PipeMorph (DIR/main,
DIR/simulator_new, DIR/AE, DIR/extended_experiments). With --pipemorph-git (a bare clone),
missing trees are extracted there first (`git archive BRANCH`). Their code is never imported
here: each branch runs in its own child process (benchmarks/pipemorph_worker.py, `python -I`,
their TREE/zerobubble first on sys.path) that calls that branch's
`pipeline_simulator.auto_schedule.auto_schedule` on JSON requests. Their F/B/W order per
stage becomes our `Schedule`, is checked by `validate_schedule`, and is timed like ours by
`simulate(schedule, profile, CommMode.IDEAL)` (iteration time from `compute_metrics`): both
sides are measured by our timing, not by their simulator.

Inputs their auto_schedule gets, as their Megatron caller (cpu_schedules.py) builds them:
per-stage F, B, W times in whole ms, cost_comm 0, the delayed links as (i, i+1) pairs, and
the delay in ms. The branches main, simulator_new and AE take ONE delay for all the listed
links; extended_experiments takes one per listed link. Where a profile's delayed links
differ, the one-delay branches get the largest of them on every delayed link (column
`<branch>_input` says "max" then; "exact" where the profile fits).

A call that runs past --timeout is stopped and counted as a failure ("timeout"). The AE
branch's policy never finishes when its warm-up rule asks some stage for more forwards than
there are microbatches; column `ae_rule_x0` is that rule's x_0 (uncapped), and such timeouts
read "timeout (rule x0 > N)".

Profile groups:
- issue: S=8, N=32, `random_profile(random.Random(42), 8, 32, low_ms=20, high_ms=40,
  delay_ms=(0, 0, 0, 20, 0, 0, 0))`, i.e. 20 ms on link 3 (between stages 3 and 4);
- sweep: seeds 0..K-1 of `random.Random(f"peers-sweep-{seed}")`: it draws the number of slow
  links (randint(1, 2)), which links (sample of range(7)), each one's delay (randint(10, 60)
  ms), then the op times (random_profile, 20-40 ms) with S=8, N=32;
- paper and straggler: bench_scheduler_quality.paper_grid / straggler_grid (imported).

For every profile all systems run one after the other (ours first), before the next profile.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import select
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from bench_scheduler_quality import issue_profile, paper_grid, straggler_grid, sweep_profiles

from adaptra.scheduler import plan_adaptra
from harness.results import write_csv_atomic
from pipeline.errors import ScheduleError
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule, validate_schedule
from pipeline.signals import run_script
from pipeline.simulator import CommMode, simulate

BRANCHES = ("main", "simulator_new", "AE", "extended_experiments")
PER_LINK_BRANCHES = frozenset({"extended_experiments"})
"""Branches whose auto_schedule takes one delay per delayed link (the others take one)."""
WORKER = Path(__file__).with_name("pipemorph_worker.py")


def extract_trees(git_dir: Path, out_dir: Path, branches: list[str]) -> None:
    for branch in branches:
        target = out_dir / branch
        if target.exists():
            continue
        archive = subprocess.run(
            ["git", f"--git-dir={git_dir}", "archive", "--format=tar", branch],
            check=True,
            capture_output=True,
        ).stdout
        target.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
        print(f"extracted {branch} into {target}")


class Worker:
    """One branch's child process, answering one request a line."""

    def __init__(self, branch: str, tree: Path, python: str, timeout_s: float) -> None:
        self.branch, self.tree, self.python, self.timeout_s = branch, tree, python, timeout_s
        self.log = open(os.devnull, "w")  # noqa: SIM115 (their prints, kept for the child's life)
        self.proc: subprocess.Popen[str] | None = None
        self.module_file = ""
        self.next_id = 0
        self._start()

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["MPLBACKEND"] = "Agg"
        self.proc = subprocess.Popen(
            [self.python, "-I", str(WORKER), str(self.tree)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        hello = self._read(120.0)
        if hello is None or not hello.get("ready"):
            raise RuntimeError(f"{self.branch}: worker did not start: {hello}")
        self.module_file = str(hello["file"])

    def _read(self, limit_s: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], limit_s)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.next_id += 1
        request = {**request, "id": self.next_id, "timeout_s": self.timeout_s}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._read(self.timeout_s + 30.0)
        if answer is None:  # stuck past SIGALRM or dead: start a fresh child
            self.close()
            self._start()
            return {"ok": False, "status": "hung", "error": "no answer; child restarted"}
        return answer

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # our own child, by its handle
                self.proc.wait()
            self.proc = None


def branch_request(branch: str, profile: Profile) -> tuple[dict[str, Any], str]:
    """Their inputs for `profile`, and how the delays were given ("exact" or "max")."""
    for times in (profile.t_f_ms, profile.t_b_ms, profile.t_w_ms):
        if any(not float(t).is_integer() for t in times):
            raise ValueError("their GraphConfig takes whole-ms op times only")
    slow = [i for i, d in enumerate(profile.delay_ms) if d > 0]
    delays = [float(profile.delay_ms[i]) for i in slow]
    how = "exact"
    delay_time: float | list[float]
    if branch in PER_LINK_BRANCHES:
        delay_time = delays
    else:
        delay_time = max(delays, default=0.0)
        if len(set(delays)) > 1:
            how = "max"
    request = {
        "stages": profile.num_stages,
        "microbatches": profile.num_microbatches,
        "t_f": [int(t) for t in profile.t_f_ms],
        "t_b": [int(t) for t in profile.t_b_ms],
        "t_w": [int(t) for t in profile.t_w_ms],
        "delay_links": [[i, i + 1] for i in slow],
        "delay_time": delay_time,
    }
    return request, how


def rule_first_warmup(profile: Profile, delays: list[float]) -> int:
    """x_0 of the AE branch's warm-up rule (x_S-1 = 1, x_i = x_i+1 + ceil(c_i / tF_i) + 2)
    with no cap at N, for the per-link delays `delays`: their policy never ends when any
    x_i > N (it waits for a warm-up forward that does not exist), so such calls time out."""
    x = 1
    for i in reversed(range(profile.num_stages - 1)):
        x += math.ceil(delays[i] / profile.t_f_ms[i]) + 2
    return x


def iteration_ms(schedule: Schedule, profile: Profile) -> float:
    timeline = simulate(schedule, profile, CommMode.IDEAL)
    return compute_metrics(timeline).iteration_time_ms


def measure(group: str, index: int, profile: Profile, workers: dict[str, Worker]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "group": group,
        "index": index,
        "stages": profile.num_stages,
        "microbatches": profile.num_microbatches,
        "t_f": " ".join(f"{t:g}" for t in profile.t_f_ms),
        "t_b": " ".join(f"{t:g}" for t in profile.t_b_ms),
        "t_w": " ".join(f"{t:g}" for t in profile.t_w_ms),
        "delays_ms": " ".join(f"{d:g}" for d in profile.delay_ms),
    }
    start = time.perf_counter()
    ours = plan_adaptra(profile)
    row["ours_gen_ms"] = (time.perf_counter() - start) * 1000.0
    row["ours_ms"] = iteration_ms(ours.schedule, profile)
    row["ours_method"] = ours.method
    row["ours_warmup"] = " ".join(map(str, ours.schedule.warmup_counts()))
    # The delays the one-delay branches are given: the largest on every delayed link.
    largest = max(profile.delay_ms, default=0.0)
    given = [largest if d > 0 else 0.0 for d in profile.delay_ms]
    row["ae_rule_x0"] = rule_first_warmup(profile, given)
    for branch, worker in workers.items():
        request, how = branch_request(branch, profile)
        row[f"{branch}_input"] = how
        answer = worker.call(request)
        row[f"{branch}_gen_ms"] = 1000.0 * float(answer.get("seconds", math.nan))
        row[f"{branch}_ms"] = math.nan
        row[f"{branch}_warmup"] = ""
        if not answer["ok"]:
            status = answer["status"]
            if branch == "AE" and row["ae_rule_x0"] > profile.num_microbatches:
                status += " (rule x0 > N)"
            row[f"{branch}_status"] = status
            continue
        try:
            schedule = Schedule.from_text(answer["stages"])
            validate_schedule(schedule, profile.num_stages, profile.num_microbatches)
        except ScheduleError as error:
            row[f"{branch}_status"] = f"invalid: {error}"[:200]
            continue
        row[f"{branch}_status"] = "ok"
        row[f"{branch}_ms"] = iteration_ms(schedule, profile)
        row[f"{branch}_warmup"] = " ".join(map(str, schedule.warmup_counts()))
    return row


def summarise(rows: list[dict[str, Any]], branches: list[str]) -> None:
    print(
        "\n| group | system | n | n ok | mean iter ms | ours mean on same | beats ours |"
        " ties | max ours/branch | failures |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    groups = list(dict.fromkeys(str(r["group"]) for r in rows))
    for group in [*groups, "all"]:
        sel = [r for r in rows if group in ("all", r["group"])]
        ours_mean = statistics.mean(float(r["ours_ms"]) for r in sel)
        print(f"| {group} | ours | {len(sel)} | {len(sel)} | {ours_mean:.1f} | | | | | |")
        for branch in branches:
            ok = [r for r in sel if r[f"{branch}_status"] == "ok"]
            failures: dict[str, int] = {}
            for r in sel:
                status = str(r[f"{branch}_status"])
                if status != "ok":
                    key = status.split(":")[0]  # "invalid: <why>" counts as "invalid"
                    failures[key] = failures.get(key, 0) + 1
            failed = ", ".join(f"{n} {k}" for k, n in sorted(failures.items())) or "0"
            maxed = sum(r[f"{branch}_input"] == "max" for r in sel)
            if maxed:
                failed += f" ({maxed} given the max delay)"
            if not ok:
                print(f"| {group} | {branch} | {len(sel)} | 0 | | | | | | {failed} |")
                continue
            mean = statistics.mean(float(r[f"{branch}_ms"]) for r in ok)
            same = statistics.mean(float(r["ours_ms"]) for r in ok)
            wins = sum(float(r[f"{branch}_ms"]) < float(r["ours_ms"]) - 1e-9 for r in ok)
            ties = sum(abs(float(r[f"{branch}_ms"]) - float(r["ours_ms"])) <= 1e-9 for r in ok)
            ratio = max(float(r["ours_ms"]) / float(r[f"{branch}_ms"]) for r in ok)
            print(
                f"| {group} | {branch} | {len(sel)} | {len(ok)} | {mean:.1f} | {same:.1f} |"
                f" {wins} | {ties} | {ratio:.4f} | {failed} |"
            )


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipemorph-dir", type=Path, required=True)
    parser.add_argument("--pipemorph-git", type=Path, help="Bare clone to extract trees from.")
    parser.add_argument("--branches", nargs="+", default=list(BRANCHES))
    parser.add_argument("--seeds", type=int, default=5, help="Per cell of the paper grids.")
    parser.add_argument("--sweep-seeds", type=int, default=50)
    parser.add_argument("--groups", nargs="+", default=["issue", "sweep", "paper", "straggler"])
    parser.add_argument("--timeout", type=float, default=10.0, help="Per auto_schedule call.")
    parser.add_argument("--python", default=sys.executable, help="Interpreter for the children.")
    parser.add_argument("--out", type=Path, help="Per-profile rows as CSV.")
    args = parser.parse_args()
    if args.pipemorph_git:
        extract_trees(args.pipemorph_git, args.pipemorph_dir, args.branches)
    builders = {
        "issue": issue_profile,
        "sweep": lambda: sweep_profiles(args.sweep_seeds),
        "paper": lambda: paper_grid(args.seeds),
        "straggler": lambda: straggler_grid(args.seeds),
    }
    cases = [case for name in args.groups for case in builders[name]()]
    print(f"load average before: {load_average()}")
    workers = {
        b: Worker(b, args.pipemorph_dir / b, args.python, args.timeout) for b in args.branches
    }
    for branch, worker in workers.items():
        delays = "one delay per link" if branch in PER_LINK_BRANCHES else "one delay"
        print(f"{branch}: {worker.module_file} ({delays})")
    start = time.perf_counter()
    rows = []
    try:
        for index, (group, profile) in enumerate(cases):
            rows.append(measure(group, index, profile, workers))
    finally:
        for worker in workers.values():
            worker.close()
    print(f"{len(rows)} profiles in {time.perf_counter() - start:.0f} s")
    print(f"load average after: {load_average()}")
    summarise(rows, args.branches)
    better = [
        (float(r["ours_ms"]) / float(r[f"{b}_ms"]), b, r)
        for r in rows
        for b in args.branches
        if r[f"{b}_status"] == "ok" and float(r[f"{b}_ms"]) < float(r["ours_ms"]) - 1e-9
    ]
    if better:
        print("\nprofiles where a branch beats ours (worst 5):")
        for ratio, branch, r in sorted(better, key=lambda x: -x[0])[:5]:
            print(
                f"  {branch} {ratio:.4f}: {r['group']} #{r['index']} delays {r['delays_ms']};"
                f" ours {r['ours_ms']:.1f} ms (x {r['ours_warmup']}),"
                f" theirs {r[f'{branch}_ms']:.1f} ms (x {r[f'{branch}_warmup']})"
            )
    if args.out:
        write_csv_atomic(args.out, list(rows[0]), rows)
        print(f"\nper-profile rows: {args.out}")


if __name__ == "__main__":
    run_script(main)
