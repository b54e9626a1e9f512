"""A cancelled run leaves nothing behind (docs/cancellation.md).

Per mode, the top process is signalled mid-run (a task, container or VM demonstrably running):
- SIGTERM (and SIGINT, SIGHUP): exit 128+N, the verdict line `KILLED-<SIG>` last on stderr, no
  traceback; no process of the run alive after a bounded wait; no layout, bundle, scratch directory,
  container or cgroup of the run left;
- SIGKILL: no process of the run alive after a bounded wait (parent-death signals and the guardian);
  what it left on disk is removed by the next run, which names it on stderr.
"No process of the run" is judged by tests/cancel_reaper.py, a subreaper the run is started under:
every orphan of the run becomes its child, whatever the harness says about itself. A container's
processes are the engine's children, so the engine is asked about those.

Unit parts first (stamps, the sweep, the guardian), then the modes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox_conformance.processes import cancel, guardian, owner
from sandbox_conformance.processes.owner import Stamp

if TYPE_CHECKING:
    from docker_tier import DockerTier

pytest_plugins = ["docker_tier"]

REPO = Path(__file__).resolve().parent.parent
REAPER = Path(__file__).with_name("cancel_reaper.py")
GUARDIAN = REPO / "processes" / "guardian.py"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LINGER = 30.0  # the bounded wait for the run's processes to go
KILLED = re.compile(r"^sandbox-conformance: KILLED-(SIG[A-Z]+) mode=(\S+) exit=(\d+) time=\d+\.\d+s$")


def _dead_stamp() -> Stamp:
    """A stamp of this boot and pid namespace whose process is gone: our pid, another start time."""
    me = owner.mine()
    return Stamp(me.pid, me.start - 1, me.host)


# ---------------------------------------------------------------- stamps and the sweep


def test_a_stamp_names_this_process_and_reads_back_from_a_name() -> None:
    me = owner.mine()
    assert me.pid == os.getpid() and me.start == owner.start_time(os.getpid())
    assert owner.find(f"sbxc-witness-{me}-abc123") == me
    assert owner.find("sbxc-witness-abc123") is None
    assert not owner.gone(me)
    assert owner.gone(_dead_stamp())


def test_a_stamp_from_another_boot_or_pid_namespace_is_never_judged_gone() -> None:
    # A VM guest sees its host's /var/tmp over 9p: that owner's pid means nothing in the guest.
    foreign = Stamp(999_999, 1, "0" * 8 if owner.mine().host != "0" * 8 else "1" * 8)
    assert not owner.gone(foreign)


def test_the_sweep_removes_a_dead_runs_directories_and_nothing_else(tmp_path: Path) -> None:
    dead, me = _dead_stamp(), owner.mine()
    foreign = Stamp(dead.pid, dead.start, "f" * 8 if me.host != "f" * 8 else "e" * 8)
    made = {
        "dead": tmp_path / f"sbxc-witness-{dead}-aaaa",
        "dead_oci": tmp_path / f"sbxc-oci-{dead}-task-1-bbbb",
        "live": tmp_path / f"sbxc-witness-{me}-cccc",
        "foreign": tmp_path / f"sbxc-vm.{foreign}.dddd",
        "unstamped": tmp_path / "sbxc-witness-eeee",
        "not_ours": tmp_path / f"other-{dead}",
    }
    for d in made.values():
        (d / "state" / "ro").mkdir(parents=True)
        (d / "state" / "ro" / "f").write_text("x")
    (made["dead"] / "state" / "ro").chmod(0o555)  # a task may leave read-only directories
    swept = owner.sweep(dirs=[str(tmp_path)])
    assert sorted(s.path for s in swept) == sorted([str(made["dead"]), str(made["dead_oci"])])
    assert all(not s.problem for s in swept), swept
    assert [p.name for p in sorted(tmp_path.iterdir())] == sorted(
        made[k].name for k in ("live", "foreign", "unstamped", "not_ours"))
    assert swept[0].line().startswith(f"swept {tmp_path}/sbxc-") and f"pid {dead.pid}" in swept[0].line()
    # The end of a cancelled run: its own too.
    assert [s.path for s in owner.sweep(dirs=[str(tmp_path)], include_self=True)] == [str(made["live"])]


def _shows_in_cmdline(pid: int, needle: str) -> None:
    """Wait until a child just started names `needle` in /proc/PID/cmdline. Popen returns once
    execve(2) is past its point of no return (close-on-exec closed its error pipe), before the new
    image's argument area is set up, so the command line can read empty for a moment (seen under
    load). What a dead run left running has long been past that; a sweep that reads the child
    earlier finds nothing to kill."""
    deadline = time.monotonic() + 10
    while needle.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, f"pid {pid} never showed {needle} in its command line"
        time.sleep(0.01)


def test_the_sweep_kills_what_still_runs_from_a_dead_runs_directory(tmp_path: Path) -> None:
    d = tmp_path / f"sbxc-vm.{_dead_stamp()}.xyz"
    d.mkdir()
    # qemu names its workdir in -append (sbxc_work=...) and -fsdev (path=...).
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"sbxc_work={d}"])
    try:
        _shows_in_cmdline(proc.pid, str(d))
        assert [s.path for s in owner.sweep(dirs=[str(tmp_path)])] == [str(d)]
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_the_prefixes_swept_are_the_ones_the_modules_create() -> None:
    from sandbox_conformance.conformance import layout
    from sandbox_conformance.conformance.adapters import oci

    text = {f: (REPO / f).read_text() for f in ("runners/vm/mode.py", "runners/vm/qemu.py",
                                                 "runners/container.py",
                                                 "commands/controls.py")}
    def swept(prefix: str) -> bool:  # the shape the sweep knows (processes/owner.py OURS), stamped
        return owner.owned(f"{prefix}{owner.mine()}-abc123")

    assert swept(layout.TEMP_PREFIX) and swept(oci.WORKSPACE_PREFIX)
    # nspawn's hierarchy label, stamped with its guardian's stamp (not this process's), as oci's.
    from sandbox_conformance.conformance.adapters import nspawn

    assert swept(nspawn.LABEL_PREFIX)
    assert 'prefix=f"{LABEL_PREFIX}{stamp}-"' in (REPO / "conformance/adapters/nspawn.py").read_text()
    for prefix, where in (("sbxc-vm.", "runners/vm/mode.py"), ("sbxc-kvm-trial-", "runners/vm/qemu.py"),
                          ("sbxc-container.", "runners/container.py"),
                          ("sbxc-controls-", "commands/controls.py")):
        assert swept(prefix) and f'prefix=f"{prefix}{{owner.stamp()}}' in text[where], prefix
    # Named by a constant where they are made: srt's own directory, mr-check's verdict scratch, run's
    # witness report scratch, the rootless podman probe's scratch.
    from sandbox_conformance.conformance.adapters import srt
    from sandbox_conformance.mrcheck import tiers as mr_tiers
    from sandbox_conformance.probes import container_engine
    from sandbox_conformance.runners import orchestrate

    for prefix, const, where in ((srt.OWN_PREFIX, "OWN_PREFIX", "conformance/adapters/srt.py"),
                                 (mr_tiers.SCRATCH_PREFIX, "SCRATCH_PREFIX", "mrcheck/tiers.py"),
                                 (orchestrate.REPORT_PREFIX, "REPORT_PREFIX", "runners/orchestrate.py"),
                                 (container_engine.SCRATCH_PREFIX, "SCRATCH_PREFIX",
                                  "probes/container_engine.py")):
        made = (REPO / where).read_text()
        assert swept(prefix) and f'prefix=f"{{{const}}}{{owner.stamp()}}' in made, prefix
    # Not ours, so never swept: another tool's name, our prefix without a stamp, a stamp alone.
    assert not any(owner.owned(n) for n in ("tmpabc", "sbxc-witness-abc", f"{owner.mine()}-x",
                                             f"xsbxc-vm.{owner.mine()}"))
    lay = layout.create()
    try:
        assert owner.find(lay.root.name) == owner.mine()
    finally:
        layout.remove(lay)


@pytest.fixture
def cgroup2_scratch(root_only: None) -> Iterator[Path]:
    """A real cgroup v2 directory of our own (membership works with no controller enabled)."""
    mounts = [ln.split(" - ")[0].split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
              if ln.split(" - ")[1].startswith("cgroup2 ")]
    if not mounts:
        pytest.skip("no cgroup2 mount on this host")
    top = Path(mounts[0]) / f"sbxc-cancel-test-{secrets.token_hex(4)}"
    try:
        top.mkdir()
    except OSError as e:
        pytest.skip(f"cannot make a cgroup under {mounts[0]}: {e.strerror}")
    try:
        yield top
    finally:
        owner.remove_cgroup(top)


def test_a_dead_runs_cgroup_leaf_is_killed_and_removed_and_a_live_ones_kept(cgroup2_scratch: Path) -> None:
    from sandbox_conformance.conformance import cgroup_leaf

    dead = cgroup2_scratch / f"task-{_dead_stamp()}-1"
    live = cgroup2_scratch / cgroup_leaf.unique_name("task")
    plain = cgroup2_scratch / "supervisor"
    for d in (dead, live, plain):
        d.mkdir()
    inside = subprocess.Popen(["sh", "-c", f'echo $$ > {dead}/cgroup.procs && exec sleep 60'])
    try:
        deadline = time.monotonic() + 5
        while not (dead / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.02)
        swept = owner.sweep_cgroup(cgroup2_scratch)
        assert [(s.path, s.problem) for s in swept] == [(str(dead), "")]
        assert inside.wait(timeout=10) == -signal.SIGKILL
        assert not dead.exists() and live.is_dir() and plain.is_dir()
    finally:
        inside.kill()
        inside.wait()


def test_no_redelivered_interrupt_outlives_uninstall() -> None:
    """A Cancelled owed (a stop signal that came inside an import) is redelivered every 5 ms until it
    is raised. One sent after the command ended met the handler the process started with: for SIGINT
    Python's, and a KeyboardInterrupt traceback from threading._shutdown after the verdict line
    (tests/test_signal_anytime.py, a fresh clone under load)."""
    script = r"""
