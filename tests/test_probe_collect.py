"""probes/collect.py: a probe that never returns, or that raises, costs its own findings and nothing else."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from sandbox_conformance.probes import collect as collect_mod
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host

REPO = Path(__file__).resolve().parent.parent


def _fake_modules(monkeypatch: pytest.MonkeyPatch, probes: dict[str, object]) -> None:
    """Stand fake probe modules in for the real ones: name -> probe(host)."""
    modules = {}
    for name, fn in probes.items():
        mod = types.ModuleType(f"sbxc_fake_{name}")
        mod.probe = fn  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        modules[mod.__name__] = (name,)
    monkeypatch.setattr(collect_mod, "MODULES", modules)
    monkeypatch.setattr(collect_mod, "PROBE_IDS", tuple(i for ids in modules.values() for i in ids))
    monkeypatch.setattr(collect_mod, "LAUNCHES_FIRST", ())


def test_a_probe_that_never_returns_is_unknown_at_the_deadline_naming_where_it_stood(
        monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def stat_on_a_dead_server(host: Host) -> list[Finding]:
        release.wait(60)
        return [Finding("stuck", Verdict.supported, "too late")]

    _fake_modules(monkeypatch, {
        "stuck": stat_on_a_dead_server,
        "quick": lambda host: [Finding("quick", Verdict.supported, "answered")],
    })
    monkeypatch.setattr(collect_mod, "DEADLINE", 0.5)
    try:
        started = time.monotonic()
        found = {f.probe: f for f in collect_mod.collect(Host())}
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < 5, took
    assert found["quick"].verdict is Verdict.supported
    stuck = found["stuck"]
    assert stuck.verdict is Verdict.unknown
    assert "did not finish within 0.5 s" in stuck.reason
    assert "stat_on_a_dead_server" in stuck.evidence["where"], stuck.evidence


def test_a_probe_that_raises_is_unknown_with_the_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(host: Host) -> list[Finding]:
        raise OSError(5, "Input/output error")

    _fake_modules(monkeypatch, {"broken": broken,
                                "quick": lambda host: [Finding("quick", Verdict.supported, "answered")]})
    found = {f.probe: f for f in collect_mod.collect(Host())}
    assert found["broken"].verdict is Verdict.unknown
    assert found["broken"].reason.startswith("probe crashed: OSError")
    assert found["quick"].verdict is Verdict.supported


def test_the_process_exits_though_a_probe_is_still_blocked() -> None:
    # The thread left behind must not hold the interpreter at exit (threading joins non-daemon threads
    # in _shutdown): the run reports and ends.
    program = textwrap.dedent("""
        import sys, threading, types
        from sandbox_conformance.probes import collect as c
        from sandbox_conformance.probes.host import Host
        mod = types.ModuleType("sbxc_fake_stuck")
        mod.probe = lambda host: threading.Event().wait()
        sys.modules[mod.__name__] = mod
        c.MODULES, c.PROBE_IDS, c.LAUNCHES_FIRST, c.DEADLINE = {mod.__name__: ("stuck",)}, ("stuck",), (), 0.2
        [f] = c.collect(Host())
        print(f.verdict.value)
    """)
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "unknown"
