"""pipeline.torch_csv: exact round trip, strict import, and runs on torch's pipeline runtime."""

from __future__ import annotations

import csv
import io
import multiprocessing
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    _Action,
    _PipelineScheduleRuntime,
    _validate_schedule,
)

from baselines import one_f_one_b, zb_h1
from pipeline.errors import ScheduleError
from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule, validate_schedule
from pipeline.torch_csv import from_torch_csv, to_torch_csv

Builder = Callable[[Profile], Schedule]
BUILDERS: dict[str, Builder] = {"1f1b": one_f_one_b, "zb-h1": zb_h1}
SHAPES = [(2, 4), (4, 8)]
TORCH_KIND = {"F": OpKind.F, "I": OpKind.B, "W": OpKind.W, "B": OpKind.BW}


def build(name: str, num_stages: int, num_microbatches: int) -> Schedule:
    profile = Profile(
        num_stages=num_stages, num_microbatches=num_microbatches, t_f_ms=1, t_b_ms=1, t_w_ms=1
    )
    return BUILDERS[name](profile)


# --- export, round trip, and torch's own parser -------------------------------------------


@pytest.mark.parametrize(("num_stages", "num_microbatches"), SHAPES)
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_round_trip_is_exact(name: str, num_stages: int, num_microbatches: int) -> None:
    schedule = build(name, num_stages, num_microbatches)
    text = to_torch_csv(schedule)
    assert from_torch_csv(text) == schedule
    assert to_torch_csv(from_torch_csv(text)) == text
    validate_schedule(from_torch_csv(text), num_stages, num_microbatches)


any_op = st.builds(Op, st.sampled_from(list(OpKind)), st.integers(min_value=0, max_value=10**6))


@given(st.lists(st.lists(any_op, max_size=12).map(tuple), max_size=6).map(tuple))
def test_round_trip_is_exact_for_any_op_lists(stages: tuple[tuple[Op, ...], ...]) -> None:
    schedule = Schedule(stages)
    assert from_torch_csv(to_torch_csv(schedule)) == schedule


def test_export_text_for_1f1b() -> None:
    assert to_torch_csv(build("1f1b", 2, 4)) == (
        "0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"
    )


def test_export_text_for_zb_h1_uses_i_and_w() -> None:
    first, second = to_torch_csv(build("zb-h1", 2, 4)).splitlines()
    assert first == "0F0,0F1,0I0,0W0,0F2,0I1,0W1,0F3,0I2,0W2,0I3,0W3"
    assert second.startswith("1F0,1I0,1F1,1I1,1W0,")


@pytest.mark.parametrize(("num_stages", "num_microbatches"), SHAPES)
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_torch_reads_the_export(name: str, num_stages: int, num_microbatches: int) -> None:
    """Parse with the csv module and `_Action.from_str` as `_load_csv` does, then validate."""
    schedule = build(name, num_stages, num_microbatches)
    rows = list(csv.reader(io.StringIO(to_torch_csv(schedule), newline="")))
    actions = {rank: [_Action.from_str(cell) for cell in row] for rank, row in enumerate(rows)}
    assert len(actions) == num_stages
    for rank, ops in enumerate(schedule.stages):
        parsed = actions[rank]
        assert [str(action) for action in parsed] == rows[rank]
        assert [
            Op(TORCH_KIND[action.computation_type.value], action.microbatch_index)
            for action in parsed
        ] == list(ops)
        assert {action.stage_index for action in parsed} == {rank}
    mapping = _validate_schedule(actions, num_stages, num_stages, num_microbatches)
    assert mapping == {stage: stage for stage in range(num_stages)}


def test_import_reads_torch_dump_with_crlf_and_idle_steps() -> None:
    """torch's `_dump_csv` ends rows in CRLF and writes None (an idle step) as an empty cell."""
    order = {
        0: [_Action.from_str("0F0"), None, _Action.from_str("0B0")],
        1: [None, _Action.from_str("1F0"), _Action.from_str("1B0")],
    }
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    for rank in order:
        writer.writerow(order[rank])
    text = buffer.getvalue()
    assert text == "0F0,,0B0\r\n,1F0,1B0\r\n"
    assert from_torch_csv(text) == Schedule.from_text([["F0", "BW0"], ["F0", "BW0"]])