import signal, threading, time
from sandbox_conformance.processes import cancel
hits = []
signal.signal(signal.SIGINT, lambda s, f: hits.append(s))  # ours, in install()'s place: it only counts
cancel._state.previous[signal.SIGINT] = signal.default_int_handler  # what uninstall() puts back
cancel._state.received = cancel.Cancelled(signal.SIGINT)
cancel._state.owed = True
cancel._redeliver()
time.sleep(0.05)
assert hits, "no redelivery: the test proves nothing"
cancel.uninstall()
alive = [t.name for t in threading.enumerate() if t.name == "sbxc-redeliver"]
time.sleep(0.05)  # a redelivery now raises KeyboardInterrupt here
print("clean", alive)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "clean []", done.stdout + done.stderr


# ---------------------------------------------------------------- the guardian


def _guardian() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-I", "-S", str(GUARDIAN), "4242"], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def test_the_guardian_stops_what_its_dead_owner_registered_and_forgets_what_it_undid(tmp_path: Path) -> None:
    kept = subprocess.Popen(["sleep", "60"], start_new_session=True)
    # A group whose leader ignores SIGTERM: the guardian escalates to SIGKILL after its grace.
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & wait"], start_new_session=True)
    marker = tmp_path / "undone"
    msgs = ({"key": -kept.pid, "group": kept.pid, "signal": 15}, {"done": -kept.pid},
            {"key": -stubborn.pid, "group": stubborn.pid, "signal": 15},
            {"key": 1, "argv": ["touch", str(marker)], "env": {"PATH": BASE_PATH}, "timeout": 10})
    g = _guardian()
    try:
        # communicate() closes stdin after writing: the owner is gone.
        _, err = g.communicate(b"".join(json.dumps(m).encode() + b"\n" for m in msgs), timeout=30)
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
        assert kept.poll() is None  # forgotten: the owner had undone it
        assert marker.exists()
        said = err.decode()
        assert f"pid 4242 is gone: stopped process group {stubborn.pid}" in said
        assert f"killed process group {stubborn.pid}" in said and "ran touch" in said
    finally:
        for p in (kept, stubborn):
            p.kill()
            p.wait()


