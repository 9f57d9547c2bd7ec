"""The layers (README, "Layout"): imports point down, `harness` -> `adaptra`/`baselines`/
`injectors` -> `pipeline`, and the middle three do not import each other. Every import of
the project's packages counts, also one inside a function or under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "adaptra", "baselines", "injectors", "harness")
ALLOWED = {
    "pipeline": {"pipeline"},
    "adaptra": {"adaptra", "pipeline"},
    "baselines": {"baselines", "pipeline"},
    "injectors": {"injectors", "pipeline"},
    "harness": set(PACKAGES),
}


def _imported_packages(source: Path) -> set[str]:
    """The project's top-level packages `source` imports, wherever in it."""
    found = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in PACKAGES)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_only_itself_and_the_layers_below(package: str) -> None:
    sources = sorted((ROOT / package).rglob("*.py"))
    assert sources  # the package is where the test looks
    wrong = {
        str(source.relative_to(ROOT)): sorted(_imported_packages(source) - ALLOWED[package])
        for source in sources
    }
    assert {source: names for source, names in wrong.items() if names} == {}


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text("def f():\n    from baselines.falcon import x\n    import harness.cli\n")
    assert _imported_packages(source) == {"baselines", "harness"}
