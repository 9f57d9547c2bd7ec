"""Fixed profiles from the quality benchmark (benchmarks/bench_scheduler_quality.py)."""

from pipeline.profile import Profile

# The two worst profiles for the default call before per-stage caps and exact warm-ups:
# "paper S=6 N=18 b=10" seed 1 (CP-SAT proves 887 ms in about 1 s; the authors' rule and the
# old default call: 922 ms) and "straggler S=8 slow=2" at 60 ms, seed 2 (1382 ms in about
# 2 s; both: 1411 ms).
WORST_PAPER = Profile(
    num_stages=6,
    num_microbatches=18,
    t_f_ms=(10.0, 12.0, 12.0, 14.0, 15.0, 11.0),
    t_b_ms=(17.0, 16.0, 11.0, 19.0, 11.0, 20.0),
    t_w_ms=(20.0, 19.0, 15.0, 13.0, 11.0, 11.0),
    delay_ms=(7.0,) * 5,
)
WORST_STRAGGLER = Profile(
    num_stages=8,
    num_microbatches=24,
    t_f_ms=(12.0, 16.0, 12.0, 10.0, 20.0, 10.0, 13.0, 16.0),
    t_b_ms=(16.0, 19.0, 20.0, 19.0, 10.0, 17.0, 17.0, 14.0),
    t_w_ms=(16.0, 20.0, 17.0, 11.0, 10.0, 10.0, 11.0, 13.0),
    delay_ms=(0.0, 0.0, 60.0, 0.0, 0.0, 0.0, 60.0),
)

# "straggler S=8 slow=1" at 50 ms on the last link: the bound before per-rank release times
# gave 1269 ms here; the optimum, which the default call finds, is 1336 ms.
LATE_LAST_STAGE = Profile(
    num_stages=8,
    num_microbatches=24,
    t_f_ms=(18.0, 20.0, 13.0, 12.0, 16.0, 14.0, 10.0, 10.0),
    t_b_ms=(15.0, 14.0, 14.0, 17.0, 10.0, 19.0, 20.0, 17.0),
    t_w_ms=(15.0, 10.0, 16.0, 11.0, 16.0, 10.0, 19.0, 12.0),
    delay_ms=(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 50.0),
)

# "straggler S=8 slow=2" at 60 ms on links 0-1 and 3-4: the default call's worst gap with
# 128,000 ops to search (1326 ms against the 1319 ms optimum, 0.53 %); 1324 ms with 1,000,000.
WORST_GAP_2026_12 = Profile(
    num_stages=8,
    num_microbatches=24,
    t_f_ms=(10.0, 17.0, 20.0, 15.0, 11.0, 14.0, 18.0, 10.0),
    t_b_ms=(12.0, 11.0, 15.0, 17.0, 15.0, 17.0, 13.0, 16.0),
    t_w_ms=(12.0, 16.0, 11.0, 16.0, 18.0, 15.0, 12.0, 12.0),
    delay_ms=(60.0, 0.0, 0.0, 60.0, 0.0, 0.0, 0.0),
)