def test_registrations_over_pipe_buf_reach_the_guardian_whole_when_two_writers_interleave(
        tmp_path: Path) -> None:
    # run and its forked witness share the guardian's pipe; pipe(7) keeps only writes of at most
    # PIPE_BUF bytes whole. An undo command whose environment is bigger (a long PATH) is sent in parts.
    big_env = {"PATH": BASE_PATH + ":" + ":".join(f"/opt/\"{i}\"/bin" for i in range(900)),
               "SBXC_MARK": "x" * 5000}
    markers = [tmp_path / "first", tmp_path / "second"]
    regs = [{"key": n, "argv": ["sh", "-c", f'[ ${{#SBXC_MARK}} = 5000 ] && touch {m}'], "env": big_env,
             "timeout": 10} for n, m in enumerate(markers, 1)]
    first, second = (cancel.guardian_lines(r, writer) for r, writer in zip(regs, (100, 200), strict=True))
    assert len(first) > 2 and all(len(line) <= select.PIPE_BUF for line in first + second)
    assert cancel.guardian_lines({"done": 1}, 100) == [b'{"done": 1}\n']  # a short one stays one line
    woven = [line for pair in zip(first, second, strict=False) for line in pair]
    woven += first[len(second):] + second[len(first):]
    g = _guardian()
    _, err = g.communicate(b"".join(woven), timeout=30)
    assert all(m.exists() for m in markers), err.decode()


def test_the_guardian_of_an_owner_that_undid_everything_exits_at_once_and_quietly() -> None:
    g = _guardian()
    _, err = g.communicate(b'{"key": 1, "argv": ["false"]}\n{"done": 1}\n', timeout=10)
    assert g.returncode == 0 and err == b""


def test_the_guardian_removes_a_cgroup_tree_children_before_parents(tmp_path: Path) -> None:
    # A plain directory tree stands in for a cgroup: no cgroup.procs to read, and rmdir of a directory
    # that still has a child fails (ENOTEMPTY), so removing all of it proves the bottom-up order.
    top = tmp_path / "task-1"
    for d in ("a/a1", "a/a2/deep", "b"):
        (top / d).mkdir(parents=True)
    assert guardian.remove_cgroup(str(top), timeout=5) == f"removed cgroup {top}"
    assert not top.exists() and sorted(tmp_path.iterdir()) == []  # and no cgroup.kill made next to it
    assert guardian.remove_cgroup(str(top), timeout=5) == ""  # gone already: nothing to say


def test_the_guardian_kills_every_pid_a_cgroup_tree_lists_and_names_what_it_could_not_remove(
        tmp_path: Path) -> None:
    # A cgroup.procs that never empties (a regular file, unlike cgroupfs's): the guardian SIGKILLs what
    # it lists until its deadline, then says which directory it could not remove and why.
    top = tmp_path / "task-1"
    (top / "sub").mkdir(parents=True)
    inside = subprocess.Popen(["sleep", "60"])
    try:
        (top / "sub" / "cgroup.procs").write_text(f"{inside.pid}\n")
        started = time.monotonic()
        said = guardian.remove_cgroup(str(top), timeout=0.3)
        assert inside.wait(timeout=10) == -signal.SIGKILL
        assert said == f"could not remove cgroup {top / 'sub'}: ENOTEMPTY"
        assert time.monotonic() - started < 5  # ENOTEMPTY is not retried as EBUSY is
    finally:
        inside.kill()
        inside.wait()


