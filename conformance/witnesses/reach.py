"""What the task can reach from inside: the terminal it was started from, the other syscall doors, its
descriptors, the launcher's secret anywhere, the host's kernel settings, device nodes and unix
sockets."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_conformance.conformance import observer
from sandbox_conformance.conformance.harness import WitnessSession
from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.plugin import Settings
from sandbox_conformance.conformance.profile import expand

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _door,
    _inside,
    _seen,
    _task_view,
    witness,
)


@witness("terminal")
def test_the_task_cannot_type_into_the_terminal_it_was_started_from(
    sbxc_task: Task, sbxc_session: WitnessSession
) -> None:
    # A third launch, from a pseudo-terminal the harness holds (the launcher's controlling terminal,
    # the task's stderr), as a user runs a sandbox from a shell: the task must not be able to push
    # input into it (TIOCSTI), which a shell would run as typed (bwrap CVE-2017-5226).
    del sbxc_task
    r = sbxc_session.terminal()
    t = r.get("terminal")
    assert isinstance(t, dict) and "error" not in t, (
        f"the terminal launch gave no answer (exit {r.get('exit')}, timed out: {r.get('timed_out')}; "
        f"said {r.get('stderr')!r}): {t}"
    )
    tiocsti = t.get("tiocsti") or {}
    assert not tiocsti.get("ok") and not r.get("injected"), (
        f"the task pushed input into the terminal it was started from: TIOCSTI {tiocsti}, the terminal "
        f"read {r.get('injected')!r}; it holds /dev/tty: {t.get('dev_tty')}, session leader: "
        f"{t.get('session_leader')}"
    )


# ---- the other syscall doors: each answers as the profile's [syscalls] table says ---------------------


def _own_session_keyring() -> object:
    # The harness's session keyring (keyrings(7)), asked the way the task asked for its own, to say
    # whether the task's is the same one.
    from sandbox_conformance.conformance import inside

    return inside.door_keyctl().get("returned")


@witness("syscalls")
def test_every_other_syscall_door_answers_as_the_profile_says(
    sbxc_task: Task, sbxc_session: WitnessSession, sbxc_settings: Settings
) -> None:
    # io_uring, keyctl, the new mount API, AF_VSOCK, a ptrace of a process outside and TIOCLINUX: each
    # tried once by the task with arguments that change nothing (bubblewrap's and Flatpak's
    # try-syscall tests), each judged by the errno the profile names for it.
    doors = _inside(sbxc_task, "doors")
    seen = {name: _door(r) for name, r in doors.items() if isinstance(r, dict)}
    expected = sbxc_settings.profile.doors()
    promised = sbxc_settings.profile.promises()
    if "tioclinux" in seen and expected.get("tioclinux") != "allowed" and "terminal" in promised:
        # Only the terminal launch has a terminal to try it on.
        t = sbxc_session.terminal().get("terminal")
        if isinstance(t, dict) and isinstance(t.get("tioclinux"), dict):
            seen["tioclinux"] = _door(t["tioclinux"])
    wrong: dict[str, str] = {}
    for name, want in expected.items():
        if want == "allowed":
            continue
        got = seen.get(name, "not tried")
        if got.startswith("absent"):
            continue  # no such entry point here (no terminal, no keyctl number): nothing to open
        if got == "CREATED" or got.startswith(("could not", "not tried")):
            wrong[name] = "OPENED" if got == "CREATED" else got
        elif want != "refused" and got not in want:
            wrong[name] = f"{got}, the profile says {' or '.join(want)}"
    if "OPENED" in wrong.get("keyctl", "") and doors["keyctl"].get("returned") == _own_session_keyring():
        wrong["keyctl"] += " (the harness's own session keyring)"
    assert not wrong, f"doors that did not answer as the profile says: {wrong}; every door: {seen}"


# ---- what the task holds and reaches: descriptors, the secret anywhere, kernel settings, devices, sockets --
# Every profile makes these promises unless it disclaims one ([promises] not_claimed). Each is judged
# from both sides: what the task managed from inside, and what the host's kernel shows around it.


def _reach(task: Task) -> dict[str, Any]:
    reached = dict(_seen(task).reached)
    assert reached, "the host did not read what the task holds (no reach reading)"
    return reached


@witness("descriptors")
def test_the_task_holds_no_descriptor_that_leads_out(sbxc_task: Task) -> None:
    host = {} if _task_view(sbxc_task) else _reach(sbxc_task)
    held = [f"pid {d['pid']} fd {d['fd']} -> {d['link']}: {d['why']}" for d in host.get("descriptors", [])]
    # What the sandbox's helpers came to hold after the handshake, or a process that entered the task's
    # pid namespace since (`runc exec`), is the task's too.
    held += [f"pid {d['pid']} ({d['who']}) fd {d['fd']} -> {d['link']}: {d['why']}"
             for d in sbxc_task.held_late]
    inside = _inside(sbxc_task, "descriptors")
    # From inside: a directory the task can climb out of, a socket that is connected or listening.
    walked = [
        f"fd {d['fd']} ({d.get('link')}): a directory whose '..' lists {d['parent'].get('listing')}"
        for d in inside
        if d.get("type") == "dir" and isinstance(d.get("parent"), dict) and d["parent"].get("ok")
    ]
    sockets = [
        f"fd {d['fd']} ({d.get('link')}): a socket, peer {d.get('peer')}"
        for d in inside
        if d.get("type") == "socket"
        and (d.get("listening") or not str(d.get("peer", "")).startswith("error"))
    ]
    assert not held and not walked and not sockets, (
        f"descriptors that lead out of the sandbox: host sees {held}; the task walked {walked}; "
        f"sockets {sockets}"
    )
    if host.get("unread"):
        # Nothing found, but not everything read: a process of the task's pid namespace whose
        # descriptors, cwd or root the harness may not read (an unprivileged harness, a process of
        # another user's or not dumpable: firejail's own, setuid-born). Unknown is never a pass.
        pytest.skip(f"cannot tell what host pids {host['unread']} of the task's pid namespace hold: the "
                    "harness may not read their /proc/PID/fd, cwd or root (EACCES: another user's, or not "
                    "dumpable); run as root to see them")


@witness("secrets")
def test_the_launchers_secret_is_readable_nowhere_in_the_task(sbxc_task: Task) -> None:
    reached = {} if _task_view(sbxc_task) else _reach(sbxc_task)
    holders = list(reached.get("secret_holders", []))
    later = list(sbxc_task.secret_late)
    files = [f"{e['host_path']} at {e['path']}" for e in reached.get("secret_file", [])]
    scan = _inside(sbxc_task, "secrets")
    inside = list(scan.get("found", []))
    from_fds = [f"fd {d['fd']}" for d in sbxc_task.get("descriptors") or [] if d.get("secret")]
    left = list(sbxc_task.secret_files)
    assert not (holders or later or files or inside or from_fds or left), (
        "the launcher's secret is readable in the task: "
        + "; ".join(
            f"{what}: {where}"
            for what, where in (
                ("host sees it in", holders),
                ("host sees it, after the handshake, in", later),
                ("its file is reachable", files),
                ("the task read it from", inside + from_fds),
                ("written where the task works", left),
            )
            if where
        )
    )


@witness("kernel_interfaces")
def test_the_hosts_kernel_settings_cannot_be_opened_for_writing(sbxc_task: Task) -> None:
    tried = _inside(sbxc_task, "kernel_writes")
    assert tried, "no kernel setting was tried"
    view = _task_view(sbxc_task)
    host = {} if view else _reach(sbxc_task)
    # A binfmt_misc instance the host tells is a user namespace's own registers handlers for that
    # namespace's execs alone; the host's, or one it could not tell, is a way out (never excused).
    binfmt_mounts = host.get("binfmt_mounts", [])
    binfmt = {b["mount_point"].rstrip("/") + "/register": b["instance"] for b in binfmt_mounts}

    def shown(t: dict[str, Any]) -> str:
        if t.get("wrote_back"):
            return f"{t['path']} (written back)"
        if t.get("write_errno"):
            return f"{t['path']} (write-back: {t['write_errno']})"
        return f"{t['path']} ({binfmt[t['path']]} binfmt_misc instance)" if t["path"] in binfmt else t["path"]

    # A write-back the kernel refused for want of permission is a setting out of reach, opened or not:
    # some files check again at write (a v1 release_agent without CAP_SYS_ADMIN in the initial user
    # namespace). Any other failure of the write (EINVAL, say) says nothing of another value's.
    opened = [
        shown(t)
        for t in tried
        if t.get("opened") and t.get("write_errno") not in ("EPERM", "EACCES", "EROFS")
        and binfmt.get(t["path"]) != observer.OWN
    ]
    proc_sys = "(the host cannot observe the task)" if view else host.get("proc_sys")
    # What the host sees read-write in the task, for a task that is root on the host: its cgroup
    # hierarchies from their root, and a binfmt_misc instance not the task's own. The task must have
    # tried a file of each (unknown is never a pass); a trial that found no such file there tried nothing.
    tried_paths = [str(t["path"]) for t in tried if t.get("errno") != "ENOENT"]
    reached = [
        *((c["mount_point"], c["fstype"]) for c in host.get("cgroup_roots", [])),
        *((b["mount_point"], f"binfmt_misc, {b['instance']} instance")
          for b in binfmt_mounts if b["instance"] != observer.OWN),
    ]
    untried = [
        f"{point} ({what})"
        for point, what in reached
        if not any(p.startswith(point.rstrip("/") + "/") for p in tried_paths)
    ]
    assert not opened and not untried, "; ".join(
        [
            *([f"the task opened host kernel settings for writing: {opened}"] if opened else []),
            *([f"the host sees these read-write in the task (a cgroup hierarchy from its root, a binfmt_misc "
               f"instance not the task's own), and the task tried none of their files: {untried}"]
              if untried else []),
            f"the mount serving /proc/sys in the task, as the host reads it: {proc_sys}",
        ]
    )


# errnos of open(2) that only a device's driver gives (its open method ran: nothing refused the path,
# the device node or its number), never a permission check: EPERM (a devices cgroup or BPF program),
# EACCES (modes, nodev, an LSM) and EROFS are refusals; ENXIO and ENODEV say no device is behind it.
DRIVER_ANSWERED = frozenset({"EBUSY", "EIO", "EAGAIN"})


@witness("devices")
def test_only_allowlisted_device_nodes_can_be_opened(sbxc_task: Task) -> None:
    tried = _inside(sbxc_task, "devices")
    opened = [
        f"{d['path']} ({d['rdev']}, {d.get('how')})"
        for d in tried
        if d.get("opened") and not d.get("allowed")
    ]
    # Not opened, but not refused either: the open got through to the device's driver, which said no
    # for now (held exclusively: a TPM, a VFIO group; an I/O error). Another time it opens.
    answered = [
        f"{d['path']} ({d['rdev']}, {'/'.join(d.get('refused', []))})"
        for d in tried
        if not d.get("opened") and not d.get("allowed") and set(d.get("refused", ())) & DRIVER_ANSWERED
    ]
    opened += [f"{a}: the driver answered" for a in answered]
    tried_paths = {d["path"] for d in tried}
    seen = [] if _task_view(sbxc_task) else _reach(sbxc_task)["devices"]
    # The host sees a node the task never tried: a path outside /dev (a node bound next to a minimal /dev)
    # or one the task's own listing missed. Whether it would open is then unknown: never a pass. Not one
    # that appeared after the task looked (`late`: made after the host began reading, by its ctime).
    untried = [f"{d['path']} ({d['rdev']})" for d in seen
               if d["path"] not in tried_paths and not d.get("late")]
    assert not opened and not untried, (
        f"device nodes off the allowlist: the task opened {opened}; the host sees, untried, {untried}"
    )


URING_NO_SOCKET = ("io_uring_setup", "io_uring mmap", "io_uring socket")  # inside.py uring_unix_connect
# What a seccomp filter or an LSM answers socket(AF_UNIX) with (SCMP_ACT_ERRNO's EPERM, ENOSYS, an
# address family refused; EACCES from a security hook).
SOCKET_REFUSED = ("EPERM", "EACCES", "ENOSYS", "EAFNOSUPPORT")


def _no_uring_socket(trial: dict[str, Any]) -> bool:
    uring = trial.get("io_uring")
    return isinstance(uring, dict) and uring.get("stage") in URING_NO_SOCKET


@witness("host_sockets")
def test_no_host_unix_socket_can_be_connected_to(sbxc_task: Task, sbxc_settings: Settings) -> None:
    allowed = {expand(p, sbxc_task.values) for p in sbxc_settings.profile.unix_allowed}
    tried = _inside(sbxc_task, "unix_sockets")
    connected = [t["path"] for t in tried if t.get("ok") and t["path"] not in allowed]
    # A sandbox that refuses socket(AF_UNIX) outright (srt's seccomp filter) leaves a socket file it
    # shows unusable: the task's first step fails before any path is looked up. Only then is what the
    # host sees not a way out; the task tried every one (the planted socket among them), by socket(2)
    # and by io_uring (IORING_OP_SOCKET, which no seccomp filter sees): neither made a socket.
    # A refusal, not a shortage: EMFILE or ENOBUFS at socket(2) (a tiny RLIMIT_NOFILE, memory) says
    # nothing of what the sandbox lets through.
    outright = bool(tried) and all(t.get("stage") == "socket" and t.get("errno") in SOCKET_REFUSED
                                   and _no_uring_socket(t) for t in tried)
    exposed = [
        f"{e['host_path']} at {e['path']}"
        for e in ([] if _task_view(sbxc_task) else _reach(sbxc_task)["sockets"])
        if e["path"] not in allowed and e["host_path"] not in allowed and not outright
    ]
    knocks = sbxc_task.knocks
    assert not connected and not exposed and not knocks, (
        f"host unix sockets reachable from the task: it connected to {connected}; the host sees {exposed}"
        + (f"; the planted daemon socket took {knocks} connection(s)" if knocks else "")
    )
