"""The witness suite: each witness asserts what a LIVE task observed from inside the sandbox (never the
argv), one module per group of promise families. The modules' names do not start with `test_`: they
are the product, not this project's own tests (tests/ holds those).

Every test is marked `witness(family)`; a family the profile does not promise is deselected by the
plugin. Path witnesses are parametrised by the profile's path templates ("{state}/db"), so node ids
are stable from run to run while the temp paths behind them are fresh. One launch serves them all
(`sbxc_task` is session-scoped). A launch that fails is a harness ERROR in every witness, never a
pass; a broken promise is a plain assertion FAILURE naming what the task saw.

Nothing is imported here: `witness` collects the modules by path, and the plugin and the command
read MODULES and DIR alone."""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).parent
# In the order they run, which is the order of the report: its rows keep each family where it first
# appears (conformance/render.py grouped), and so does docs/matrix.md. Shared helpers: _common.py.
MODULES = ("paths.py", "network.py", "nesting.py", "isolation.py", "environment.py", "host_view.py",
           "lifecycle.py", "reach.py", "limits.py")
PATHS = tuple(DIR / m for m in MODULES)


def names_the_suite(arg: str, cwd: Path) -> bool:
    """A command-line argument that names the suite: its directory, one of its modules, or a test in
    one (`.../witnesses/reach.py::test_x`)."""
    path = Path(arg.split("::", 1)[0])
    try:
        path = (cwd / path).resolve()
    except OSError:
        return False
    return path == DIR.resolve() or path.parent == DIR.resolve()