def test_the_guardian_kills_and_removes_a_registered_cgroup_leaf(cgroup2_scratch: Path) -> None:
    leaf = cgroup2_scratch / "task-leaf"
    (leaf / "child").mkdir(parents=True)
    inside = subprocess.Popen(["sh", "-c", f'echo $$ > {leaf}/child/cgroup.procs && exec sleep 60'])
    try:
        deadline = time.monotonic() + 5
        while not (leaf / "child" / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (leaf / "child" / "cgroup.procs").read_text().split() == [str(inside.pid)]
        g = _guardian()
        _, err = g.communicate(json.dumps({"key": 1, "cgroup": str(leaf)}).encode() + b"\n", timeout=30)
        assert inside.wait(timeout=10) == -signal.SIGKILL
        assert not leaf.exists()
        assert f"pid 4242 is gone: removed cgroup {leaf}" in err.decode()
    finally:
        inside.kill()
        inside.wait()


# ---------------------------------------------------------------- cancelling real runs


@dataclasses.dataclass(frozen=True)
class Ended:
    status: int  # the top's returncode as its parent saw it (negative: killed by that signal)
    stderr: str
    left: list[list]  # [pid, cmdline] of the run's processes alive after LINGER
    seconds: float  # from the top's exit until its last process was gone
    top: int
    reaped: dict[int, int] = dataclasses.field(default_factory=dict)  # orphan pid -> how it ended

    @property
    def verdict(self) -> re.Match[str] | None:
        lines = self.stderr.strip().splitlines()
        return KILLED.match(lines[-1]) if lines else None


def _stamped(env: dict[str, str]) -> set[Path]:
    """Stamped directories where a run with `env` creates them: its TMPDIR (private to each test, so a
    concurrent run elsewhere on this machine cannot sweep them first), /tmp (a launcher given the
    minimal environment uses it) and /var/tmp (the VM's scratch)."""
    out = set()
    for d in dict.fromkeys([env["TMPDIR"], "/tmp", "/var/tmp"]):
        for p in Path(d).iterdir():
            if owner.owned(p.name):
                out.add(p)
    return out


def leftovers(before: set[Path], env: dict[str, str]) -> list[Path]:
    """Stamped directories that appeared since `before` and whose owner is gone: the run's own (a
    concurrent live run's have a live owner)."""
    new = [p for p in _stamped(env) - before if p.exists()]
    return sorted(p for p in new if owner.gone(owner.find(p.name)))  # type: ignore[arg-type]


def processes_with(token: str) -> list[int]:
    """The run's sleeping tasks: `sleep TOKEN` (not the bwrap or shell whose argv carries it)."""
    want = [b"sleep", token.encode(), b""]
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "cmdline").read_bytes().split(b"\0") == want:
                out.append(int(p.name))
        except OSError:
            continue
    return out


def cancel_mid_run(argv: list[str], *, sig: int, ready: Callable[[int], bool], tmp: Path,
                   env: dict[str, str], ready_timeout: float = 120, settle: float = 0.3) -> Ended:
    """Start argv under the reaper, wait until `ready(top pid)`, send `sig` to the top, and report."""
    out, err = tmp / "top.out", tmp / "top.err"
    reaper = subprocess.Popen([sys.executable, str(REAPER), "--linger", str(LINGER), "--stdout", str(out),
                               "--stderr", str(err), "--", *argv], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=REPO)
    assert reaper.stdout is not None
    try:
        top = json.loads(reaper.stdout.readline())["top"]
        deadline = time.monotonic() + ready_timeout
        while not ready(top):
            if reaper.poll() is not None or time.monotonic() > deadline:
                if reaper.poll() is None:
                    os.kill(top, signal.SIGKILL)
                pytest.fail(f"the run never got mid-way: {err.read_text()[-3000:]}")
            time.sleep(0.1)
        time.sleep(settle)
        os.kill(top, sig)
        rest, _ = reaper.communicate(timeout=LINGER + 120)
    finally:
        if reaper.poll() is None:
            reaper.kill()
            reaper.wait()
    doc = json.loads(rest.strip().splitlines()[-1])
    return Ended(doc["status"], err.read_text(), doc["left"], doc["seconds"], top,
                 {pid: code for pid, code in doc.get("reaped", [])})


def assert_orderly(e: Ended, sig: int, mode: str) -> None:
    name = signal.Signals(sig).name
    assert e.status == 128 + sig, (e.status, e.stderr[-3000:])
    m = e.verdict
    assert m and m.group(1) == name and m.group(2) == mode and int(m.group(3)) == 128 + sig, e.stderr[-3000:]
    assert "Traceback" not in e.stderr, e.stderr[-3000:]
    assert e.left == [], f"still running {LINGER:.0f} s after the run ended: {e.left}"


