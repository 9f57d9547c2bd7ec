"""Loads a benchmark script as a module (benchmarks/ is a folder of scripts, not a package),
and what the scripts' tests share."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """benchmarks/<name>.py, imported once (its main() not run)."""
    module_name = f"_bench_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            module_name, ROOT / "benchmarks" / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def record_backwards(monkeypatch: pytest.MonkeyPatch, runner_class: Any) -> list[tuple[str, bool]]:
    """What `runner_class`'s fused and weight backwards find, in the order they run: ("fused"
    or "W", whether any parameter already had a gradient)."""
    fused, weight = runner_class.backward_fused, runner_class.backward_weight
    seen: list[tuple[str, bool]] = []

    def had_grads(runner: Any) -> bool:
        return any(p.grad is not None for p in runner.params)

    def backward_fused(runner: Any, *args: Any) -> Any:
        seen.append(("fused", had_grads(runner)))
        return fused(runner, *args)

    def backward_weight(runner: Any, *args: Any) -> None:
        seen.append(("W", had_grads(runner)))
        weight(runner, *args)

    monkeypatch.setattr(runner_class, "backward_fused", backward_fused)
    monkeypatch.setattr(runner_class, "backward_weight", backward_weight)
    return seen
