"""conformance/observer.py against real processes on this host: a task is found by its tag, read from
the host's /proc, and what a launch leaves running is found (even a double-forked daemon) and killed.
Plus the witness command's refusals of bad input before anything runs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from witness_cli import witness

from sandbox_conformance.commands import controls as controls_cmd
from sandbox_conformance.conformance import observer
from sandbox_conformance.conformance.controls_judge import ControlStatus, ControlVerdict
from sandbox_conformance.conformance.harness import NoObservation, check_document
from sandbox_conformance.conformance.plan import Plan
from sandbox_conformance.kernel import mountinfo

PR_SET_NAME = 15


def _tagged(tag: str) -> subprocess.Popen[bytes]:
    code = (
        "import ctypes,sys,time\n"
        f"ctypes.CDLL(None).prctl({PR_SET_NAME}, ctypes.c_char_p({tag.encode()!r}), 0, 0, 0)\n"
        "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_a_task_is_found_by_its_tag_and_read_from_the_hosts_proc() -> None:
    tag = observer.tag(os.urandom(8).hex())
    proc = _tagged(tag)
    try:
        assert observer.find(tag) == [proc.pid]
        seen = observer.read(proc.pid)
        assert seen.namespaces["pid"] == os.readlink("/proc/self/ns/pid")
        assert not isinstance(seen.status, str) and seen.nspid[-1] == proc.pid
        assert not isinstance(seen.environ, str) and "PATH" in seen.environ
        assert not isinstance(seen.mounts, str) and any(m.mount_point == "/" for m in seen.mounts)
    finally:
        proc.kill()
        proc.wait()
    assert observer.find(tag) == []


def test_a_process_that_is_gone_reads_as_cannot_tell_never_as_a_value(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    seen = observer.read(4242, proc=tmp_path)
    assert all(v.startswith("error: ") for v in seen.namespaces.values())
    assert isinstance(seen.status, str) and isinstance(seen.environ, str) and isinstance(seen.mounts, str)


def test_a_double_forked_daemon_of_the_launch_is_found_as_an_orphan_and_killed() -> None:
    observer.become_subreaper()
    since = observer.boot_ticks() - 1
    # The launcher: forks a daemon into a session of its own, then exits (as `setsid sleep &` does).
    launcher = subprocess.Popen(
        ["sh", "-c", "( setsid sleep 60 >/dev/null 2>&1 & ) ; exit 0"], start_new_session=True
    )
    launcher.wait(timeout=10)
    seen = observer.Seen(0, {}, "error", "error", "error", "", "error")
    deadline = time.monotonic() + 5
    left: list[dict] = []
    # setsid(1) forks before it execs sleep when it leads a group: wait for the daemon to be sleep.
    while [p["comm"] for p in left] != ["sleep"] and time.monotonic() < deadline:
        time.sleep(0.02)
        left = observer.survivors(
            seen, launcher.pid, host_namespaces={}, harness_sid=os.getsid(0), since=since
        )
    assert [p["comm"] for p in left] == ["sleep"] and "orphan" in left[0]["why"][0]
    observer.kill(left)
    assert not Path(f"/proc/{left[0]['pid']}").exists()


def test_our_own_guardian_is_never_an_orphan_of_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child of ours started just before a launch looks like an orphan of it (ppid us, started after
    `since`): the guardian, which is ours, is left out; the same process unnamed is reported, so the
    test sees the difference and not an empty scan."""
    since = observer.boot_ticks() - 1
    stand_in = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        seen = observer.Seen(0, {}, "error", "error", "error", "", "error")

        def left() -> list[int]:
            found = observer.survivors(seen, -1, host_namespaces={}, harness_sid=os.getsid(0), since=since)
            return [p["pid"] for p in found]

        assert stand_in.pid in left()  # unnamed: an orphan of the launch, as far as the scan can tell
        monkeypatch.setattr(observer.cancel, "guardian_pid", lambda: stand_in.pid)
        assert stand_in.pid not in left()
    finally:
        stand_in.kill()
        stand_in.wait(timeout=10)