def assert_killed_then_swept(e: Ended, before: set[Path], env: dict[str, str],
                             expect: tuple[str, ...]) -> str:
    """SIGKILL: nothing of the run runs; what it left on disk (at least one of each `expect` prefix)
    the next run removes, naming each. Returns the next run's stderr."""
    assert e.status == -signal.SIGKILL, e.stderr[-2000:]
    assert e.left == [], f"still running {LINGER:.0f} s after the SIGKILL: {e.left}"
    left = leftovers(before, env)
    for prefix in expect:
        assert any(p.name.startswith(prefix) for p in left), (prefix, left)
    # The next run: any witness run sweeps before it makes its layout (this one's launcher runs nothing).
    nxt = subprocess.run([sys.executable, "-m", "sandbox_conformance", "witness", "--launcher", "true"],
                         cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    for p in left:
        assert not p.exists(), f"the next run left {p}"
        if p.is_relative_to(env["TMPDIR"]):
            # Named. (In /tmp or /var/tmp a concurrent run elsewhere on this machine may sweep first.)
            assert f"swept {p}: its run (pid " in nxt.stderr, nxt.stderr
    return nxt.stderr


def _env(tmp: Path, path_first: Path | None = None) -> dict[str, str]:
    path = f"{path_first}:{BASE_PATH}" if path_first else BASE_PATH
    private = tmp / "tmpdir"
    private.mkdir(exist_ok=True)
    return {"PATH": path, "LANG": "C.UTF-8", "HOME": str(tmp), "TMPDIR": str(private)}


def _token() -> str:
    """A unique `sleep` argument: how the test finds the run's sleeping task from the host."""
    return f"600.{secrets.randbelow(10**8):08d}"


def _sleeping(token: str, count: int = 1) -> Callable[[int], bool]:
    return lambda _top: len(processes_with(token)) >= count


SLOW_BWRAP = """#!{python} -IS
# bwrap as the reference launcher calls it, with the task replaced by `sleep TOKEN` (the witness
# program's argv, `PYTHON -I -S -`, is the last four words). Everything else (the probes' trials, the
# first run's launches when PASS_FIRST names a directory to make: its main task, its lifecycle and its
# terminal launches) runs unchanged.
import os, sys
REAL, TOKEN, PASS_FIRST, LOG = {real!r}, {token!r}, {first!r}, {log!r}
args = sys.argv[1:]
if any("sbxc-witness-" in a for a in args) and args[-3:] == ["-I", "-S", "-"]:
    first = False
    for i in range(3 if PASS_FIRST else 0):
        try:
            os.mkdir(f"{{PASS_FIRST}}-{{i}}")
            first = True
            break
        except FileExistsError:
            pass
    if not first:
        args = args[:-4] + ["sleep", TOKEN]
        with open(LOG, "a") as f:
            # The witness process that launched it: each launches its main task and its lifecycle
            # launch side by side, so launches are not witness runs.
            f.write(f"{{os.getppid()}}\\n")
os.execv(REAL, [REAL, *args])
"""


@pytest.fixture
def slow_bwrap(tmp_path: Path, bwrap_path: str) -> Callable[..., tuple[Path, str]]:
    """A directory to put first on PATH whose `bwrap` runs the real one with a sleeping task."""

    def make(pass_first: bool = False) -> tuple[Path, str]:
        token = _token()
        d = tmp_path / "bin"
        d.mkdir(exist_ok=True)
        first = str(tmp_path / "first-launch") if pass_first else ""
        (d / "bwrap").write_text(SLOW_BWRAP.format(python="/usr/bin/python3", real=bwrap_path, token=token,
                                                   first=first, log=str(tmp_path / "slow-launches")))
        (d / "bwrap").chmod(0o755)
        return d, token

    return make


SIGNAL_IDS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT", signal.SIGHUP: "SIGHUP",
              signal.SIGKILL: "SIGKILL"}


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", list(SIGNAL_IDS), ids=SIGNAL_IDS.get)
def test_witness_with_an_external_launcher(sig: int, tmp_path: Path) -> None:
    """The issue's case: a slow launcher (a shell script sleeping before it runs the task)."""
    token = _token()
    launcher = tmp_path / "slow-launcher"
    launcher.write_text(f'#!/bin/sh\nsleep {token}\nexec "$@"\n')
    launcher.chmod(0o755)
    env = _env(tmp_path)
    before = _stamped(env)
    e = cancel_mid_run([sys.executable, "-m", "sandbox_conformance", "witness", "--launcher", str(launcher),
                        "--launch-timeout", "120"], sig=sig, ready=_sleeping(token), tmp=tmp_path, env=env)
    assert not processes_with(token)
    if sig == signal.SIGKILL:
        assert_killed_then_swept(e, before, env, expect=("sbxc-witness-",))
    else:
        assert_orderly(e, sig, "witness")
        assert leftovers(before, env) == []


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=SIGNAL_IDS.get)
def test_run_native_with_the_reference_bwrap_sandbox(sig: int, tmp_path: Path, slow_bwrap) -> None:
    """run -> its witness child (parent-death signal SIGTERM) -> the real bwrap, with --die-with-parent."""
    bin_dir, token = slow_bwrap()
    env = _env(tmp_path, bin_dir)
    before = _stamped(env)
    verdict = tmp_path / "verdict.json"
    e = cancel_mid_run([sys.executable, "-m", "sandbox_conformance", "run", "--mode", "native", "--timeout",
                        "300",
                        "--verdict-json", str(verdict)],
                       sig=sig, ready=_sleeping(token), tmp=tmp_path, env=env)
    assert not processes_with(token)
    if sig == signal.SIGKILL:
        # The witness child got SIGTERM from the kernel and removed its own layout; nothing to sweep
        # unless it lost the race with the guardian's SIGKILL, which the next run would sweep.
        assert_killed_then_swept(e, before, env, expect=())
        assert not verdict.exists()  # a SIGKILL runs nothing: no document, rather than a wrong one
    else:
        assert_orderly(e, sig, "native")
        # Both processes said how they ended: the witness child, then the run.
        assert "KILLED-SIGTERM mode=witness" in e.stderr
        assert leftovers(before, env) == []
        # And the run as data, for a program (mr-check) that reads it rather than the line.
        import jsonschema
        from test_schemas import schema

        doc = json.loads(verdict.read_text())
        jsonschema.validate(doc, schema("run-verdict"))
        assert (doc["verdict"], doc["mode"], doc["exit"]) == ("KILLED-SIGTERM", "native", 143), doc


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=SIGNAL_IDS.get)
def test_controls_mid_way_through_its_parallel_witness_runs(sig: int, tmp_path: Path, slow_bwrap) -> None:
    """The baseline passes, then two controls run in parallel threads, each a witness child with a
    sleeping task: both must be stopped and the queued work never started."""
    bin_dir, token = slow_bwrap(pass_first=True)
    env = _env(tmp_path, bin_dir)
    before = _stamped(env)

    e = cancel_mid_run([sys.executable, "-m", "sandbox_conformance", "controls", "--only",
                        "mask_dropped,network_shared,pid_shared", "--jobs", "2", "--timeout", "300"],
                       sig=sig, ready=_sleeping(token, 4), tmp=tmp_path, env=env, ready_timeout=180)
    assert not processes_with(token)
    # The third control was queued behind the two under way: it never started. (Each witness run
    # has two launches asleep at once, its main task and its lifecycle launch.)
    assert len(set((tmp_path / "slow-launches").read_text().split())) == 2
    if sig == signal.SIGKILL:
        # Each witness child got SIGTERM from the kernel, removed its layout and, ending, swept the
        # controls' scratch directory of its dead parent: nothing is left for the next run.
        assert_killed_then_swept(e, before, env, expect=())
    else:
        assert_orderly(e, sig, "controls")
        assert leftovers(before, env) == []


