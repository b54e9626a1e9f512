"""The witness program's loader (conformance/plan.py program): a task interpreter with our bytecode's
magic number runs the compiled body, any other compiles the shipped source, and a compiled body that
does not load falls back to the source too."""

from __future__ import annotations

import base64
import importlib.util
import json
import marshal
import subprocess
import sys
import zlib

import pytest

from sandbox_conformance.conformance import plan


def _b64(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data)).decode()


def _loader(*, code: bytes, source: str, magic: bytes) -> str:
    return 'PLAN = "{}"\n' + plan._LOADER.format(code=_b64(code), source=_b64(source.encode()),
                                                 magic=base64.b64encode(magic).decode())


def _run(program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", "-"], input=program, capture_output=True, text=True,
                          timeout=60)


COMPILED = marshal.dumps(compile('print("compiled", PLAN)', "<stdin>", "exec"))
SOURCE = 'print("source", PLAN)'


@pytest.mark.parametrize(("code", "magic", "ran"), [
    (COMPILED, importlib.util.MAGIC_NUMBER, "compiled"),
    (COMPILED, b"\x00\x00\r\n", "source"),  # another interpreter's bytecode: never unmarshalled
    (b"\xff not marshal", importlib.util.MAGIC_NUMBER, "source"),  # ours, but it does not load
])
def test_the_loader_runs_the_compiled_body_only_where_its_magic_number_matches(
        code: bytes, magic: bytes, ran: str) -> None:
    done = _run(_loader(code=code, source=SOURCE, magic=magic))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [ran, "{}"]  # and the body sees the plan line's PLAN


def test_the_source_form_gives_the_same_document_as_the_compiled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real program both ways: the fallback is the program an older Python in an image runs."""
    p = plan.Plan(task_id="t", ops=(), tcp=(), unix_abstract=(), nested_userns=False)
    compiled = _run(plan.program(p))
    source = plan.source_of(plan.program(p))
    monkeypatch.setattr(importlib.util, "MAGIC_NUMBER", b"\x00\x00\r\n")
    from_source = _run(plan.with_source(plan.program(p), source))
    docs = []
    for done in (compiled, from_source):
        assert done.returncode == 0, done.stderr
        docs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert docs[0]["complete"] is docs[1]["complete"] is True
    assert sorted(docs[0]) == sorted(docs[1])
    assert source == (plan.resources.files("sandbox_conformance.conformance") / "inside.py").read_text()