def test_a_document_from_another_launch_or_for_another_plan_is_a_harness_error() -> None:
    plan = Plan(
        task_id="t",
        ops=({"op": "stat", "path": "/x"},),
        tcp=(),
        unix_abstract=(),
        nested_userns=False,
        launch_nonce="n1",
    )
    check_document("L", {"launch_nonce": "n1", "ops": [{"op": "stat", "path": "/x", "result": {}}]}, plan)
    with pytest.raises(NoObservation, match="not from this launch"):
        check_document("L", {"launch_nonce": "n0", "ops": []}, plan)
    with pytest.raises(NoObservation, match="does not answer the plan: no stat /x"):
        check_document("L", {"launch_nonce": "n1", "ops": [{"op": "stat", "path": "/y", "result": {}}]}, plan)


class _Report:
    def __init__(self, verdicts: list[ControlVerdict], coverage: list[object]) -> None:
        self.verdicts, self.coverage, self.exit_code, self.partial = verdicts, coverage, 0, False


class _Cov:
    def __init__(self, test: str, status: str) -> None:
        self.test, self.status, self.detail = test, status, "skipped in the baseline: no root"


def test_controls_under_require_fail_on_what_could_not_run(capsys: pytest.CaptureFixture[str]) -> None:
    na = ControlVerdict("limits_dropped", ControlStatus.not_applicable, reason="no usable cgroup root")
    report = _Report([na], [_Cov("test_x", "not_run")])
    assert controls_cmd.required(report, env={}) == 0  # type: ignore[arg-type]
    assert controls_cmd.required(report, env={"SANDBOX_CONFORMANCE_REQUIRE": "1"}) == 1  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "control limits_dropped not applicable" in err and "witness test_x not run" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--launcher", ""], "--launcher: expected a value, got an empty string"),
        (["--launcher", "   "], "--launcher: empty prefix"),
        (
            ["--junitxml", "/nonexistent-dir-sbxc/j.xml"],
            "--junitxml /nonexistent-dir-sbxc/j.xml: no such directory",
        ),
        (["--json", "/"], "--json /: is a directory"),
        (["--host-cannot-observe", " "], "--host-cannot-observe: say why"),
    ],
)
def test_bad_witness_input_exits_2_with_one_line_before_anything_runs(args: list[str], says: str) -> None:
    done = witness(*args, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == "", "nothing ran, so no promise line and no PASS"


def test_the_tag_fits_the_kernels_comm() -> None:
    # TASK_COMM_LEN is 16 with the NUL (include/linux/sched.h): a longer tag would be cut and never found.
    assert len(observer.tag("f" * 16)) == 15


def test_a_mount_behind_a_directory_the_task_cannot_search_is_unreachable(tmp_path: Path) -> None:
    # What an unprivileged bwrap leaves read-write under a --ro-bind (it cannot reach it either).
    locked = tmp_path / "var" / "locked"
    (locked / "inner").mkdir(parents=True)
    os.chown(locked, 0, 0)
    locked.chmod(0o700)
    task = observer.Creds(fsuid=1000, fsgid=1000, groups=frozenset(), mapped=((1000, 1),))
    assert observer.unreachable(tmp_path, "/var/locked/inner", task)
    # Mapped owner: a capability in the task's namespace could override the mode.
    mapped = observer.Creds(fsuid=1000, fsgid=1000, groups=frozenset(), mapped=((0, 65536),))
    assert not observer.unreachable(tmp_path, "/var/locked/inner", mapped)
    locked.chmod(0o711)
    assert not observer.unreachable(tmp_path, "/var/locked/inner", task)


def test_the_mounts_a_task_already_holds_are_never_unreachable(tmp_path: Path) -> None:
    # cwd (and any open descriptor) inside a mount needs no path search: relative writes reach it.
    # Another mount of the same filesystem is no way in: the mount counts, not the device. (No
    # inherited descriptors: pytest's capture files are deleted temp files, which hold every mount.)
    proc = subprocess.Popen(["sleep", "30"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        mounts = mountinfo.parse(Path(f"/proc/{proc.pid}/mountinfo").read_text())
        held = observer.held_mounts(Path(f"/proc/{proc.pid}"), mounts)
        serving = mountinfo.serving(mounts, str(tmp_path))
        assert serving is not None and serving.mount_id in held
        same_fs_elsewhere = [m for m in mounts if m.dev == serving.dev and m.mount_id != serving.mount_id
                             and m.mount_point != "/"]
        assert not {m.mount_id for m in same_fs_elsewhere} & held
    finally:
        proc.kill()
        proc.wait()


def test_a_reference_whose_path_leads_nowhere_holds_every_mount_of_its_filesystem(tmp_path: Path) -> None:
    # A deleted file's descriptor names no mount: every mount of its filesystem is then judged.
    f = tmp_path / "gone"
    fd = os.open(f, os.O_CREAT | os.O_RDWR)
    f.unlink()
    proc = subprocess.Popen(["sleep", "30"], cwd="/", pass_fds=(fd,))
    try:
        os.close(fd)
        mounts = mountinfo.parse(Path(f"/proc/{proc.pid}/mountinfo").read_text())
        st = os.stat(tmp_path)
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        held = observer.held_mounts(Path(f"/proc/{proc.pid}"), mounts)
        assert {m.mount_id for m in mounts if m.dev == dev} <= held
    finally:
        proc.kill()
        proc.wait()


def test_run_refuses_an_unwritable_report_before_probing_anything(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "run", "--json", str(tmp_path / "missing" / "r.json")],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert done.returncode == 2, done.stderr
    assert "no such directory" in done.stderr and "mode native" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def _pidns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def _first_child(pid: int, name: str) -> int:
    """The first child of `pid` running `name`, waited for (10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            found = [c.pid for c in psutil.Process(pid).children() if c.name() == name]
            if found:
                return found[0]
        time.sleep(0.01)
    raise AssertionError(f"no {name} under pid {pid}")


def test_a_process_that_enters_the_tasks_pid_namespace_later_is_found_and_its_descendants_are_not(
    root_only: None,
) -> None:
    # The task is pid 1 of a pid namespace of its own; the handshake saw only it. Then the task forks
    # (its own child: never "joined"), and a process enters from outside as `runc exec` does (nsenter:
    # setns(2) to the pid namespace, then a fork, whose parent stays outside).
    sandbox = subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", "sleep 30 & exec sleep 31"],
                               start_new_session=True)
    entered = None
    try:
        task = _first_child(sandbox.pid, "sleep")
        child = _first_child(task, "sleep")  # the task's own child
        seen = observer.Seen(pid=task, namespaces={"pid": _pidns(task)}, status={}, environ={}, mounts=(),
                             cgroup="", proc_stat={}, reached={"pids": [task]})
        host = _pidns(os.getpid())
        # The handshake's listing of the host's processes and what it reached: only later ones are read.
        # The child as if born after the listing: read, and the task's own (it descends from the task).
        classified = {p: False for p in psutil.pids() if p != child}
        assert observer.joined(seen, host, classified) == []
        assert classified[child] is False
        entered = subprocess.Popen(["nsenter", "--target", str(task), "--pid", "--", "sleep", "30"],
                                   start_new_session=True)
        inside = _first_child(entered.pid, "sleep")
        assert _pidns(inside) == _pidns(task)
        assert observer.joined(seen, host, classified) == [inside]
        assert observer.joined(seen, host, {p: False for p in psutil.pids()}) == []  # there at the handshake
        # Sharing the host's pid namespace, nothing can join it.
        assert observer.joined(seen._replace(namespaces={"pid": host}), host, {}) == []
    finally:
        for p in (entered, sandbox):
            if p is not None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_a_cwd_on_a_mount_outside_the_tasks_namespace_is_a_place_out(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "30"], cwd=tmp_path, stdin=subprocess.DEVNULL)
    try:
        mounts = mountinfo.parse(Path(f"/proc/{proc.pid}/mountinfo").read_text())
        assert observer.places_out([proc.pid], mounts) == []  # its own namespace's mounts
        serving = mountinfo.serving(mounts, str(tmp_path))
        assert serving is not None
        others = [m for m in mounts if m.mount_id != serving.mount_id]
        [out] = [o for o in observer.places_out([proc.pid], others) if o["fd"] == "cwd"]
        assert out["link"] == str(tmp_path) and f"(mount {serving.mount_id})" in out["why"]
    finally:
        proc.kill()
        proc.wait()


def test_what_a_helper_of_the_sandbox_comes_to_hold_after_the_handshake_is_found() -> None:
    # A helper (not the task, not its descendant) that holds nothing outside at the handshake, then opens
    # a directory on a mount the task's namespace does not have and moves its cwd there. Here the "task's
    # mount namespace" is this one minus the mount serving /proc (always one of its own, never "/").
    outside = "/proc"
    helper_code = (
        "import os,signal,sys\n"
        "signal.signal(signal.SIGUSR1, lambda *_: (os.chdir(sys.argv[1]), os.open(sys.argv[1], os.O_RDONLY),"
        " os.write(1, b'held\\n')))\n"
        "os.write(1, b'ready\\n')\n"
        "while True: signal.pause()\n"
    )
    task = subprocess.Popen(["sleep", "30"], cwd="/", stdin=subprocess.DEVNULL)
    helper = subprocess.Popen([sys.executable, "-c", helper_code, outside], cwd="/", stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, close_fds=True)
    try:
        assert helper.stdout is not None and helper.stdout.readline() == b"ready\n"
        mounts = mountinfo.parse(Path(f"/proc/{task.pid}/mountinfo").read_text())
        serving = mountinfo.serving(mounts, outside)
        assert serving is not None and serving.mount_point == outside
        others = tuple(m for m in mounts if m.mount_id != serving.mount_id)
        host = _pidns(os.getpid())
        seen = observer.Seen(pid=task.pid, namespaces={"pid": host}, status={}, environ={}, mounts=others,
                             cgroup="", proc_stat={},
                             reached={"pids": [task.pid, helper.pid], "descriptors": []})
        assert set(observer.helpers(seen)) == {helper.pid}  # the task is not its own helper
        assert observer.still(observer.helpers(seen)) == [helper.pid]
        assert observer.still({helper.pid: 0}) == []  # another process that had its pid once
        watch = observer.Watch("", "n", protected=(), host_namespaces={"pid": host})
        null = os.stat("/dev/null").st_rdev
        allowed = {"/dev/null": f"{os.major(null)}:{os.minor(null)}"}
        watch.seen, watch.asked = seen, observer.Reach(devices=allowed)
        watch._helpers = observer.helpers(seen)
        watch._look_later()
        assert watch.held_late == []  # clean so far
        helper.send_signal(signal.SIGUSR1)
        assert helper.stdout.readline() == b"held\n"
        watch._look_later()
        watch._look_later()  # each way out once
        found = {(d["pid"], d["fd"] if d["fd"] == "cwd" else "fd", d["link"]) for d in watch.held_late}
        assert found == {(helper.pid, "cwd", outside), (helper.pid, "fd", outside)}, watch.held_late
        assert len(watch.held_late) == 2
        assert {d["who"] for d in watch.held_late} == {"the sandbox's own, there at the handshake"}
    finally:
        for p in (helper, task):
            p.kill()
            p.wait()


def test_a_directory_too_deep_for_its_path_to_be_spelled_is_still_judged(tmp_path: Path) -> None:
    # readlink(2) of /proc/PID/fd/N or /proc/PID/cwd fails with ENAMETOOLONG past a page (d_path); the
    # verdict rests on stat and fdinfo, which follow the link itself. Before, the descriptor and the
    # cwd were skipped as "closed since the listing".
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fd = top
    for _ in range(25):  # 25 x 201 bytes: past 4096
        os.mkdir("d" * 200, dir_fd=fd)
        deeper = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    holder = subprocess.Popen([sys.executable, "-c", "import os,sys,time; os.fchdir(int(sys.argv[1])); "
                               "time.sleep(30)", str(fd)], pass_fds=[fd], stdin=subprocess.DEVNULL)
    try:
        os.close(fd)
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{holder.pid}/cwd").st_ino != os.stat(f"/proc/{holder.pid}/fd/{fd}").st_ino:
            assert time.monotonic() < deadline, "the holder never moved its cwd"
            time.sleep(0.01)
        mounts = mountinfo.parse(Path(f"/proc/{holder.pid}/mountinfo").read_text())
        serving = mountinfo.serving(mounts, str(tmp_path))
        assert serving is not None
        others = [m for m in mounts if m.mount_id != serving.mount_id]
        found = [*observer.held([holder.pid], others, {}, {}), *observer.places_out([holder.pid], others)]
        where = {(d["fd"], d["link"]) for d in found if d["fd"] in (fd, "cwd")}
        assert all(f"(mount {serving.mount_id})" in d["why"] for d in found if d["fd"] in (fd, "cwd"))
        assert where == {(fd, "(unreadable: ENAMETOOLONG)"), ("cwd", "(unreadable: ENAMETOOLONG)")}, found
    finally:
        holder.kill()
        holder.wait()


def test_sockets_are_judged_in_the_tasks_network_namespace_not_the_sandbox_inits(root_only: None) -> None:
    # The sandbox's init (the lowest pid of the task's pid namespace) stays in the host's network
    # namespace; the task has one of its own and holds a socket made in the host's. Before, the
    # handshake read the socket tables of the init's namespace, where that socket is listed: green.
    holder = (
        "import os,socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(sys.argv[1]); "
        "os.set_inheritable(s.fileno(), True); print(s.fileno(), flush=True); "
        "os.execvp('unshare', ['unshare', '--net', 'sleep', '30'])"
    )
    sock = f"/tmp/.sbxc-test-sock-{os.getpid()}"
    sandbox = subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", '"$0" -c "$1" "$2"; sleep 30',
                                sys.executable, holder, sock],
                               stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert sandbox.stdout is not None
        fd = int(sandbox.stdout.readline())
        init = _first_child(sandbox.pid, "sh")
        task = _first_child(init, "sleep")
        deadline = time.monotonic() + 10
        while _netns(task) == _netns(init):
            assert time.monotonic() < deadline, "the task never got a network namespace of its own"
            time.sleep(0.01)
        assert init < task
        seen = observer.read(task, asked=observer.Reach(), host_pidns=_pidns(os.getpid()))
        assert not isinstance(seen.reached, str)
        assert seen.reached["pids"][0] == init
        [found] = [d for d in seen.reached["descriptors"] if d["pid"] == task and d["fd"] == fd]
        assert "another network namespace" in found["why"]
    finally:
        os.killpg(sandbox.pid, signal.SIGKILL)
        sandbox.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock)


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_a_task_the_host_cannot_read_while_it_runs_is_a_change_and_the_looks_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, the first look after the handshake that could not read the task (a cwd on a FUSE mount
    # answering EIO) ended the looks for good, with nothing said: `unchanged` compared nothing after.
    task = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    monkeypatch.setattr(observer, "snapshot", lambda pid, proc=Path("/proc"): None)
    monkeypatch.setattr(observer, "UNREAD_SECONDS", 0.2)
    try:
        watch, looker = _looking(task)
        assert len(watch.changes) == 1 and "could not read the task" in watch.changes[0], watch.changes
        assert looker.is_alive()  # still looking
        time.sleep(0.3)
        assert len(watch.changes) == 1  # said once
    finally:
        task.kill()
        task.wait()
    looker.join(timeout=5)
    assert not looker.is_alive()  # the task gone: the looks end


def test_killing_leftovers_never_reaps_another_child_that_has_the_pid_now() -> None:
    # A leftover orphan's pid, now another child of ours (its start time differs): not killed, and not
    # waited for. Before, waitpid(pid, 0) blocked until that child ended and took its exit status.
    other = subprocess.Popen(["sh", "-c", "sleep 1; exit 3"])
    began = time.monotonic()
    observer.kill([{"pid": other.pid, "starttime": "-1", "why": ["an orphan of the launch"]}])
    assert time.monotonic() - began < 0.5
    assert other.wait(timeout=10) == 3


def test_a_killed_orphan_is_reaped() -> None:
    orphan = subprocess.Popen(["sleep", "30"])
    start = observer.stat_fields(Path(f"/proc/{orphan.pid}/stat").read_text())["starttime"]
    observer.kill([{"pid": orphan.pid, "starttime": start, "why": ["an orphan of the launch"]}])
    assert not Path(f"/proc/{orphan.pid}").exists()  # killed and reaped: no zombie left
    orphan.returncode = -9  # reaped by kill(): Popen must not wait for it


def test_the_lifecycle_promise_is_judged_before_the_leftovers_of_its_launch() -> None:
    # The task may take LIFECYCLE_SECONDS to go once its launcher is SIGKILLed (_kill_launcher times it
    # in the reader thread); run() calls after_exit a second after the launcher is gone. Before, the
    # leftovers were judged (and killed) while the promise's clock still ran.
    task = subprocess.Popen(["sleep", "2"])  # goes by itself, 2 s on: within the promise's time
    time.sleep(0.05)  # started before the watch: never "an orphan of the launch"
    watch = observer.Watch("t", "n", protected=(), host_namespaces={}, lifecycle=True)
    launcher = subprocess.Popen(["sleep", "60"], start_new_session=True)
    watch.launcher_pid = launcher.pid

    def handshake() -> None:  # as on_line does for a lifecycle launch
        watch._kill_launcher(task.pid)
        watch.signalled.set()

    reader = threading.Thread(target=handshake, daemon=True)
    try:
        reader.start()
        time.sleep(0.3)
        launcher.wait(timeout=10)
        watch.after_exit(launcher.pid)
        assert watch.lifecycle_result.get("gone_after") is not None, watch.lifecycle_result
        assert watch.survivors == []
        assert task.wait(timeout=10) == 0  # it went by itself, not by a leftover kill of ours
    finally:
        reader.join(timeout=10)
        for p in (task, launcher):
            p.kill()
            p.wait()


def test_a_process_whose_main_thread_exited_while_others_run_is_alive_and_read_through_them(
    tmp_path: Path,
) -> None:
    # SYS_exit in the main thread: /proc/PID/stat says Z and /proc/PID/fd lists nothing, yet the
    # process runs on. Before, it was taken for dead: never a leftover (nor killed), and what its
    # threads held never read.
    code = ("import ctypes, os, sys, threading, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\nos.chdir(sys.argv[1])\n"
            "threading.Thread(target=time.sleep, args=(30,)).start()\n"
            "print(fd, flush=True)\n"
            "ctypes.CDLL(None).syscall(60, 0)  # SYS_exit (x86_64): this thread only\n")
    if os.uname().machine != "x86_64":
        pytest.skip("SYS_exit's number here is x86_64's")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        fd = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while observer.stat_fields(Path(f"/proc/{proc.pid}/stat").read_text())["state"] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert observer.host_task(proc.pid) is not None
        mounts = mountinfo.parse(Path("/proc/self/mountinfo").read_text())
        serving = mountinfo.serving(mounts, str(tmp_path))
        assert serving is not None
        others = [m for m in mounts if m.mount_id != serving.mount_id]
        found = {d["fd"] for d in [*observer.held([proc.pid], others, {}, {}),
                                   *observer.places_out([proc.pid], others)]}
        assert {fd, "cwd"} <= found, found
        seen = observer.Seen(0, {}, "error", "error", "error", "", "error")
        left = observer.survivors(seen, proc.pid, host_namespaces={}, harness_sid=os.getsid(0))
        assert [p["pid"] for p in left] == [proc.pid]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


HANDED = r"""
import ctypes, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
params = (ctypes.c_uint32 * 30)()
params[2] = 2  # struct io_uring_params.flags = IORING_SETUP_SQPOLL
ring = libc.syscall(425, 4, params)  # io_uring_setup (the same number on x86_64 and aarch64)
libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
fan = libc.fanotify_init(0, os.O_RDONLY)  # FAN_CLASS_NOTIF
libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
assert ring >= 0 and fan >= 0 and libc.fanotify_mark(fan, 0x1 | 0x10, 0x20, -100, sys.argv[1].encode()) == 0
holder = subprocess.Popen(["sleep", "30"], pass_fds=[ring, fan])
print(holder.pid, ring, fan, flush=True)
holder.wait()
"""


def test_an_io_uring_polled_by_an_outsider_and_a_fanotify_group_on_outside_mounts_lead_out(
    root_only: None, tmp_path: Path,
) -> None:
    # Made by a process outside the task and handed to it: the ring's SQPOLL thread carries out its
    # requests as its maker (an openat of any host path); reading the group's events opens the host's
    # files they name. Before, every anon_inode but a pidfd was "the task's channel".
    maker = subprocess.Popen([sys.executable, "-c", HANDED, str(tmp_path)], stdout=subprocess.PIPE,
                             start_new_session=True)
    try:
        assert maker.stdout is not None
        task, ring, fan = map(int, maker.stdout.readline().split())
        mounts = mountinfo.parse(Path("/proc/self/mountinfo").read_text())
        serving = mountinfo.serving(mounts, str(tmp_path))
        assert serving is not None
        others = [m for m in mounts if m.mount_id != serving.mount_id]
        found = {d["fd"]: d["why"] for d in observer.held([task], others, {}, {})}
        assert f"host process {maker.pid}" in found.get(ring, ""), found
        assert f"mount {serving.mount_id}" in found.get(fan, ""), found
        # Its own ring (the maker a member) and a group on its own mounts are channels.
        mine = {d["fd"] for d in observer.held([task], mounts, {}, {}, members={task, maker.pid})}
        assert ring not in mine and fan not in mine
    finally:
        os.killpg(maker.pid, signal.SIGKILL)
        maker.wait()


def test_fanotify_inode_and_filesystem_marks_are_judged_by_their_filesystem() -> None:
    info = ("fanotify flags:1 event-flags:8000\n"
            "fanotify ino:13 sdev:fe00000 mflags:0 mask:20 ignored_mask:0 fhandle-bytes:8 fhandle-type:1\n")
    assert observer._fanotify_marks_outside(info, set(), {"254:0"}) == ""
    assert observer._fanotify_marks_outside(info, set(), {"254:1"}) == "the filesystem 254:0"
    assert observer._fanotify_marks_outside("fanotify mnt_id:1b mflags:0 mask:20\n", {27}, set()) == ""


def test_a_terminal_master_opened_outside_leads_out_and_a_starred_device_is_allowed() -> None:
    # A pty master (5:2) is on every allowlist that has /dev/ptmx; one opened on the host's /dev types
    # into a terminal of the host's. And an allowlist entry "*" (any device at that path) never matched.
    master, slave = os.openpty()
    null = os.open("/dev/null", os.O_RDWR)
    holder = subprocess.Popen(["sleep", "30"], pass_fds=[master, null], stdin=subprocess.DEVNULL)
    try:
        mounts = mountinfo.parse(Path("/proc/self/mountinfo").read_text())
        st = os.stat(f"/proc/{holder.pid}/fd/{master}")
        serving = next(m for m in mounts if m.dev == f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        others = [m for m in mounts if m.mount_id != serving.mount_id]
        allowed = {"/dev/ptmx": "5:2", "/dev/null": "*"}
        found = {d["fd"]: d["why"] for d in observer.held([holder.pid], others, {}, allowed)}
        assert "pseudo-terminal master" in found.get(master, ""), found
        assert null not in found, found
        assert master not in {d["fd"] for d in observer.held([holder.pid], mounts, {}, allowed)}
    finally:
        holder.kill()
        holder.wait()
        for fd in (master, slave, null):
            os.close(fd)


def test_a_cwd_moved_to_another_mount_of_the_same_directory_is_a_change(
    root_only: None, tmp_path: Path,
) -> None:
    # Two mounts of one directory (a bind, in a mount namespace of the test's own): the same device and
    # inode, another mount (and another `..`). Before, the looks compared device and inode only.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code = ("import os, signal, sys\n"
            "os.chdir(sys.argv[2])\n"
            "signal.signal(signal.SIGUSR1, lambda *_: (os.chdir(sys.argv[1]), print('moved', flush=True)))\n"
            "print('ready', flush=True)\n"
            "while True: signal.pause()\n")
    a, b = tmp_path / "a", tmp_path / "b"
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                             'mount --bind "$1" "$2" && exec "$0" -c "$3" "$1" "$2"',
                             sys.executable, str(a), str(b), code],
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        first = observer.snapshot(proc.pid)
        proc.send_signal(signal.SIGUSR1)
        assert proc.stdout.readline() == b"moved\n"
        then = observer.snapshot(proc.pid)
        assert first is not None and then is not None
        assert first["cwd"][:2] == then["cwd"][:2]  # the same directory
        assert any(d.startswith("cwd:") for d in observer.differences(first, then))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _fake_process(proc: Path, pid: int, pidns: str, ppid: int) -> None:
    (proc / str(pid) / "ns").mkdir(parents=True)
    (proc / str(pid) / "ns" / "pid").symlink_to(pidns)
    (proc / str(pid) / "stat").write_text(f"{pid} (x) S {ppid} " + "0 " * 40 + "\n")


def test_a_pid_number_reused_by_a_process_entering_the_tasks_namespace_is_read_again(tmp_path: Path) -> None:
    # `classified` remembered a number, not a process: a host process there at the handshake, gone, its
    # number taken later by a process entering the task's pid namespace, was never read.
    task_ns, host_ns = "pid:[4026532001]", "pid:[4026531836]"
    _fake_process(tmp_path, 10, task_ns, 1)  # the task
    _fake_process(tmp_path, 100, host_ns, 1)  # a host process at the handshake
    seen = observer.Seen(pid=10, namespaces={"pid": task_ns}, status={}, environ={}, mounts=(), cgroup="",
                         proc_stat={}, reached={"pids": [10]})
    classified = {10: False, 100: False}
    assert observer.joined(seen, host_ns, classified, tmp_path) == []
    shutil.rmtree(tmp_path / "100")  # gone...
    assert observer.joined(seen, host_ns, classified, tmp_path) == []
    _fake_process(tmp_path, 100, task_ns, 1)  # ...and its number now a joiner's
    assert observer.joined(seen, host_ns, classified, tmp_path) == [100]


def test_a_process_whose_descriptors_the_harness_may_not_read_is_unread_not_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An unprivileged harness gets EACCES on /proc/PID/fd of a process not dumpable (firejail's own,
    # born setuid, with some of its options) or another user's. Before, that was "gone": held() found
    # nothing there, and the promise was kept on what was never read.
    proc = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    listdir, opener = os.listdir, os.open

    def refused_listdir(path: Any) -> list[str]:
        if str(path).startswith(f"/proc/{proc.pid}/"):
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)

    def refused_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(f"/proc/{proc.pid}/"):
            raise PermissionError(13, "Permission denied", str(path))
        return opener(path, flags, *args, **kwargs)

    try:
        monkeypatch.setattr(os, "listdir", refused_listdir)
        monkeypatch.setattr(os, "open", refused_open)
        unread: list[int] = []
        assert observer.held([proc.pid], [], {}, {}, unread=unread) == []
        assert observer.places_out([proc.pid], [], unread=unread) == []
        monkeypatch.undo()
        assert unread == [proc.pid, proc.pid, proc.pid]  # its fd directory, its cwd, its root
    finally:
        proc.kill()
        proc.wait()


def test_a_task_unreadable_in_short_gaps_while_it_runs_is_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    # A sandbox author's way past UNREAD_SECONDS: hide the task from the host's reading in gaps shorter
    # than it, again and again. An exiting task never becomes readable again, so one gap is enough.
    task = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    readings = iter([None, None, {}, None, {}])
    monkeypatch.setattr(observer, "snapshot", lambda pid, proc=Path("/proc"): next(readings, {}))
    watch, looker = _looking(task, _reference={})
    try:
        assert len(watch.changes) == 1 and "could again after" in watch.changes[0], watch.changes
    finally:
        watch._stop.set()
        looker.join(timeout=5)
        task.kill()
        task.wait()


def _looking(task: subprocess.Popen[bytes], **watch_state: Any) -> tuple[observer.Watch, threading.Thread]:
    """A watch of `task` past its handshake, its looks running in a thread, and its first change
    awaited (10 s)."""
    watch = observer.Watch("t", "n", protected=(), host_namespaces={})
    watch._followed, watch._followed_start = task.pid, observer.host_task(task.pid)
    for name, value in watch_state.items():
        setattr(watch, name, value)
    watch.signalled.set()
    looker = threading.Thread(target=watch._look, daemon=True)
    looker.start()
    deadline = time.monotonic() + 10
    while not watch.changes and time.monotonic() < deadline:
        time.sleep(0.02)
    return watch, looker