MR_TIER = """\
[[tool.sandbox-conformance.tiers]]
name = "slow-sandbox"
globs = ["src/sandbox/**"]
run = {{ kind = "witness", launcher = "{launcher}" }}
"""


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=SIGNAL_IDS.get)
def test_mr_check_stops_its_runner_child_in_order(sig: int, tmp_path: Path) -> None:
    """mr-check -> `sandbox-conformance run` (its child) -> the witness child -> a slow external launcher.
    The runner child is stopped by SIGTERM, never SIGKILL first: on mr-check's SIGTERM or SIGINT (its
    group gets SIGTERM, then SIGKILL after the grace), mr-check prints the runner's own KILLED line
    (read from its --verdict-json document) before its own; on mr-check's SIGKILL (SIGTERM is the
    runner's parent-death signal) the subreaper sees the runner end with its own exit 143."""
    from test_mr_check import make_repo, write

    from sandbox_conformance.mrcheck import tiers as mr_tiers

    gate = mr_tiers.runner_gate(None)
    if gate.mode != "native":
        pytest.skip(f"the runner would not run natively here: {'; '.join(gate.reasons)}")
    runner_child: list[int] = []

    def ready(top: int) -> bool:
        # The task sleeps, and mr-check's runner child is known (its pid, to judge how it ended).
        runner_child[:] = [pid for pid, words in _children(top)
                           if ["sandbox_conformance", "run"] in (words[i:i + 2] for i in range(len(words)))]
        return bool(processes_with(token)) and len(runner_child) == 1

    token = _token()
    launcher = tmp_path / "slow-launcher"
    launcher.write_text(f'#!/bin/sh\nsleep {token}\nexec "$@"\n')
    launcher.chmod(0o755)
    repo = make_repo(tmp_path / "repo", MR_TIER.format(launcher=launcher))
    write(repo / "src/sandbox/launch.py", "changed\n")
    env = _env(tmp_path)
    before = _stamped(env)
    e = cancel_mid_run([sys.executable, "-m", "sandbox_conformance", "mr-check", "-C", str(repo)], sig=sig,
                       ready=ready, tmp=tmp_path, env=env)
    assert not processes_with(token)
    runner_ended = "sandbox-conformance: KILLED-SIGTERM mode=native exit=143 time="
    if sig == signal.SIGKILL:
        # The runner outlived mr-check by its orderly stop, and the subreaper saw how it ended: an exit
        # of its own (143 from cancel.finish; 120 when Python could not flush that last line into
        # mr-check's closed pipe), never killed by a signal, as a SIGKILL parent-death signal would.
        code = e.reaped.get(runner_child[0])
        assert code is not None and code >= 0, (runner_child, e.reaped, e.stderr[-2000:])
        # mr-check's scratch directory went with the runner's final sweep (its owner was dead by
        # then) or goes with the next run's.
        assert_killed_then_swept(e, before, env, expect=())
    else:
        assert_orderly(e, sig, "mr-check")
        said = f"sandbox-conformance mr-check: tier slow-sandbox: {runner_ended}"
        assert said in e.stderr, e.stderr[-3000:]
        assert leftovers(before, env) == []


