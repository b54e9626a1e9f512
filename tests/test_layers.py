"""The packages are layers, and imports go one way (docs/architecture.md): kernel ← processes ←
probes ← conformance ← runners ← mrcheck ← commands, all under the one installed name
`sandbox_conformance` (issue 30): an import of a bare `probes` or `commands` would be a user's own.
A module may import its own layer and the ones below, never above,
not even lazily inside a function; the programs that run inside a sandbox or a guest import nothing
of ours at all (they run under `python3 -I -S`, with only the stdlib)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NAME = "sandbox_conformance"
LAYERS = ("kernel", "processes", "probes", "conformance", "runners", "mrcheck", "commands")
# Copied into a sandbox, a container or a guest and run there alone (each says so in its docstring).
STANDALONE = ("probes/_inside_ladder.py", "processes/guardian.py", "conformance/inside.py",
              "runners/vm/stage2.py")


def ours_imported(path: Path) -> list[tuple[int, str]]:
    """(line, layer) for every import of one of our packages, at any depth of the file; a layer
    imported by its bare name (not under NAME) is reported as `bare:LAYER`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for n in names:
            parts = n.split(".")
            if parts[0] == NAME and len(parts) == 1 and isinstance(node, ast.ImportFrom):
                found += [(node.lineno, a.name) for a in node.names if a.name in LAYERS]
            elif parts[0] == NAME and len(parts) > 1 and parts[1] in LAYERS:
                found.append((node.lineno, parts[1]))
            elif parts[0] in LAYERS:
                found.append((node.lineno, f"bare:{parts[0]}"))
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
    bad.write_text("def f():\n    from sandbox_conformance.commands import cli\n"
                   "    import sandbox_conformance.runners.decide\n"
                   "    from sandbox_conformance import mrcheck\n    import probes.host\n")
    assert ours_imported(bad) == [(2, "commands"), (3, "runners"), (4, "mrcheck"), (5, "bare:probes")]


def test_every_package_is_a_layer() -> None:
    """A new top-level package must take its place in LAYERS (and in docs/architecture.md)."""
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages == {*LAYERS, NAME}


def test_the_installed_name_holds_every_layer_and_nothing_else() -> None:
    """sandbox_conformance/ is the one name installed: a relative symlink to each layer's folder, and
    its own __init__ and __main__ (pyproject.toml's find includes only it)."""
    here = REPO / NAME
    links = {p.name: os.readlink(p) for p in here.iterdir() if p.is_symlink()}
    assert links == {layer: f"../{layer}" for layer in LAYERS}
    assert {p.name for p in here.iterdir() if not p.is_symlink()} - {"__pycache__"} == {"__init__.py",
                                                                                       "__main__.py"}


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, at any depth of the file (a lazy import counts):
    `from P import m`, where P.m is a module, is an edge to P.m alone."""
    mods = {}
    for layer in LAYERS:
        for p in (REPO / layer).rglob("*.py"):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p

    def ours(name: str) -> str | None:
        name = name[len(NAME) + 1:] if name.startswith(NAME + ".") else ""
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {m for a in node.names if (m := ours(a.name))}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = {ours(f"{node.module}.{a.name}") for a in node.names}
                whole = {f"{node.module}.{a.name}"[len(NAME) + 1:] for a in node.names}
                edges |= {m for m in subs if m in whole}
                if not whole <= set(mods) and (m := ours(node.module)):
                    edges.add(m)
        graph[mod] = edges - {mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_module_of_ours_imports_its_way_back_to_itself() -> None:
    """No import circle, lazy imports included (issue 30: processes/children.py and cancel.py
    imported each other, and the adapters their own registry)."""
    assert _cycles(_import_graph()) == []


def test_the_circle_check_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# A layer named bare in code we run from a string or a script (a `python -c` snippet, scripts/): the
# AST check above cannot see it, and from the checkout's cwd it would still import, the old way.
_BARE = re.compile(r"(?:^|[^.\w])(?:from|import) (?:" + "|".join(LAYERS) + r")(?:\.\w+)* import |"
                   r"(?:^|;|\"|')\s*import (?:" + "|".join(LAYERS) + r")\b")
_MEANT = {"tests/test_install.py", "tests/test_layers.py"}  # a user's own packages; the checker's


def test_no_snippet_or_script_imports_a_layer_by_its_bare_name() -> None:
    texts = [p for d in ("scripts", "tests", "bench", "fleet", *LAYERS) for p in (REPO / d).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix in ("", ".py", ".sh")]
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in texts
             if str(p.relative_to(REPO)) not in _MEANT
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if any(_BARE.search(part) for part in line.replace("\\n", "\n").split("\n"))]
    assert not found, "\n".join(found)
