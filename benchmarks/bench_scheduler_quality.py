"""Adaptra's schedule quality and speed against the proven optimum (CP-SAT).

Run: python benchmarks/bench_scheduler_quality.py [--seeds 5] [--search-ops N] [--out quality.csv]
(default --out: the repository's results/scheduler_quality.csv, wherever it is run from)

Three sets of profiles:
- the paper's grid (Fig. 19): (S, N) in {(3,6), (4,12), (6,18), (8,32)}, every op time
  randint(b, 2b) per stage and op with b in {10, 20, 30}, one delay c in 1..20 ms on all links;
- a straggler grid: S in {4, 8}, N = 3S, times randint(10, 20), one or two slow links (chosen
  at random) with 0-60 ms;
- issue 14's profiles at (8,32): the 50-seed sweep with 1-2 slow links that
  bench_scheduler_peers.py runs beside the authors' code, and the issue's own profile.
For each profile: the default `adaptra` call (time and iteration time; it adds a CP-SAT solve
only for problems of at most 150 ops, i.e. (3,6) and (4,12) here), the same heuristic with no
exact solve, Algorithm 2 + generator alone, the authors' released heuristic (their warm-up
rule + the generator, which equals their 1 ms time-step generator on integer times), and the
exact optimum (CP-SAT, warm-started with the best heuristic, 30 s limit). Gaps are to the
proven lower bound. `--search-ops` sets the search's budget (default: the default call's).
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import time
from pathlib import Path

from adaptra.exact import solve_exact
from adaptra.generator import Policy, generate_policy
from adaptra.planning import algorithm2, authors_warmup
from adaptra.policy_timing import time_policy
from adaptra.scheduler import DEFAULT_SEARCH_OPS, plan_adaptra
from harness.results import write_csv_atomic
from pipeline.profile import Profile
from pipeline.sampling import random_profile
from pipeline.signals import run_script

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "scheduler_quality.csv"


def paper_grid(num_seeds: int) -> list[tuple[str, Profile]]:
    cases = []
    for num_stages, num_microbatches in [(3, 6), (4, 12), (6, 18), (8, 32)]:
        for low in (10, 20, 30):
            for seed in range(num_seeds):
                rng = random.Random(f"paper-{num_stages}-{low}-{seed}")
                delay = float(rng.randint(1, 20))
                profile = random_profile(
                    rng,
                    num_stages,
                    num_microbatches,
                    low_ms=low,
                    high_ms=2 * low,
                    delay_ms=(delay,) * (num_stages - 1),
                )
                cases.append((f"paper S={num_stages} N={num_microbatches} b={low}", profile))
    return cases


def straggler_grid(num_seeds: int) -> list[tuple[str, Profile]]:
    cases = []
    for num_stages in (4, 8):
        for num_slow in (1, 2):
            for delay in range(0, 61, 10):
                for seed in range(num_seeds):
                    rng = random.Random(f"straggler-{num_stages}-{num_slow}-{delay}-{seed}")
                    slow = rng.sample(range(num_stages - 1), num_slow)
                    delays = tuple(
                        float(delay) if i in slow else 0.0 for i in range(num_stages - 1)
                    )
                    profile = random_profile(
                        rng, num_stages, 3 * num_stages, low_ms=10, high_ms=20, delay_ms=delays
                    )
                    cases.append((f"straggler S={num_stages} slow={num_slow}", profile))
    return cases


def issue_profile() -> list[tuple[str, Profile]]:
    delays = (0.0, 0.0, 0.0, 20.0, 0.0, 0.0, 0.0)
    profile = random_profile(random.Random(42), 8, 32, low_ms=20, high_ms=40, delay_ms=delays)
    return [("issue S=8 N=32 seed 42, 20 ms on link 3", profile)]


def sweep_profiles(num_seeds: int) -> list[tuple[str, Profile]]:
    cases = []
    for seed in range(num_seeds):
        rng = random.Random(f"peers-sweep-{seed}")
        slow = rng.sample(range(7), rng.randint(1, 2))
        delays = [0.0] * 7
        for link in slow:
            delays[link] = float(rng.randint(10, 60))
        profile = random_profile(rng, 8, 32, low_ms=20, high_ms=40, delay_ms=delays)
        cases.append(("sweep S=8 N=32 1-2 slow links 10-60 ms", profile))
    return cases


def measure(
    group: str, profile: Profile, time_limit_s: float, search_ops: int = DEFAULT_SEARCH_OPS
) -> dict[str, object]:
    start = time.perf_counter()
    adaptra = plan_adaptra(profile, search_ops=search_ops)
    adaptra_ms = (time.perf_counter() - start) * 1000.0
    heuristic = plan_adaptra(profile, exact_time_limit_s=0, search_ops=search_ops)
    alg2 = Policy.uncapped(algorithm2(profile).warmup)
    authors = Policy.uncapped(authors_warmup(profile))
    alg2_ms = time_policy(profile, alg2).iteration_time_ms
    authors_ms = time_policy(profile, authors).iteration_time_ms
    warm_start = adaptra.schedule
    if min(alg2_ms, authors_ms) < adaptra.iteration_time_ms:
        warm_start = generate_policy(profile, alg2 if alg2_ms <= authors_ms else authors)
    exact = solve_exact(profile, time_limit_s=time_limit_s, warm_start=warm_start)
    bound = exact.lower_bound_ms
    return {
        "group": group,
        "stages": profile.num_stages,
        "microbatches": profile.num_microbatches,
        "delays_ms": " ".join(f"{d:g}" for d in profile.delay_ms),
        "adaptra_ms": adaptra.iteration_time_ms,
        "adaptra_generation_ms": adaptra_ms,
        "adaptra_candidates": adaptra.num_candidates,
        "alg2_ms": alg2_ms,
        "authors_ms": authors_ms,
        "optimum_ms": exact.iteration_time_ms,
        "lower_bound_ms": bound,
        "proven_optimal": exact.optimal,
        "solve_ms": exact.solve_ms,
        "adaptra_gap": adaptra.iteration_time_ms / bound - 1,
        "heuristic_gap": heuristic.iteration_time_ms / bound - 1,
        "alg2_gap": alg2_ms / bound - 1,
        "authors_gap": authors_ms / bound - 1,
    }


def summarise(rows: list[dict[str, object]], title: str) -> None:
    print(
        f"\n{title}: {len(rows)} profiles, "
        f"{sum(str(r['proven_optimal']) == 'True' for r in rows)} optima proven"
    )
    print(
        "| group | n | adaptra (default) mean / max gap | heuristic only | alg2+generator |"
        " authors' heuristic | adaptra worse than authors | adaptra median ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    groups = sorted({str(r["group"]) for r in rows}, key=lambda g: (len(g), g))
    for group in [*groups, "all"]:
        sel = [r for r in rows if group in ("all", r["group"])]

        def stats(key: str, sel: list[dict[str, object]] = sel) -> str:
            values = [100 * float(r[key]) for r in sel]  # type: ignore[arg-type]
            return f"{statistics.mean(values):.3f} % / {max(values):.3f} %"

        worse = sum(float(r["adaptra_ms"]) > float(r["authors_ms"]) + 1e-9 for r in sel)
        median_ms = statistics.median(float(r["adaptra_generation_ms"]) for r in sel)
        print(
            f"| {group} | {len(sel)} | {stats('adaptra_gap')} | {stats('heuristic_gap')} | "
            f"{stats('alg2_gap')} | {stats('authors_gap')} | {worse} | {median_ms:.1f} |"
        )


def profile_sets(num_seeds: int) -> list[tuple[str, list[tuple[str, Profile]]]]:
    """Each set's title and its (group, profile)s."""
    return [
        ("paper grid", paper_grid(num_seeds)),
        ("straggler grid", straggler_grid(num_seeds)),
        (
            "the peers benchmark's (8,32) sweep and the issue's profile",
            sweep_profiles(50) + issue_profile(),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="The per-profile CSV (default: the repository's results/scheduler_quality.csv).",
    )
    parser.add_argument("--from-csv", type=Path, help="Only summarise an earlier run's CSV.")
    parser.add_argument(
        "--search-ops", type=int, default=DEFAULT_SEARCH_OPS, help="The search's ops budget."
    )
    args = parser.parse_args()
    sets = profile_sets(args.seeds)
    if args.from_csv:
        rows = list(csv.DictReader(args.from_csv.open()))
        for title, cases in sets:
            groups = {group for group, _ in cases}
            summarise([r for r in rows if r["group"] in groups], title)
        return
    all_rows = []
    for title, cases in sets:
        rows = [
            measure(group, profile, args.time_limit, args.search_ops) for group, profile in cases
        ]
        summarise(rows, title)
        all_rows += rows
    write_csv_atomic(args.out, list(all_rows[0]), all_rows)
    print(f"\nper-profile rows: {args.out}")


if __name__ == "__main__":
    run_script(main)