def _children(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of each live child of `pid` (/proc/PID/stat field 4 is the parent, proc(5))."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit():
                continue
            stat = (p / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append((int(p.name), (p / "cmdline").read_bytes().decode(errors="replace").split("\0")))
        except (OSError, ValueError):
            continue
    return out


def _oci_or_skip() -> str:
    from sandbox_conformance.conformance import adapters

    if os.geteuid() != 0:
        pytest.skip("the crun adapter runs as root here (rootless crun refuses this hybrid host)")
    try:
        return adapters.resolve("crun").launcher
    except adapters.Unavailable as e:
        pytest.skip(f"crun adapter: {e}")


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=SIGNAL_IDS.get)
def test_witness_through_the_oci_adapter(sig: int, tmp_path: Path) -> None:
    """The container crun runs is in a session of its own: the adapter's guardian deletes it and the
    bundle when its launcher dies, however it died."""
    from sandbox_conformance.conformance import adapters

    prefix = _oci_or_skip()
    token = _token()
    launcher = f"{prefix} sh -c 'sleep {token}; exec \"$@\"' sh"
    env = _env(tmp_path)
    before = _stamped(env)
    e = cancel_mid_run([sys.executable, "-m", "sandbox_conformance", "witness", "--profile",
                        str(adapters.profile_path("oci.toml")), "--launcher", launcher, "--launcher-spec",
                        "--launcher-stdin", "--launch-timeout", "120"],
                       sig=sig, ready=_sleeping(token), tmp=tmp_path, env=env)
    # The adapter's guardian is not the run's descendant: a bounded wait, longer than its own worst case
    # (`crun delete --force` may take its whole 20 s timeout on a loaded host before the bundle goes;
    # once, in a fresh-clone CI rehearsal, 20 s here was not enough).
    deadline = time.monotonic() + 45

    def bundles() -> list[Path]:
        return [p for p in leftovers(before, env) if p.name.startswith("sbxc-oci-")]

    while (processes_with(token) or bundles()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with(token), "the container outlived the run"
    # Seen twice in fresh-clone rehearsals (SIGKILL), never locally: what is left, and how the
    # adapter's guardian ended (an orphan the reaper collected; a negative code is the signal that
    # killed it), so the next time says whether its clean-up was slow or was cut short.
    left_on_disk = {}
    for b in bundles():
        with contextlib.suppress(OSError):  # gone while listed: then it did not outlive the run
            left_on_disk[b.name] = sorted(str(q.relative_to(b)) for q in b.rglob("*"))
    assert not left_on_disk, (
        f"the bundle outlived the run: {left_on_disk}; orphans reaped: {e.reaped}; "
        f"still running at the reaper's end: {e.left}; {e.seconds:.1f} s"
    )
    if sig == signal.SIGKILL:
        assert_killed_then_swept(e, before, env, expect=("sbxc-witness-",))
    else:
        assert_orderly(e, sig, "witness")
        assert leftovers(before, env) == []


# ---------------------------------------------------------------- container mode (the Docker tier)


def _containers(tier: DockerTier, stamp_of: int) -> list[str]:
    done = tier.docker_cmd("ps", "--all", "--filter", f"name=sandbox-conformance-o{stamp_of}.",
                           "--format", "{{.Names}}", timeout=30)
    assert done.ok, done.stderr
    return done.stdout.split()


def _tier_cgroups(tier: DockerTier) -> list[Path]:
    """The containers' cgroups under the tier's parent, in every hierarchy."""
    from docker_tier import cgroup_dirs

    return [c for top in cgroup_dirs(tier.cgroup_parent) for c in top.iterdir() if c.is_dir()]


@pytest.mark.integration
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=SIGNAL_IDS.get)
def test_run_container_mode(sig: int, tmp_path: Path, docker_tier: DockerTier) -> None:
    token = _token()
    env = {**docker_tier.env, **_env(tmp_path), "HOME": docker_tier.env["HOME"]}
    before, cgroups_before = _stamped(env), set(_tier_cgroups(docker_tier))
    launcher = f"sh -c 'sleep {token}; exec \"$@\"' sh"
    e = cancel_mid_run([sys.executable, "-m", "sandbox_conformance", "run", "--mode", "container",
                        "--base-image", docker_tier.base, "--launcher", launcher],
                       sig=sig, ready=_sleeping(token), tmp=tmp_path, env=env, ready_timeout=900)
    deadline = time.monotonic() + 30  # the guardian's `docker rm` (SIGKILL) is not the run's descendant
    while (processes_with(token) or _containers(docker_tier, e.top)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_with(token), "the container's task outlived the run"
    assert _containers(docker_tier, e.top) == [], "the container outlived the run"
    assert set(_tier_cgroups(docker_tier)) - cgroups_before == set(), "the container's cgroup outlived it"
    if sig == signal.SIGKILL:
        assert_killed_then_swept(e, before, env, expect=("sbxc-container.",))
    else:
        assert_orderly(e, sig, "container")
        assert leftovers(before, env) == []


def test_a_dead_runs_container_is_swept_and_a_live_runs_kept(docker_tier: DockerTier) -> None:
    from sandbox_conformance.runners import container

    engine = container.Engine("docker", docker_tier.docker, docker_tier.env)
    names = {"dead": f"{container.NAME_PREFIX}{_dead_stamp()}-aaaa",
             "live": f"{container.NAME_PREFIX}{owner.stamp()}-bbbb"}
    try:
        for n in names.values():
            started = docker_tier.docker_cmd("run", "--detach", "--name", n, docker_tier.image, "sleep", "60",
                                             timeout=60)
            assert started.ok, started.stderr
        said: list[str] = []
        container.sweep_containers(engine, said.append)
        assert said == [f"container: swept {names['dead']}: its run (pid {os.getpid()}) is gone"]
        left = docker_tier.docker_cmd("ps", "--all", "--format", "{{.Names}}", timeout=30).stdout.split()
        assert names["live"] in left and names["dead"] not in left
    finally:
        docker_tier.docker_cmd("rm", "--force", *names.values(), timeout=60)


# ---------------------------------------------------------------- VM mode


def _vm_image_or_skip() -> None:
    from sandbox_conformance.runners.vm import image as vm_image

    if os.geteuid() != 0:
        pytest.skip("VM mode shares the host's / with passthrough ownership: root only here")
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu not installed (scripts/vm-deps)")
    try:
        vm_image.ensure_image()
    except vm_image.ImageNotBuilt as e:
        pytest.skip(f"no VM image: {e} (scripts/vm-deps)")


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=SIGNAL_IDS.get)
def test_run_vm_mode(sig: int, tmp_path: Path) -> None:
    """Signalled once the guest has started the suite (stage 2 wrote boot_seconds): qemu must go with
    the run, and its scratch directory in /var/tmp with it (SIGTERM) or with the next run (SIGKILL)."""
    from sandbox_conformance.runners.vm.qemu import qemu_pids

    _vm_image_or_skip()
    env = _env(tmp_path)
    before = _stamped(env)

    seen: list[Path] = []

    def guest_started(top: int) -> bool:
        ours = [p for p in Path("/var/tmp").glob(f"sbxc-vm.o{top}.*")
                if (p / ".sbxc-vm" / "boot_seconds").exists()]
        seen[:] = ours
        return bool(ours)

    e = cancel_mid_run([sys.executable, "-m", "sandbox_conformance", "run", "--mode", "vm", "--timeout",
                        "300"],
                       sig=sig, ready=guest_started, tmp=tmp_path, env=env, ready_timeout=180, settle=2.0)
    assert not qemu_pids(f"sbxc-vm.o{e.top}."), "qemu outlived the run"
    if sig == signal.SIGKILL:
        # /var/tmp is every run's on this machine: a suite running beside this one may sweep the dead
        # run's scratch first (seen once, two suites at once). Then only its being gone is checked.
        left = [p for p in seen if p.exists()]
        assert_killed_then_swept(e, before, env, expect=("sbxc-vm.",) if left else ())
        assert not [p for p in seen if p.exists()], "the next run left the killed run's VM scratch"
    else:
        assert_orderly(e, sig, "vm")
        assert list(Path("/var/tmp").glob(f"sbxc-vm.o{e.top}.*")) == []
        # Its stderr is a file: the boot's progress stage (runners/progress.py) is for a terminal only.
        assert "vm boot: " not in e.stderr, e.stderr



def test_the_next_docker_tier_sweeps_what_a_killed_pytest_left_and_not_a_live_tier(
        tmp_path: Path, root_only: None) -> None:
    """A SIGKILLed `make test`: its tier's temp dir (a containerd-shim stand-in still naming it) and
    cgroup parent stay behind, stamped with the dead pytest's pid; a live tier's are kept."""
    from docker_tier import sweep_dead_tiers

    dead, me = _dead_stamp(), owner.mine()
    tmp_root, fs = tmp_path / "tmp", tmp_path / "cgroup"
    dead_dir, live_dir = tmp_root / f"sbxc-docker.{dead}.x1", tmp_root / f"sbxc-docker.{me}.x2"
    for d in (dead_dir / "exec", live_dir / "exec"):
        d.mkdir(parents=True)
    for hierarchy in ("memory", "unified"):
        (fs / hierarchy / f"sbxc-docker-{dead}-ab" / "c0ffee").mkdir(parents=True)
        (fs / hierarchy / f"sbxc-docker-{me}-cd" / "c0ffee").mkdir(parents=True)
    shim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{dead_dir}/exec/shim"],
                            start_new_session=True)
    try:
        _shows_in_cmdline(shim.pid, str(dead_dir))
        said = sweep_dead_tiers("docker", tmp_root=tmp_root, fs=fs)
        assert shim.wait(timeout=10) == -signal.SIGKILL
        assert not dead_dir.exists() and live_dir.is_dir()
        assert sorted(p.name for p in fs.glob("*/sbxc-docker-*")) == [f"sbxc-docker-{me}-cd"] * 2
        assert len(said) == 3 and all(f"pid {dead.pid}) is gone" in s for s in said), said
    finally:
        shim.kill()
        shim.wait()


