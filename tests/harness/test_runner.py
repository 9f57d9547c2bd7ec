"""harness.runner: one configuration on the engines an experiment shares."""

import dataclasses

import pytest

from baselines import one_f_one_b
from harness.runner import (
    RuntimeEngines,
    check_processes,
    fixed_plan,
    idle_fault_rows_warning,
    largest_messages,
    longest_hold_ms,
    replaced_rows_warning,
    run_configuration,
    wire_rate_warning,
)
from injectors.fault_files import parse_trace, parse_yaml
from injectors.kernel_probe import PerLinkPath
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS
from pipeline.profile import Profile
from pipeline.topology import Position

DP0 = (Position(0, 0), Position(0, 1))
DP1 = (Position(1, 0), Position(1, 1))


@pytest.mark.multiprocess
def test_the_seed_reaches_the_megatron_model() -> None:
    """The run's seed draws megatron's initial weights and synthetic tokens: another seed
    trains another model (its own pool), the same seed the same one again."""
    pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
    profile = Profile.uniform(2, 2, 1, 1, 1)
    runs = []
    with RuntimeEngines() as engines:
        for seed in (0, 7, 0):
            result = run_configuration(
                fixed_plan(one_f_one_b(profile), profile),
                backend="megatron",
                model="tiny",
                num_iterations=2,
                num_warmup_iterations=0,
                engines=engines,
                seed=seed,
            )
            assert len(result.losses) == 2 and len(result.params_sha256) == 64
            runs.append((result.losses, result.params_sha256))
    (zero_losses, zero_sha), (seven_losses, seven_sha), again = runs
    assert again == (zero_losses, zero_sha)
    assert seven_sha != zero_sha
    assert all(a != b for a, b in zip(zero_losses, seven_losses, strict=True))


def test_an_emulated_runs_dp_links_carry_its_rings_largest_chunks() -> None:
    """The profile's bytes: its PP messages, and per DP link its stage's largest chunk
    (1,000,000 B in buckets of 600,000: a 600,000-B bucket, 300,000 B a message at D = 2)."""
    profile = Profile.uniform(
        2, 4, 1, 1, 1, message_bytes=4096, num_replicas=2,
        allreduce_bytes=(1_000_000, 8), dp_bucket_bytes=600_000,
    )  # fmt: skip
    assert largest_messages(profile) == (4096, {DP0: 300_000, DP1: 4})
    assert largest_messages(Profile.uniform(2, 4, 1, 1, 1, message_bytes=4096)) == (4096, {})
    cap = parse_yaml('[{start_iteration: 0, links: ["dp0:0-1"], bandwidth_gbps: 0.001}]', 0)
    assert longest_hold_ms(profile, cap) == 2400.0  # 300,000 B at 1 Mbit/s, not 4096 B's 32.8


def test_a_megatron_runs_messages_are_its_models_whatever_the_profile_says() -> None:
    """tiny at S = 2, D = 2: 8192-B activations, chunks of half each stage's fp32 gradient
    (636,672 and 633,088 B), and on the testbed's network (not the hook, which leaves that
    send alone) the tied weight's 32,768-B gradient between a replica's first and last
    stage; a profile of 0 bytes gets them all."""
    pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
    profile = Profile.uniform(2, 4, 1, 1, 1, num_replicas=2)
    chunks = {DP0: 318_336, DP1: 316_544}
    assert largest_messages(profile, model="tiny") == (8192, chunks)
    tied = {(Position(0, r), Position(1, r)): 32_768 for r in (0, 1)}
    on_wire = largest_messages(profile, model="tiny", injection="network")
    assert on_wire == (8192, {**chunks, **tied})
    pp_cap = parse_yaml('[{start_iteration: 0, links: ["0-1"], bandwidth_gbps: 0.001}]', 0)
    dp_cap = parse_yaml('[{start_iteration: 0, links: ["dp0:0-1"], bandwidth_gbps: 0.001}]', 0)
    assert longest_hold_ms(profile, pp_cap, model="tiny") == 65.536
    assert longest_hold_ms(profile, pp_cap, model="tiny", injection="network") == 262.144
    assert longest_hold_ms(profile, dp_cap, model="tiny") == 2546.688


