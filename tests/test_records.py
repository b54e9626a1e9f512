"""The records on the paths of `probe`, `witness` and `run` are NamedTuples, not dataclasses
(docs/architecture.md, "Records"): on Python 3.11 each frozen dataclass costs ~0.5-1 ms to create at
import, and `dataclasses` pulls in `inspect`. bench/ measures the effect; these tests keep a new
record on those paths from quietly bringing the cost back. Each runs the real command in a fresh
interpreter, so what it sees is what a user's process imports and creates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = ("sandbox_conformance",)

# Runs the command in this interpreter with dataclasses' class processing watched, then prints what
# it saw as the last line on stderr: our classes made into dataclasses, and whether `dataclasses` and
# `inspect` were imported at all. The hook is installed only if something imports dataclasses (a
# meta-path finder that patches it on load), so the probe path's "never imported" stays observable.
_WATCH = r"""
import atexit, importlib.machinery, json, os, sys
made = []
def patch(mod):
    orig = mod._process_class
    def watched(cls, *a, **k):
        made.append(f"{cls.__module__}.{cls.__qualname__}")
        return orig(cls, *a, **k)
    mod._process_class = watched
class Watch:  # a meta path finder needs only find_spec (importlib.abc would import more)
    def find_spec(self, name, path, target=None):
        if name != "dataclasses":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            patch(module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Watch())
def report():
    ours = [c for c in made if c.split(".")[0] in OURS]
    line = json.dumps({"ours": ours, "dataclasses": "dataclasses" in sys.modules,
                       "inspect": "inspect" in sys.modules})
    os.write(2, (line + "\n").encode())
atexit.register(report)
from sandbox_conformance.commands import cli
code = cli.main(sys.argv[1:])
atexit._run_exitfuncs()
os._exit(code)
""".replace("OURS", repr(OURS))


def _watched(*argv: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    done = subprocess.run([sys.executable, "-c", _WATCH, *argv], cwd=REPO, text=True, capture_output=True,
                          timeout=120, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    try:
        seen = json.loads(last)
    except ValueError:
        pytest.fail(f"the watched command printed no report (exit {done.returncode}): {done.stderr[-2000:]}")
    return done, seen


def test_probe_imports_neither_dataclasses_nor_inspect() -> None:
    done, seen = _watched("probe", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["findings"], "the probe ran no probe"
    assert seen == {"ours": [], "dataclasses": False, "inspect": False}, seen


@pytest.mark.integration
def test_a_witness_run_makes_no_dataclass_of_ours(bwrap_path: str) -> None:
    done, seen = _watched("witness")
    # pytest itself imports dataclasses; what counts is that none of ours is made one.
    assert seen["dataclasses"] is True, "the watch saw no dataclasses import: it watched nothing"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert seen["ours"] == [], seen["ours"]


def test_the_watch_sees_a_dataclass_of_ours() -> None:
    """The negative control: a command whose path still makes dataclasses of ours (mr-check's config) is
    seen doing so, so an empty list above means none was made, not that the watch was blind."""
    done, seen = _watched("mr-check", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(c.startswith("sandbox_conformance.mrcheck.") for c in seen["ours"]), seen  # type: ignore[union-attr]


def test_a_copy_with_changes_keeps_the_checks_made_at_creation() -> None:
    """NamedTuple's own `_replace` builds the tuple directly; Finding and Host route it through their
    `__new__`, so a copy cannot carry a two-line reason, a writable evidence dict or no environment."""
    from sandbox_conformance.probes.finding import Finding, Verdict
    from sandbox_conformance.probes.host import Host

    f = Finding("x", Verdict.supported, "one line", {"n": "1"})
    with pytest.raises(ValueError, match="one line"):
        f._replace(reason="two\nlines")
    copy = f._replace(evidence={"n": 2})
    assert dict(copy.evidence) == {"n": "2"}
    with pytest.raises(TypeError):
        copy.evidence["n"] = "3"  # type: ignore[index]
    assert Host(env={"A": "1"})._replace(env=None).env == dict(os.environ)


def test_every_witness_assert_says_what_the_task_saw() -> None:
    """The witness session runs with plain asserts (commands/witness.py, for speed): a failed assert's
    own message is all the verdict's detail and pytest's report have. Only the asserts that narrow a
    type for mypy (`x is not None` on the harness's own values) may go without one."""
    import ast

    bare = [
        f"{path.name} line {n.lineno}: {ast.get_source_segment(src, n)}"
        for path in sorted((REPO / "conformance" / "witnesses").glob("*.py"))
        for src in [path.read_text()]
        for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.Assert) and n.msg is None
        and not (isinstance(n.test, ast.Compare) and isinstance(n.test.ops[0], ast.IsNot)
                 and isinstance(n.test.comparators[0], ast.Constant) and n.test.comparators[0].value is None)
    ]
    assert not bare, "witness asserts without a message: " + "; ".join(bare)