def test_import_accepts_what_torch_accepts_around_actions() -> None:
    assert from_torch_csv(' 0F0 ,"0I0",0W0\n') == Schedule.from_text([["F0", "B0", "W0"]])


def test_empty_schedule_and_empty_stage_round_trip() -> None:
    for schedule in (Schedule(()), Schedule(((), (Op(OpKind.F, 0),)))):
        assert from_torch_csv(to_torch_csv(schedule)) == schedule


# --- strict import ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "row", "action"),
    [
        ("0F0,0X1\n", 0, "0X1"),
        ("0F0\n1F0,1F\n", 1, "1F"),
        ("F0\n", 0, "F0"),
        ("0BW0\n", 0, "0BW0"),
        ("0F0x\n", 0, "0F0x"),
        ("0F-1\n", 0, "0F-1"),
        ("0F0 0F1\n", 0, "0F0 0F1"),
        ("0f0\n", 0, "0f0"),
        ("0F\u0663\n", 0, "0F\u0663"),
        ("0F0\n1F0,1I0,1W0,0B0\n", 1, "0B0"),
        ("1F0\n", 0, "1F0"),
        ("0F0,0SEND_F0\n", 0, "0SEND_F0"),
        ("0UNSHARD\n", 0, "0UNSHARD"),
        ("(0F1;0B0)OVERLAP_F_B\n", 0, "(0F1;0B0)OVERLAP_F_B"),
    ],
)
def test_import_rejects_bad_actions(text: str, row: int, action: str) -> None:
    with pytest.raises(ScheduleError) as info:
        from_torch_csv(text)
    message = str(info.value)
    assert f"line {row + 1} (rank {row}), " in message  # lines as an editor counts them
    assert repr(action) in message


def test_import_names_the_stage_and_rank_on_a_mismatch() -> None:
    with pytest.raises(ScheduleError, match=re.escape("names stage 0, but rank 1")):
        from_torch_csv("0F0,0B0\n0F0,0B0\n")


def test_import_explains_non_compute_actions() -> None:
    with pytest.raises(ScheduleError, match="only the compute actions"):
        from_torch_csv("0RECV_F0\n")


@pytest.mark.parametrize("value", [b"0F0\n", None, ["0F0"]])
def test_import_rejects_non_text(value: object) -> None:
    with pytest.raises(ScheduleError, match="must be text"):
        from_torch_csv(value)  # type: ignore[arg-type]


# --- interop: run the export on torch's _PipelineScheduleRuntime, 2 gloo processes --------

NUM_STAGES = 2
NUM_MICROBATCHES = 4
RUN_TIMEOUT_S = 60.0