def test_a_background_launch_starts_only_once_the_pairwise_fork_hooks_are_imported() -> None:
    """logging and concurrent.futures.thread register at-fork handlers in pairs; imported by the main
    thread (pytest imports logging) between a launch thread's before- and after-fork calls, one
    released a lock it never took: "Exception ignored in: <function _releaseLock>" in `run`'s output
    (its forked witness is handed the precondition probes, which import them first elsewhere)."""
    script = r"""
import sys
from sandbox_conformance.conformance import harness
assert "logging" not in sys.modules, "imported already: the test proves nothing"
seen = []
class Recorder:
    def __init__(self, *a, **k):
        seen.append(("logging" in sys.modules, "concurrent.futures.thread" in sys.modules))
harness.Background = Recorder
s = object.__new__(harness.WitnessSession)
s.layout, s._tasks, s._started = object(), {}, {}
harness.WitnessSession.start(s)
print(seen)
"""
    done = subprocess.run([sys.executable, "-I", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[(True, True)]", done.stdout + done.stderr


def test_a_stop_signal_while_a_group_is_forgotten_forgets_it_whole() -> None:
    """untrack tells the guardian, then forgets the group. A signal raised between the two (or inside
    the tell) left the group registered: finish() waited its whole grace for a group run() had reaped."""
    script = r"""
import os, signal
from sandbox_conformance.processes import cancel
cancel.install("t")
cancel.begin()
tell = cancel._tell
def signalled_tell(msg):
    if "done" in msg:
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # bytecodes for the handler to run between
    tell(msg)
cancel._tell = signalled_tell
cancel.track(4242)
try:
    cancel.untrack(4242)
    print("no Cancelled")
except cancel.Cancelled:
    print("groups", dict(cancel._state.groups))
cancel.uninstall()
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "groups {}", done.stdout + done.stderr


def test_a_fork_that_fails_releases_the_hold_on_stop_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, os.fork() raising (EAGAIN under pids.max) left cancel.deferred held: no later stop signal
    # was ever raised in the main thread.
    from sandbox_conformance.processes import cancel, children

    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refused)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    before = cancel._state.deferring
    with pytest.raises(BlockingIOError):
        children.Forked(lambda: 0)
    assert cancel._state.deferring == before


def test_the_sweeps_kills_are_in_this_runs_record_of_signals(tmp_path: Path) -> None:
    # A harness error names who ended a launcher from this record; the sweep's kills were missing.
    from sandbox_conformance.processes import kills

    named = subprocess.Popen([sys.executable, "-c", "import sys, time; print(flush=True); time.sleep(30)",
                              str(tmp_path / "x")], stdout=subprocess.PIPE)
    assert named.stdout is not None and named.stdout.readline() == b"\n"  # running, its argv in place
    began = time.monotonic()
    try:
        assert owner.kill_naming(str(tmp_path)) == [named.pid]
        assert named.wait(timeout=10) == -signal.SIGKILL
        sent = [s for s in kills.between(began, time.monotonic()) if s.target == named.pid]
        assert [s.signum for s in sent] == [signal.SIGKILL] and "sweep" in sent[0].reason
    finally:
        named.kill()
        named.wait()