_ROWS = """
- {start_iteration: 1, links: ["0-1"], delay_ms: 20}
- {start_iteration: 2, hosts: [0, 1], bandwidth_gbps: 1}
- {start_iteration: 3, links: ["dp1:0-1"], delay_ms: 5}
- {start_iteration: 4, nic: "host1:rnic0", down: true}
"""


_CAP = "row 2 (a cap holds bytes, and no message has any)"
_RING = "row 3 (its stages' rings have no gradient bytes: none runs)"
_ADVICE = (
    "no message with this profile: give it message_bytes and allreduce_bytes (both 0 unless given)"
)


@pytest.mark.parametrize(
    ("sizes", "warning"),
    [
        ({}, f"warning: fault {_CAP}; {_RING} touch {_ADVICE}"),
        ({"message_bytes": 4096}, f"warning: fault {_RING} touches {_ADVICE}"),
        ({"allreduce_bytes": [8, 0]}, f"warning: fault {_RING} touches {_ADVICE}"),
        ({"allreduce_bytes": [0, 8]}, None),  # stage 1's ring runs, and its chunks are capped
    ],
)
def test_fault_rows_that_touch_no_message_with_the_profile_are_named(
    sizes: dict[str, object], warning: str | None
) -> None:
    """A cap where no message has bytes, a fault on a ring link of a stage with no gradient
    bytes: the run would change nothing there, with nothing said. A delay on a PP link and a
    NIC down act whatever the sizes."""
    profile = Profile.from_dict(
        {"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1, "dp": 2, **sizes}
    )
    assert idle_fault_rows_warning(profile, parse_yaml(_ROWS)) == warning


def test_a_host_pair_no_link_joins_at_dp_1_is_named() -> None:
    """`hosts: [1, 3]` at 4 stages and DP 1: no link joins them, and no rank swap can move
    one there; the run changed nothing, with nothing said. The first and last stages' pair
    carries megatron's tied embedding; at DP 2 a swap may put a link on any pair."""
    rows = """
- {start_iteration: 0, hosts: [1, 3], delay_ms: 30}
- {start_iteration: 0, hosts: [0, 3], delay_ms: 30}
- {start_iteration: 0, hosts: [2, 3], bandwidth_gbps: 1}
- {start_iteration: 0, hosts: [0, 2], bandwidth_gbps: 1}
"""
    shape = {"stages": 4, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1, "message_bytes": 8}
    assert idle_fault_rows_warning(Profile.from_dict(shape), parse_yaml(rows), tied=True) == (
        "warning: fault row 1 (no link joins hosts 1 and 3 at DP 1); row 4 (no link joins "
        "hosts 0 and 2 at DP 1) touch no message with this profile"
    )
    # without megatron's tied embedding, nothing joins the first and last stages either
    assert "row 2 (no link joins hosts 0 and 3 at DP 1)" in str(
        idle_fault_rows_warning(Profile.from_dict(shape), parse_yaml(rows))
    )
    assert idle_fault_rows_warning(Profile.from_dict({**shape, "dp": 2}), parse_yaml(rows)) is None


def test_rows_a_later_row_replaces_are_named_in_a_warning() -> None:
    """Two delay rows nested on link 0-1 gave 0, 30, 10, 0 ms: the outer one did not come
    back after the inner one's end, and the paper's trace with two delays for one link in
    one iteration ran the second alone, with nothing said."""
    profile = Profile.uniform(3, 4, 1, 1, 1)
    nested = parse_yaml(
        """
- {start_iteration: 1, end_iteration: 4, links: ["0-1"], delay_ms: 30}
- {start_iteration: 2, end_iteration: 3, links: ["0-1"], delay_ms: 10}
"""
    )
    assert replaced_rows_warning(profile, nested) == (
        "warning: fault row 2 replaces row 1 from iteration 2, and row 1 does not come back "
        "when row 2 ends at iteration 3 (repeat row 1 from there) (one effect of a kind holds "
        "on a link or NIC at a time)"
    )
    assert replaced_rows_warning(profile, parse_trace("1;1_2;0.03\n1;1_2;0.01\n", 0)) == (
        "warning: fault row 2 replaces row 1 as both start: row 1 never applies (one effect "
        "of a kind holds on a link or NIC at a time)"
    )
    assert replaced_rows_warning(profile, parse_trace("1;1_2;0.03\n2;1_2;0.01\n", 0)) is None
    # row 1 still applies on 0-1, where row 2 is not: named where it does not
    partial = parse_trace("1;0_1,1_2;0.01\n1;1_2;0.03\n", 0)
    assert replaced_rows_warning(profile, partial) == (
        "warning: fault row 2 replaces row 1 as both start: row 1 never applies on hosts 1-2 "
        "(one effect of a kind holds on a link or NIC at a time)"
    )


def test_a_runtime_run_of_more_processes_than_a_host_takes_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 512-stage profile started 519 processes (6.8 GB here) and would have waited up to 2
    hours for them; 2 stages with the paper's delegate rule at 1,000 delegates a link
    direction and side, 4,000 delegate processes. Counted: a worker per position, and
    delegated, the delegates at both ends of every PP and DP ring link direction."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)  # the limit: max(512, 16 a core)
    many = Profile.from_dict(
        {"stages": 2, "microbatches": 2048, "t_f": 1, "t_b": 1, "t_w": 1, "delay_ms": [1000]}
    )
    assert many.delegate_count() == 1000
    with pytest.raises(ConfigError) as refused:
        check_processes(many, delegated=True)
    assert str(refused.value) == (
        "this run would start 2 worker(s) and 4000 delegate process(es), more than the 512 one "
        "host takes here: fewer stages or replicas, or fewer delegates (a profile's "
        "num_delegates)"
    )
    check_processes(many, delegated=False)  # 2 workers
    # 4 stages x DP 2, 12 delegates: 8 workers, (3 x 2 PP links x 2 ways + 4 rings x 2
    # replicas) x 2 ends x 12
    fig18 = Profile.uniform(4, 16, 1, 1, 1, num_replicas=2, num_delegates=12)
    check_processes(fig18, delegated=True)  # 8 + 480 = 488
    with pytest.raises(ConfigError, match="8 worker\\(s\\) and 520 delegate"):
        check_processes(
            Profile.uniform(4, 16, 1, 1, 1, num_replicas=2, num_delegates=13), delegated=True
        )
    # DP 4: a ring sends one way round (each replica to the next), so 4 directions a stage
    # (counted both ways of 4 links, 672 delegates, it refused 496 processes)
    dp4 = Profile.uniform(4, 16, 1, 1, 1, num_replicas=4, num_delegates=6)
    check_processes(dp4, delegated=True)  # 16 + 2 x (24 + 16) x 6 = 496
    # megatron's tied embedding: both ways between each replica's first and last stage
    tied = Profile.uniform(2, 256, 1, 1, 1, num_delegates=127)
    check_processes(tied, delegated=True)  # 2 + 2 x 2 x 127 = 510
    with pytest.raises(ConfigError, match="2 worker\\(s\\) and 1016 delegate"):
        check_processes(tied, delegated=True, tied=True)
    with pytest.raises(ConfigError, match="1024 worker\\(s\\) and 0 delegate"):
        check_processes(Profile.uniform(512, 512, 1, 1, 1, num_replicas=2), delegated=False)


def test_a_worker_s_or_its_pool_s_error_counts_iterations_as_the_results_do() -> None:
    """The engine counts warm-ups: a worker killed in the warm-up read "iteration 0", as
    the first measured one reads in the results; one in the third measured "iteration 3".
    Both the worker's report and the pool's own words are counted from the first measured
    iteration now, the type and the report kept, the original the cause."""
    from harness.runner import _worker_errors_named
    from pipeline.runtime.remote_error import WorkerCrash, WorkerTimeout

    def failing(err: Exception) -> object:
        def run(engine: object) -> object:
            raise err

        return run

    killed = WorkerCrash("rank 1 (stage 1) exited with code -9 during iteration 0", rank=1)
    with pytest.raises(WorkerCrash) as raised:
        _worker_errors_named(failing(killed), 1, 0.0)(None)  # type: ignore[arg-type]
    assert str(raised.value) == "rank 1 (stage 1) exited with code -9 during warm-up iteration 0"
    assert raised.value.__cause__ is killed and raised.value.rank == 1
    late = WorkerTimeout("rank 0 (stage 0), iteration 3, op B0: TimeoutError: nothing came")
    with pytest.raises(WorkerTimeout) as raised:
        _worker_errors_named(failing(late), 1, 20.0)(None)  # type: ignore[arg-type]
    assert str(raised.value).startswith(
        "rank 0 (stage 0), iteration 2, op B0: TimeoutError: nothing came; this run holds a "
        "message up to 20 ms"
    )
    untouched = WorkerCrash("rank 0 (stage 0) could not start: ValueError: boom")
    with pytest.raises(WorkerCrash) as raised:
        _worker_errors_named(failing(untouched), 1, 20.0)(None)  # type: ignore[arg-type]
    assert raised.value is untouched


def test_a_run_with_a_calibration_of_another_shape_is_warned() -> None:
    """`run`, `simulate` and a spec's configurations each warn where the calibration's
    stages or op length are not the run's (its median forward)."""
    from harness.runner import run_warnings
    from pipeline.faults import NO_FAULTS
    from pipeline.host_costs import FREE, HostCosts

    costs = HostCosts(op_ms=10.0, num_stages=4)
    profile = Profile.uniform(4, 8, 2, 1, 1)  # forwards of 2 ms, not 10
    warnings = run_warnings(None, profile, NO_FAULTS, num_warmup_iterations=0, backend="sim")
    assert warnings == []  # no calibration
    warned = run_warnings(
        None, profile, NO_FAULTS, num_warmup_iterations=0, backend="sim", host=costs
    )
    assert warned == [
        "warning: the calibration ran 4 stages with 10 ms ops, this run 4 with 2 ms forwards: "
        "its costs predict runs of its own shape (calibrate --stages 4 --op-ms 2)"
    ]
    same = Profile.uniform(4, 8, 10, 5, 5)
    assert (
        run_warnings(None, same, NO_FAULTS, num_warmup_iterations=0, backend="sim", host=costs)
        == []
    )
    assert FREE.shape_warning(4, 2.0) is None


def test_a_testbed_run_whose_delayed_pairs_take_the_wire_is_warned_of_its_rate() -> None:
    """Without kernel netem a delayed host pair's traffic goes through the userspace wire,
    about 2 Gbit/s (under 1 on a loaded host): caps of 2, 5 and 10 Gbit/s gave 0.78-0.94, and
    4 MiB messages with 5 ms ran 330-430 ms iterations against the simulator's 192, with
    nothing said (the net review)."""
    wire = PerLinkPath(False, "userspace delay wire (no sch_netem)", "no sch_netem")
    delayed = Profile.uniform(2, 4, 10, 10, 10, message_bytes=4 << 20).with_delays([5.0], {})
    assert wire_rate_warning(delayed, NO_FAULTS, wire) == (
        "warning: the testbed's delayed host pairs go through its userspace wire (no "
        "sch_netem), which carries about 2 Gbit/s (under 1 on a loaded host): "
        "a 4 MiB message across one takes about 16.8 ms there besides the delay, so those "
        "iterations run slower than the simulator's of the same profile (a host with kernel "
        "netem carries them at its links' rate)"
    )
    rated = dataclasses.replace(delayed, link_bandwidth_gbps=100.0)
    assert "besides the delay (at the profile's 100 Gbit/s: 0.336 ms)," in str(
        wire_rate_warning(rated, NO_FAULTS, wire)
    )
    # kernel netem carries them; no delay, no wire; a rate the wire keeps up with; 64 KiB
    assert wire_rate_warning(delayed, NO_FAULTS, PerLinkPath(True, "kernel netem")) is None
    assert wire_rate_warning(dataclasses.replace(delayed, delay_ms=(0.0,)), NO_FAULTS, wire) is None
    slow = dataclasses.replace(delayed, link_bandwidth_gbps=1.0)
    assert wire_rate_warning(slow, NO_FAULTS, wire) is None
    small = dataclasses.replace(delayed, message_bytes=64 << 10)
    assert wire_rate_warning(small, NO_FAULTS, wire) is None
    # a fault timeline's delay row sends its pair through the wire too
    healthy = dataclasses.replace(delayed, delay_ms=(0.0,))
    timeline = parse_yaml("- {start_iteration: 2, links: ['0-1'], delay_ms: 30}")
    assert wire_rate_warning(healthy, timeline, wire) is not None


def test_a_testbed_run_whose_capped_pairs_take_the_wire_is_warned_of_its_rate() -> None:
    """A cap row puts its pair on the userspace wire as a delay row does (harness.network:
    every effect on a pair is a wire state): 4 MiB messages under a 50 Gbit/s cap ran
    332-340 ms iterations against the simulator's 152.7, with nothing said (2026-12-07). A
    cap at or below the wire's rate sets the messages' time itself, as in the simulator."""
    wire = PerLinkPath(False, "userspace delay wire (no sch_netem)", "no sch_netem")
    healthy = Profile.uniform(2, 4, 10, 10, 10, message_bytes=4 << 20)
    capped = parse_yaml("- {start_iteration: 2, links: ['0-1'], bandwidth_gbps: 50}")
    assert "a 4 MiB message across one takes about 16.8 ms" in str(
        wire_rate_warning(healthy, capped, wire)
    )
    slow_cap = parse_yaml("- {start_iteration: 2, links: ['0-1'], bandwidth_gbps: 1}")
    assert wire_rate_warning(healthy, slow_cap, wire) is None


def test_a_runtime_warns_of_the_profile_s_link_terms_it_does_not_impose() -> None:
    """The lead's profile (20 ms, 64 KiB at 0.1 Gbit/s) through the fault hook ran 258.4 ms
    against the simulator's 276.2: the hook imposes no bandwidth, and said nothing of it. The
    testbed imposes the bandwidth but no latency; the simulator every term."""
    from harness.runner import run_warnings, unimposed_link_terms_warning
    from pipeline.faults import NO_FAULTS

    profile = Profile.uniform(
        2, 4, 10, 10, 10, message_bytes=65536, link_bandwidth_gbps=0.1, delay_ms=[20.0],
        link_latency_ms=0.5,
    )  # fmt: skip
    hook = unimposed_link_terms_warning(profile, "emulated", "hook")
    assert hook == (
        "warning: --backend emulated --inject hook does not impose the profile's "
        "link_latency_ms 0.5, link_bandwidth_gbps 0.1: its messages take what this host's "
        "transport takes, which the simulator does not (compare it with a profile without "
        "them)"
    )
    network = unimposed_link_terms_warning(profile, "emulated", "network")
    assert network is not None and "link_latency_ms 0.5:" in network
    assert unimposed_link_terms_warning(profile, "sim", "hook") is None
    plain = Profile.uniform(2, 4, 10, 10, 10, message_bytes=65536, delay_ms=[20.0])
    assert unimposed_link_terms_warning(plain, "megatron", "hook") is None
    warned = run_warnings(None, profile, NO_FAULTS, num_warmup_iterations=0, backend="emulated")
    assert warned == [hook]
