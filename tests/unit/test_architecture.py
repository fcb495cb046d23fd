"""The import rules of docs/architecture.md, read from the source: every import statement of
every module, at its top or inside a function, is checked against what its part may use."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# part -> the parts and libraries it must never import (a prefix matches its submodules)
COMMANDS = ["dtprof.jobs", "dtprof.cli", "dtprof.commands"]
NEVER = {
    "dtprof.trace": ["dtprof.analysis", "dtprof.record", *COMMANDS, "dashboard", "torch", "dash"],
    "dtprof.analysis": ["dtprof.record", *COMMANDS, "dashboard", "torch", "dash", "plotly"],
    "dtprof.record": ["dtprof.analysis", *COMMANDS, "dashboard", "dash", "plotly"],
    "dashboard": ["dtprof.record", *COMMANDS, "torch"],
}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for top in ("dtprof", "dashboard"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def _imports(module: str, path: Path) -> list[str]:
    """Every module an import statement names (relative imports resolved)."""
    names = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


MODULES = _modules()


def test_the_parts_are_all_there() -> None:
    names = {name for name, _ in MODULES}
    assert {"dtprof.trace", "dtprof.analysis", "dtprof.record", "dashboard"} <= names
    assert len(MODULES) > 50


@pytest.mark.parametrize("part", sorted(NEVER))
def test_no_part_imports_what_it_must_not(part: str) -> None:
    broken = [
        f"{module} imports {name}"
        for module, path in MODULES
        if _within(module, part)
        for name in _imports(module, path)
        if any(_within(name, banned) for banned in NEVER[part])
    ]
    assert broken == []


def test_a_check_imports_shared_helpers_never_another_check() -> None:
    broken = [
        f"{module} imports {name}"
        for module, path in MODULES
        if _within(module, "dtprof.analysis.checks") and module != "dtprof.analysis.checks"
        for name in _imports(module, path)
        if _within(name, "dtprof.analysis.checks") and not _within(name, module)
    ]
    assert broken == []


CHECKS_LIST = {f"dtprof.analysis.checks{n}" for n in ("", ".CHECKS", ".Check")}


def test_outside_the_checks_only_their_list_is_imported() -> None:
    """The dashboard and the rest of the analysis run the checks through CHECKS; what a check
    computes that others show lives in a shared analysis module."""
    broken = [
        f"{module} imports {name}"
        for module, path in MODULES
        if not _within(module, "dtprof.analysis.checks")
        for name in _imports(module, path)
        if _within(name, "dtprof.analysis.checks") and name not in CHECKS_LIST
    ]
    assert broken == []


def test_the_rules_see_a_forbidden_import(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text("def f():\n    from ..record import profiler\n    import torch.nn\n")
    names = _imports("dtprof.analysis.x", path)
    assert "dtprof.record.profiler" in names and "torch.nn" in names
