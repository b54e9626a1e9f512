"""probes/collect.py: a probe that never returns, or that raises, costs its own findings and nothing else."""

from __future__ import annotations

import signal
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


def test_where_reads_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # It is asked of a thread stuck in the filesystem: it must not stat or read a source file itself.
    from sandbox_conformance.processes.children import Background

    release = threading.Event()
    task = Background(lambda: release.wait(30), name="sbxc-test-where")
    try:
        time.sleep(0.1)

        def no_file(*args: object, **kw: object) -> None:
            raise AssertionError(f"a file was touched: {args}")

        monkeypatch.setattr("os.stat", no_file)
        monkeypatch.setattr("builtins.open", no_file)
        where = task.where(depth=5)
    finally:
        monkeypatch.undo()
        release.set()
        task.join()
    assert where and "wait" in where[0], where
    assert any("<lambda>" in w for w in where), where


def test_what_a_probe_starts_cannot_hold_the_exit_either() -> None:
    # The ladder starts its trials on threads of its own: they take the probe thread's daemon status
    # (threading.Thread's rule for daemon=None), or the interpreter would join them at exit.
    program = textwrap.dedent("""
        import threading, time
        from sandbox_conformance.processes.children import Background
        inner = []
        outer = Background(lambda: inner.append(Background(lambda: threading.Event().wait())) or
                           threading.Event().wait(), daemon=True)
        while not inner:
            time.sleep(0.01)
        print(inner[0]._thread.daemon)
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert time.monotonic() - started < 20


def test_a_stop_while_waiting_lets_each_probe_finish_its_clean_up(tmp_path: Path) -> None:
    # ^C while collect() waits: the probes' threads are daemons, so without a wait their `finally`
    # (a scratch directory removed, a pause process killed) would be dropped at exit.
    marker = tmp_path / "cleaned"
    program = textwrap.dedent(f"""
        import sys, time, types
        from sandbox_conformance.probes import collect as c
        from sandbox_conformance.probes.finding import Finding, Verdict
        from sandbox_conformance.probes.host import Host
        def slow(host):
            try:
                time.sleep(1.5)
                return [Finding("slow", Verdict.supported, "done")]
            finally:
                open({str(marker)!r}, "w").close()
        mod = types.ModuleType("sbxc_fake_slow")
        mod.probe = slow
        sys.modules[mod.__name__] = mod
        c.MODULES, c.PROBE_IDS, c.LAUNCHES_FIRST = {{mod.__name__: ("slow",)}}, ("slow",), ()
        print("ready", flush=True)
        try:
            c.collect(Host())
        except KeyboardInterrupt:
            sys.exit(130)
    """)
    proc = subprocess.Popen([sys.executable, "-c", program], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.wait()
    assert marker.exists()
