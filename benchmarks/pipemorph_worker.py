"""Child process of bench_scheduler_peers.py: runs one PipeMorph branch's `auto_schedule`.

Run (by the benchmark, never by hand): python -I pipemorph_worker.py TREE

TREE is one extracted branch of github.com/wutianyuan1/PipeMorph. Their code is imported from
TREE/zerobubble (put first on sys.path here); nothing of this repository is imported, and
nothing of theirs is copied. Requests come one JSON object a line on stdin:

    {"id": 3, "stages": 8, "microbatches": 32, "t_f": [...], "t_b": [...], "t_w": [...],
     "delay_links": [[3, 4]], "delay_time": 20.0}

(`delay_time` a number for the branches whose auto_schedule takes one delay for all listed
links, a list with one delay per listed link for extended_experiments). Each answer is one
JSON line on stdout: {"id", "ok": true, "stages": [["F0", ...], ...], "seconds"} with the F, B
and W ops of every stage in their order, or {"id", "ok": false, "status", "error"}. What their
code prints goes to stderr. A call that runs past `timeout_s` (their simulator loops forever
on some inputs) is stopped by SIGALRM and answered with status "timeout".

Two things their module needs outside their Megatron runtime are provided here:
- torch.distributed: their auto_schedule asks for the rank, so a one-process gloo group is
  started (a file store in a temporary folder);
- pulp: their pipeline_simulator.auto_schedule imports it but only calls `pulp.value` on plain
  numbers; where pulp is not installed, a stand-in module whose `value` returns its argument.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
import types
from typing import Any


class _Timeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def _setup(tree: str, scratch: str) -> Any:
    sys.path.insert(0, os.path.join(tree, "zerobubble"))
    try:
        import pulp  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("pulp")
        stand_in.value = lambda x: x  # type: ignore[attr-defined]
        sys.modules["pulp"] = stand_in
    os.environ["OUT_DIR"] = scratch  # where their auto_schedule writes simu.txt
    os.environ.setdefault("MPLBACKEND", "Agg")
    import torch.distributed as dist

    if not dist.is_initialized():
        store = os.path.join(scratch, "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    with contextlib.redirect_stdout(sys.stderr):
        from pipeline_simulator import auto_schedule as module
    return module


def _answer(module: Any, request: dict[str, Any]) -> dict[str, Any]:
    num_stages = int(request["stages"])
    config = module.GraphConfig(
        mem_f=[1000] * num_stages,
        mem_b=[-500] * num_stages,
        mem_w=[-500] * num_stages,
        cost_f=[int(x) for x in request["t_f"]],
        cost_b=[int(x) for x in request["t_b"]],
        cost_w=[int(x) for x in request["t_w"]],
        cost_comm=0,
    )
    links = [tuple(link) for link in request["delay_links"]]
    delay_time = request["delay_time"]
    timeout_s = float(request.get("timeout_s", 10.0))
    start = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = module.auto_schedule(
                num_stages, int(request["microbatches"]), config, links, delay_time
            )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.perf_counter() - start
    stages = [
        [f"{node.type}{node.minibatch}" for node in nodes if node.type in ("F", "B", "W")]
        for nodes in result
    ]
    return {"ok": True, "stages": stages, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("tree", help="one extracted PipeMorph branch (its zerobubble/ inside)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pipemorph-worker-") as scratch:  # then removed
        _serve(args.tree, scratch)


def _serve(tree: str, scratch: str) -> None:
    signal.signal(signal.SIGALRM, _on_alarm)
    out = sys.stdout
    try:
        module = _setup(tree, scratch)
    except Exception as error:
        out.write(json.dumps({"ready": False, "error": repr(error)}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"ready": True, "file": module.__file__}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            answer = _answer(module, request)
        except _Timeout:
            answer = {"ok": False, "status": "timeout", "error": "ran past timeout_s"}
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            answer = {"ok": False, "status": "error", "error": repr(error)}
        answer["id"] = request.get("id")
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