def make_model() -> nn.Sequential:
    """Stage 0 is a linear layer (+ tanh), stage 1 a linear layer; fixed seed."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 3))


def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(2 * NUM_MICROBATCHES, 4, generator=generator)
    targets = torch.randn(2 * NUM_MICROBATCHES, 3, generator=generator)
    return inputs, targets


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def run_stage(rank: int, store: str, csv_path: str, out_dir: str) -> None:
    """Child process: run stage `rank` of the CSV schedule and save its grads and losses."""
    out = Path(out_dir)
    try:
        torch.set_num_threads(1)
        if sys.platform == "linux":  # gloo over loopback only, whatever the hostname resolves to
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=NUM_STAGES,
            timeout=timedelta(seconds=RUN_TIMEOUT_S / 2),
        )
        try:
            module = make_model()[rank]
            stage = PipelineStage(module, rank, NUM_STAGES, torch.device("cpu"))
            runtime = _PipelineScheduleRuntime([stage], NUM_MICROBATCHES, loss_fn=loss_fn)
            runtime._load_csv(csv_path)
            inputs, targets = make_batch()
            losses: list[torch.Tensor] = []
            if rank == 0:
                runtime.step(inputs)
            else:
                runtime.step(target=targets, losses=losses)
            grads = {name: param.grad for name, param in module.named_parameters()}
            torch.save({"grads": grads, "losses": losses}, out / f"rank{rank}.pt")
        finally:
            dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise


def run_on_torch(csv_path: Path, work: Path) -> list[dict[str, object]]:
    """Run both ranks in spawned processes; fail on error or timeout, leave no child behind."""
    context = multiprocessing.get_context("spawn")
    store = work / "filestore"
    processes = [
        context.Process(target=run_stage, args=(rank, str(store), str(csv_path), str(work)))
        for rank in range(NUM_STAGES)
    ]
    killed: list[int] = []
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        running = list(processes)
        while running and time.monotonic() < deadline:
            wait([process.sentinel for process in running], deadline - time.monotonic())
            running = [process for process in processes if process.exitcode is None]
            if any(process.exitcode for process in processes):
                break  # a failed rank: the other one may wait on it forever
    finally:
        for rank, process in enumerate(processes):
            if process.is_alive():
                process.kill()
                killed.append(rank)
        for process in processes:
            if process.pid is not None:
                process.join(10)
    errors = sorted(work.glob("rank*.err"))
    if errors:
        pytest.fail("\n".join(path.read_text() for path in errors))
    codes = {rank: process.exitcode for rank, process in enumerate(processes)}
    crashed = {rank: code for rank, code in codes.items() if code and rank not in killed}
    if crashed:
        pytest.fail(f"ranks exited with codes {crashed} and no traceback")
    if killed:
        pytest.fail(f"torch pipeline run did not finish in {RUN_TIMEOUT_S:g} s; killed {killed}")
    return [torch.load(work / f"rank{rank}.pt") for rank in range(NUM_STAGES)]


def reference() -> tuple[list[dict[str, torch.Tensor]], list[torch.Tensor]]:
    """Single process: the same microbatches through the full model, grads averaged over them."""
    model = make_model()
    inputs, targets = make_batch()
    pairs = zip(inputs.chunk(NUM_MICROBATCHES), targets.chunk(NUM_MICROBATCHES), strict=True)
    losses = [loss_fn(model(x), y) for x, y in pairs]
    (torch.stack(losses).sum() / NUM_MICROBATCHES).backward()
    grads = [
        {name: param.grad for name, param in model[stage].named_parameters()}
        for stage in range(NUM_STAGES)
    ]
    return grads, [loss.detach() for loss in losses]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_torch_runtime_runs_export_with_reference_grads(name: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    schedule = build(name, NUM_STAGES, NUM_MICROBATCHES)
    csv_path = tmp_path / f"{name}.csv"
    csv_path.write_text(to_torch_csv(schedule))

    results = run_on_torch(csv_path, tmp_path)

    expected_grads, expected_losses = reference()
    for stage in range(NUM_STAGES):
        grads = results[stage]["grads"]
        assert isinstance(grads, dict)
        assert grads.keys() == expected_grads[stage].keys()
        for param_name, expected in expected_grads[stage].items():
            actual = grads[param_name]
            assert actual is not None, f"stage {stage} {param_name} has no grad"
            torch.testing.assert_close(actual, expected, msg=f"stage {stage} {param_name}")
    losses = results[NUM_STAGES - 1]["losses"]
    assert isinstance(losses, list)
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected_losses))


def test_import_refuses_an_action_of_thousands_of_digits() -> None:
    """A torch CSV's cell "0F111..." (or a stage of as many digits) was an internal error
    (ValueError: past Python's limit on reading a whole number)."""
    for cell in ("0F" + "1" * 5000, "1" * 5000 + "F0"):
        with pytest.raises(ScheduleError, match=r"^torch CSV line 1 \(rank 0\), .* is too large"):
            from_torch_csv(cell + "\n")
