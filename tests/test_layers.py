"""The packages are layers, and imports go one way (docs/architecture.md): probes ← conformance ←
runners ← mrcheck ← commands. A module may import its own layer and the ones below, never above,
not even lazily inside a function; the programs that run inside a sandbox or a guest import nothing
of ours at all (they run under `python3 -I -S`, with only the stdlib)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("probes", "conformance", "runners", "mrcheck", "commands")
# Copied into a sandbox, a container or a guest and run there alone (each says so in its docstring).
STANDALONE = ("probes/_inside_ladder.py", "probes/guardian.py", "conformance/inside.py",
              "runners/vm/stage2.py")


def ours_imported(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) for every import of one of our packages, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, n.split(".")[0]) for n in names if n.split(".")[0] in LAYERS]
    return found


def modules(layer: str) -> list[Path]:
    return sorted((REPO / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_itself_and_the_layers_below(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    upward = [f"{p.relative_to(REPO)}:{line} imports {pkg}"
              for p in modules(layer) for line, pkg in ours_imported(p) if pkg not in allowed]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("program", STANDALONE)
def test_the_programs_run_alone_import_nothing_of_ours(program: str) -> None:
    assert ours_imported(REPO / program) == []


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The check above can fail: a lazy import of a higher layer inside a function is found."""
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from commands import cli\n    import runners.decide\n")
    assert ours_imported(bad) == [(2, "commands"), (3, "runners")]


def test_every_package_is_a_layer() -> None:
    """A new top-level package must take its place in LAYERS (and in docs/architecture.md)."""
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages == set(LAYERS)
