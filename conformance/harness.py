"""One witness session: the host side of a task (layout, canaries, listeners), the probe findings
the witnesses need, one launch per distinct task (cached), and removal of all of it.

Used by the pytest plugin's fixtures and by anyone who wants live observations from Python:

    with WitnessSession(profile.load(None)) as s:
        task = s.task()
        task.observed("append", f"{task.values['control']}/system_prompt.txt")  # -> "EROFS"
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from sandbox_conformance.conformance import (
    bwrap_argv,
    cgroup_leaf,
    claims,
    layout,
    observer,
    plan,
    ptrace_target,
)
from sandbox_conformance.conformance.launch import (
    REFERENCE,
    SECRET_ENV,
    SPEC_ENV,
    Launcher,
    LauncherKind,
    NoObservation,
    as_user_prefix,
    launch,
)
from sandbox_conformance.conformance.preconditions import findings, needed
from sandbox_conformance.conformance.profile import Profile, expand
from sandbox_conformance.kernel import netif
from sandbox_conformance.kernel.cgroupfs import own_cgroup
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes import cancel, kills, owner
from sandbox_conformance.processes.children import Background, Completed, minimal_env, run, settle_fork_hooks

# The neighbour leaf's limits when the profile sets none (a leaf with "max" everywhere would not show
# a successful write of "max").
NEIGHBOUR_MEMORY_MAX = 64 << 20
IPC_CREAT, IPC_EXCL, IPC_RMID = 0o1000, 0o2000, 0  # <linux/ipc.h>
NEIGHBOUR_PIDS_MAX = 16


def system_links(names: Iterable[str] = bwrap_argv.SYSTEM_DIRS) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for d in names:
        if os.path.islink(d):
            out[d] = os.readlink(d)
        elif os.path.isdir(d):
            out[d] = None
    return out


def _cmdline(pid: int | str) -> tuple[str, ...]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(raw.decode(errors="replace").rstrip("\0").split("\0"))


def _host_addresses() -> list[str]:
    """Up to two of the host's non-loopback IPv4 addresses: a shared network namespace reaches the
    listener through them too (kernel/netif.py: each interface's primary address)."""
    return [a for name, addrs in netif.ipv4_addresses().items() if name != "lo" for a in addrs][:2]


class WitnessSession(contextlib.AbstractContextManager["WitnessSession"]):
    def __init__(
        self,
        profile: Profile,
        launcher: Launcher = REFERENCE,
        *,
        as_user: str | None = None,
        timeout: float = 30.0,
        perturbations: frozenset[str] = frozenset(),
        preconditions: Mapping[str, Finding] | None = None,
        bwrap: str | None = None,
        unobservable: str | None = None,
        harness_leaf: bool = False,
        launcher_env: Mapping[str, str] | None = None,
        layout_root: str | None = None,
    ) -> None:
        """`unobservable`: the launcher runs tasks where this host's kernel cannot see them (a remote
        engine, a VM-based sandbox), and why. No handshake is made; every promise about kernel state
        is then `not tested` with that reason, never judged on the task's own word."""
        self.profile, self.launcher, self.as_user = profile, launcher, as_user
        self.timeout, self.perturbations = timeout, perturbations
        self._preconditions = dict(preconditions) if preconditions is not None else None
        self._bwrap = bwrap
        self.unobservable = unobservable
        self.harness_leaf = harness_leaf
        self.launcher_env = dict(launcher_env or {})
        self.layout_root = layout_root
        self._stack = contextlib.ExitStack()
        self._tasks: dict[str, plan.Task | NoObservation] = {}
        self._started: dict[str, Background[plan.Task | NoObservation]] = {}
        self.layout: layout.Layout | None = None
        self.host: plan.HostView | None = None
        self._daemon: socket.socket | None = None
        self._lifecycle: dict[str, Any] | NoObservation | None = None
        # Every launch of a task this session started (the main one, the lifecycle and terminal ones):
        # the report says how many, which bench/run_bench.py's floor counts.
        self.launches = 0
        self._terminal: dict[str, Any] | NoObservation | None = None
        # Made when the launches run side by side: what each claims (conformance/claims.py).
        self._claims: claims.Claims | None = None
        self._host_sockets: tuple[str, ...] = ()

    # -- host side ------------------------------------------------------------------------------
    def __enter__(self) -> WitnessSession:
        try:
            self.layout = layout.create(
                control_files=self.profile.task.control_files or ("system_prompt.txt",),
                as_user=self.as_user,
                temp_root=self.layout_root,
                names=self.profile.layout,
            )
            self._stack.callback(layout.remove, self.layout)
            self._stack.callback(self._join_started)  # runs first: the stack unwinds in reverse
            self.host = self._open_host_side(self.layout.nonce)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _open_host_side(self, nonce: str) -> plan.HostView:
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._stack.callback(tcp.close)
        tcp.bind(("0.0.0.0", 0))
        tcp.listen(8)
        port = tcp.getsockname()[1]
        abstract = f"{self.layout.task_id if self.layout else 'task'}-{nonce}"  # no name of ours
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._stack.callback(unix.close)
        unix.bind("\0" + abstract)
        unix.listen(8)
        targets = tuple((a, port) for a in ["127.0.0.1", *_host_addresses()])
        # Beside the layout, where no profile path leads: a platform daemon's socket (0777, so file modes
        # refuse no task) and the launcher's .env. Neither may be reachable from the task.
        assert self.layout is not None
        run_dir = self.layout.root / "run"
        run_dir.mkdir(mode=0o755)
        unix_path = str(run_dir / "agentd.sock")
        daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._stack.callback(daemon.close)
        _bind_long(daemon, run_dir, "agentd.sock")
        os.chmod(unix_path, 0o777)
        daemon.listen(64)
        daemon.setblocking(False)
        self._daemon = daemon
        secret_value = f"sk-{nonce}{secrets.token_hex(8)}"  # shaped like an API key, nothing of ours
        secret_file = self.layout.root / ".env"
        secret_file.write_text(f"{SECRET_ENV}={secret_value}\n")
        secret_file.chmod(0o644)
        self._host_sockets = (*observer.host_sockets(), unix_path)
        shm_key = self._shm_segment()
        # The process the task must not ptrace: one of the task's user that lets anyone attach, so only
        # the sandbox refuses it (conformance/ptrace_target.py); the harness where none could start.
        target = ptrace_target.start(as_user_prefix(self.as_user))
        if target is not None:
            observer.OWN_HELPERS.add(target.pid)
            self._stack.callback(observer.OWN_HELPERS.discard, target.pid)
            self._stack.callback(target.stop)
        spaces = {}
        for ns in ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts"):
            with contextlib.suppress(OSError):
                spaces[ns] = os.readlink(f"/proc/self/ns/{ns}")
        return plan.HostView(
            namespaces=spaces,
            harness_pid=os.getpid(),
            harness_cmdline=_cmdline("self"),
            pid1_cmdline=_cmdline(1),
            hostname=socket.gethostname(),
            tcp_targets=targets,
            abstract_name=abstract,
            secret_key=SECRET_ENV,
            secret_value=secret_value,
            cgroup=_own_cgroup(),
            unix_path=unix_path,
            secret_file=str(secret_file),
            shm_key=shm_key,
            # None started: 0, and the plan's doors target the harness (plan.build).
            ptrace_pid=target.pid if target is not None else 0,
            ptrace_cmdline=target.cmdline if target is not None else (),
        )

    def _shm_segment(self) -> int:
        """A System V shared memory segment of the host's ipc namespace (0600, one page), removed with the
        session: the key a task with an ipc namespace of its own cannot find. 0 where none can be made.
        Labelled for the sweep before it exists (IPC objects outlive their creator, and a SIGKILLed run
        would leave it; processes/owner.py label_shm)."""
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(8):
            key = secrets.randbelow(0x7FFFFFFF) + 1
            try:
                label = owner.label_shm(key, tempfile.gettempdir())
            except OSError:
                return 0
            flags = ctypes.c_int(IPC_CREAT | IPC_EXCL | 0o600)
            shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(4096), flags)
            if shmid >= 0:
                self._stack.callback(os.unlink, label)
                self._stack.callback(libc.shmctl, ctypes.c_int(shmid), ctypes.c_int(IPC_RMID), None)
                return key
            os.unlink(label)
            if ctypes.get_errno() != errno.EEXIST:
                return 0
        return 0

    @property
    def preconditions(self) -> dict[str, Finding]:
        if self._preconditions is None:
            reference = self.launcher.kind is LauncherKind.reference
            self._preconditions = findings(self.as_user, probes=needed(reference))
        return self._preconditions

    def nested_userns_skip(self) -> str | None:
        """Why the nested-userns witness cannot be claimed, or None. Only the reference launcher is
        checked: it passes --disable-userns only where the probe saw it work. An external launcher
        made its own promise; if it cannot keep it, the witness goes red."""
        if self.launcher.kind is not LauncherKind.reference:
            return None
        f = self.preconditions.get("disable_userns")
        if f is None:
            return (
                "disable_userns probe did not report: bwrap cannot be shown to refuse nested user namespaces"
            )
        if f.verdict is not Verdict.supported:
            return f"disable_userns probe: {f.verdict}: {f.reason}"
        return None

    def cgroup_root(self) -> tuple[Path | None, str]:
        """Where each task's leaf is made, or (None, why not). The cgroup.delegation probe already
        weighs the promise (SANDBOX_CONFORMANCE_CGROUP_ROOT: set but unusable is `denied`) against
        the root it resolved itself, and proved a memory.max write under it."""
        f = self.preconditions.get("cgroup.delegation")
        if f is None:
            return None, "cgroup.delegation probe did not report"
        if f.ok and f.facts.get("root"):
            return Path(str(f.facts["root"])), f.reason
        return None, f"cgroup.delegation: {f.verdict}: {f.reason}"

    # -- launching ------------------------------------------------------------------------------
    def facts(self) -> bwrap_argv.Facts:
        bwrap = self._bwrap or Host().which("bwrap")
        if bwrap is None:
            raise NoObservation("reference launcher (bwrap): no bwrap on PATH")
        python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
        f = self.preconditions.get("disable_userns")
        return bwrap_argv.Facts(
            bwrap=bwrap, python=python, disable_userns=bool(f and f.ok), system_links=system_links()
        )

    def spec(self) -> dict[str, Any]:
        """What an external launcher reads (conformance/schemas/task-spec.schema.json): the layout's
        placeholder values and the whole profile resolved against them, so a launcher can build its
        sandbox from the spec alone and hard-code no path."""
        assert self.layout is not None
        values, prof = self.layout.values(), self.profile
        fs, t, ns, pr = prof.filesystem, prof.task, prof.namespaces, prof.process

        def paths(templates: tuple[str, ...]) -> list[str]:
            return [expand(x, values) for x in templates]

        return {
            "version": 1,
            "profile": prof.name,
            **values,
            "environment_allow": list(prof.environment.allow or ()),
            "environment_set": {k: expand(v, values) for k, v in prof.environment.set.items()},
            "network": str(prof.network),
            "nested_userns": str(prof.nested_userns),
            # The resolved profile. A key absent from the profile is empty here (or null): no promise.
            "filesystem": {
                "read_only": paths(fs.read_only),
                "masked": paths(fs.masked),
                "writable": paths(fs.writable),
                "absent": paths(fs.absent),
                "hidden": paths(fs.hidden),
                "scratch": paths(fs.scratch),
                "refuse": list(fs.refuse),
            },
            "task": {
                "control": expand(t.control, values) if t.control else None,
                "control_files": list(t.control_files),
                "user_tmp": expand(t.user_tmp, values) if t.user_tmp else None,
                "workdir": expand(t.workdir, values) if t.workdir else None,
            },
            "network_allowed": list(prof.network_allowed),
            "namespaces": {
                "pid": str(ns.pid),
                "ipc": str(ns.ipc),
                "uts": str(ns.uts),
                "hostname": ns.hostname,
            },
            "process": {"capabilities": str(pr.capabilities), "no_new_privs": pr.no_new_privs},
            "limits": {"memory_max": prof.limits.memory_max, "pids_max": prof.limits.pids_max},
        }

    def argv(self, script: str | None = None) -> tuple[str, ...]:
        assert self.layout is not None
        values = self.layout.values()
        if self.launcher.kind is LauncherKind.reference:
            try:
                inner = bwrap_argv.reference_argv(self.profile, values, self.facts(), self.perturbations)
            except bwrap_argv.UnbuildableProfile as e:
                raise NoObservation(f"{self.launcher.name}: {e}") from None
        else:
            inner = self.launcher.argv(self.spec(), values, script)
        return (*as_user_prefix(self.as_user), *inner)

    def _script(self) -> str | None:
        """Where the witness program goes for this launch, or None for stdin: a script of no meaning in
        the task's working directory, run as `python3 PATH`, the way a platform hands a sandbox a task,
        for an external launcher that did not ask for stdin (and whose profile promises a workdir the
        task can see). Fresh per launch."""
        workdir = self.profile.task.workdir
        if self.launcher.kind is not LauncherKind.external or self.launcher.stdin or workdir is None:
            return None
        assert self.layout is not None
        return f"{expand(workdir, self.layout.values())}/{secrets.token_hex(4)}.py"

    def _launcher_env(self) -> dict[str, str]:
        """The launcher's environment: minimal, the planted secret, and the task spec only where the
        launcher asked for it (written only then)."""
        assert self.layout is not None and self.host is not None
        extra = {SECRET_ENV: self.host.secret_value}
        if self.launcher.spec or self.launcher.kind is LauncherKind.entry_point:
            extra[SPEC_ENV] = str(layout.write_spec(self.layout, self.spec()))
        # The launcher's own settings first: the spec and the planted secret are the harness's.
        return minimal_env({**self.launcher_env, **extra})

    def start(self, key: str = "main") -> None:
        """Launch the task now, in the background; task(key) then waits for it. The witness command
        starts the main task before it imports pytest, so the launch (the precondition probes it waits for,
        bwrap, the task's run, the host's observation of it) overlaps that import on another core
        rather than following it. The same launch as task() makes: only its start moves earlier."""
        if self.layout is None:
            raise NoObservation("witness session used outside its `with` block")
        if key in self._tasks or key in self._started:
            return
        # A thread of its own, known before a stop signal can unwind us (cancel.deferred): a signal
        # inside an executor's submit left its worker idle and unknown to concurrent.futures' exit
        # handler, and the interpreter's exit joined it for ever (issue 28).
        # The launch forks while this thread imports pytest, which imports logging (settle_fork_hooks).
        settle_fork_hooks()
        with cancel.deferred():
            self._started[key] = Background(self._attempt_and_more if key == "main" else self._attempt,
                                            name=f"sbxc-launch-{key}")

    def _attempt_and_more(self) -> plan.Task | NoObservation:
        """The main launch and the lifecycle and terminal launches its promises ask for, before pytest
        asks, overlapping its import and the other witnesses.

        Through the reference sandbox, side by side, each judging only its own leftovers
        (conformance/claims.py): one after the other, they were two thirds of a native run's wall
        time (bench/run_bench.py). Its launches share nothing on the host: their namespaces, mounts and
        processes are each their own. Another sandbox may share host-side state between launches in
        one directory, and then one changes the other while it runs: side by side, srt's `unchanged`
        went red in 2 of 16 runs, its binds over the workdir's dotfiles coming and going under the
        task. srt makes an empty file on the host for each absent path it denies, binds over it and
        removes it when its launch ends, and unlinking a mount point detaches the mounts on it in every
        namespace (Linux 3.18, fs/namei.c vfs_unlink -> detach_mounts). Two tasks in one directory at
        once is not how a platform runs them, nor a verdict on the sandbox: its launches go one after
        the other, the main one first (a failed main launch is the harness error every witness
        reports; the others are not made)."""
        made = set(self.profile.promises())
        more = [k for k in ("lifecycle", "terminal") if k in made]
        if self.launcher.kind is not LauncherKind.reference or not more:
            got = self._attempt()
            if not isinstance(got, NoObservation):
                for key in more:
                    self._made(key)
            return got
        self._claims = claims.Claims(("main", *more))
        self._claims.started("main")
        # One thread for the two, one after the other: three sandboxes at once on two cores was slower
        # still (measured: 477 against 464 ms, medians of 25).
        beside = Background(self._made, *more, name="sbxc-launch-more")
        try:
            return self._attempt()
        finally:
            self._claims.judged("main")  # a main launch that never came to judge holds no one up
            beside.join()

    def _made(self, *keys: str) -> None:
        for key in keys:
            if self._claims is not None:
                # Only now: the launches after this one in this thread cannot start before it returns,
                # so its clean-up must not wait for their judgement (conformance/claims.py).
                self._claims.started(key)
            try:
                if key == "lifecycle":
                    self._lifecycle = _or_error(self._lifecycle_launch)
                else:
                    self._terminal = _or_error(self._terminal_launch)
            finally:
                if self._claims is not None:
                    self._claims.judged(key)

    def _attempt(self) -> plan.Task | NoObservation:
        try:
            return self._launch()
        except NoObservation as e:
            return e

    def _join_started(self) -> None:
        """Before the layout goes: a launch still under way uses it. Waited for, not read: what it
        raised was for task() to report, if anyone asked. A cancelled run's launch ends promptly: its
        child's group is stopped by processes/cancel.py, and a worker thread starts no new child after
        the signal, nor keeps one it started as the signal came (processes/children.py)."""
        for started in self._started.values():
            started.join()

    def task(self, key: str = "main") -> plan.Task:
        """The live task's observations: launched once per key, cached (a failure is cached too,
        so every witness of a broken launch reports the same harness error without relaunching)."""
        cached = self._tasks.get(key)
        if cached is None:
            started = self._started.pop(key, None)
            cached = started.result() if started is not None else self._attempt()
            self._tasks[key] = cached
        if isinstance(cached, NoObservation):
            raise cached
        return cached

    @property
    def leaves_by_harness(self) -> bool:
        return self.launcher.kind is LauncherKind.reference or self.harness_leaf

    def protected(self) -> list[observer.Protected]:
        """Host paths whose content must be reachable under no name inside the task."""
        assert self.layout is not None
        values, fs = self.layout.values(), self.profile.filesystem
        return [observer.Protected(t, expand(t, values)) for t in (*fs.masked, *fs.absent)]

    def _launch(self) -> plan.Task:
        if self.layout is None or self.host is None:
            raise NoObservation("witness session used outside its `with` block")
        lay, values = self.layout, self.layout.values()
        script = self._script()
        argv = self.argv(script)
        env = self._launcher_env()
        cgroup: dict[str, Any] | None = None
        root, _ = self.cgroup_root()
        if not self.leaves_by_harness:
            # The harness makes and enters a leaf only for its own sandbox. Any other launcher's
            # limits are its own promise, judged on the cgroup the host sees the task in.
            root = None
        launch_nonce = secrets.token_hex(8)
        tag = None if self.unobservable else observer.tag(launch_nonce)
        made = set(self.profile.promises())
        watch = self._watch(tag, launch_nonce, made)
        # The task waits at most this long for the host to release it; the launch's own timeout
        # must leave room for the rest of the task after it.
        handshake = max(1.0, min(10.0, self.timeout / 3))
        build = functools.partial(
            plan.build,
            self.profile,
            values,
            lay.nonce,
            self.host,
            task_uid=lay.owner_uid,
            launch_nonce=launch_nonce,
            tag=tag,
            handshake_seconds=handshake,
        )
        the_plan = build()
        after: dict[str, str | None] = {}
        try:
            with contextlib.ExitStack() as leaf_stack:
                leaf: cgroup_leaf.Leaf | None = None
                killer: _TreeKill | None = None
                runner = run
                if root is not None:
                    neighbour, leaf = self._leaves(leaf_stack, root)
                    if "leaf_not_entered" not in self.perturbations:
                        argv = (*leaf.enter_argv(), *argv)
                    neighbour_before = _read(neighbour.path / "memory.max")
                    if "cgroup" in self.profile.promises():
                        # Only a profile with [limits] is asked about them: the trials, the tree and
                        # its kill. Without the promise the leaf still holds the task, untested.
                        trials = plan.cgroup_trials(self.profile, values, lay.nonce, str(neighbour.path))
                        the_plan = build(cgroup=trials)
                        killer = _TreeKill(leaf, Path(trials["tree_marker"]), timeout=self.timeout)
                        leaf_stack.callback(killer.stop)
                        killer.start()
                        runner = killer.runner
                program = plan.program(the_plan)
                if script is not None:
                    plan.write_script(script, program)
                self.launches += 1
                doc = launch(
                    self.launcher.name,
                    argv,
                    None if script is not None else program,
                    env=env,
                    timeout=self.timeout,
                    cwd=str(lay.root),
                    runner=runner,
                    hooks={
                        "on_line": watch.on_line,
                        "after_exit": watch.after_exit,
                        "on_start": watch.on_start,
                    },
                )
                if leaf is not None:
                    if killer is not None:
                        killer.stop()
                    cgroup = _cgroup_seen(leaf, killer, neighbour, neighbour_before)
        except cgroup_leaf.CgroupUnusable as e:
            raise NoObservation(f"{self.launcher.name}: task cgroup: {e}") from None
        finally:
            watch.stop_looking()
            knocks = self._knocks()
            after = plan.host_after(the_plan.host_checks)
            _remove_planted_outside(after, lay.root)
        check_document(self.launcher.name, doc, the_plan)
        unobserved = self.unobservable
        seen, unseen = _bound(watch, doc)
        return plan.Task(
            doc=doc,
            plan=the_plan,
            values=values,
            host=self.host,
            host_after=after,
            launcher=self.launcher.name,
            argv=argv,
            cgroup=cgroup,
            seen=seen,
            unobserved=unobserved and f"the host cannot observe this task ({unobserved})",
            # A document with no live task behind it: every kernel-state witness fails saying so.
            unseen=unseen,
            changes=tuple(watch.changes),
            looks=watch.looks,
            held_late=tuple(watch.held_late),
            secret_late=tuple(watch.secret_late),
            survivors=tuple(watch.survivors or ()),
            host_devices=watch.host_devices,
            knocks=_from_task(knocks, watch.seen),
            secret_files=tuple(
                plan.files_holding(
                    self.host.secret_value,
                    [expand(p, values) for p in (self.profile.task.workdir, self.profile.task.user_tmp) if p],
                )
            )
            if "secrets" in made
            else (),
        )

    def _watch(self, tag: str | None, launch_nonce: str, made: set[str]) -> observer.Watch:
        """The host's watch of one launch: what it looks for in the task's reach (the secret, the
        host's sockets, device nodes beyond the allowlist) and which process carries the tag."""
        assert self.host is not None
        asked = observer.Reach(
            secret=self.host.secret_value if "secrets" in made else "",
            secret_file=self.host.secret_file,
            sockets=self._host_sockets if "host_sockets" in made else (),
            devices={**plan.DEVICES, **{d: "*" for d in self.profile.devices_allowed}},
        )
        return observer.Watch(tag or "", launch_nonce, protected=self.protected(),
                              host_namespaces=self.host.namespaces, asked=asked, claims=self._claims,
                              key="main", kill_wait=self.timeout)

    def _leaves(self, stack: contextlib.ExitStack, root: Path) -> tuple[cgroup_leaf.Leaf, cgroup_leaf.Leaf]:
        """(a neighbour task's leaf, the task's own): the sibling with limits of its own the task
        must not be able to write to, then the task's leaf with the profile's limits, entered by the
        shim before the launcher (or setpriv) executes; both killed and removed on the way out by
        `stack`, whatever happened."""
        lim = self.profile.limits
        neighbour = stack.enter_context(cgroup_leaf.task_leaf(
            root, cgroup_leaf.unique_name("neighbour"),
            cgroup_leaf.LeafLimits(memory_max=lim.memory_max or NEIGHBOUR_MEMORY_MAX,
                                   pids_max=lim.pids_max or NEIGHBOUR_PIDS_MAX)))
        limits = cgroup_leaf.LeafLimits(memory_max=lim.memory_max, pids_max=lim.pids_max)
        if "limits_dropped" in self.perturbations:
            # The negative control: the leaf is made and entered, nothing is written.
            limits = cgroup_leaf.LeafLimits(swap_max=None)
        return neighbour, stack.enter_context(cgroup_leaf.task_leaf(root, cgroup_leaf.unique_name("task"),
                                                                    limits))

    def _bare_plan(self, nonce: str, *, tag: str | None = None, terminal: bool = False) -> plan.Plan:
        """A plan for a launch that asks one thing (the lifecycle, the terminal): no ops, so nothing it
        does can collide with the main launch's files."""
        assert self.layout is not None
        return plan.Plan(
            task_id=self.layout.task_id,
            ops=(),
            tcp=(),
            unix_abstract=(),
            nested_userns=False,
            launch_nonce=nonce,
            tag=tag,
            handshake_seconds=max(1.0, min(10.0, self.timeout / 3)),
            terminal=terminal,
        )

    def lifecycle(self) -> dict[str, Any]:
        """The lifecycle promise's launch (made once, cached): a task that only announces itself and
        waits; the host finds it, SIGKILLs its launcher, and records how long the task took to go and
        what the launch left running. The plan holds no ops: nothing it does may collide with the main
        launch's files."""
        self._join_started()  # made after the main launch where that was started early
        if self._lifecycle is None:
            self._lifecycle = _or_error(self._lifecycle_launch)
        if isinstance(self._lifecycle, NoObservation):
            raise self._lifecycle
        return self._lifecycle

    def _lifecycle_launch(self) -> dict[str, Any]:
        if self.layout is None or self.host is None:
            raise NoObservation("witness session used outside its `with` block")
        if self.unobservable:
            return {"killed": False, "why": f"the host cannot observe this task ({self.unobservable})"}
        lay = self.layout
        env = self._launcher_env()
        script = self._script()
        nonce = secrets.token_hex(8)
        tag = observer.tag(nonce)
        watch = observer.Watch(tag, nonce, protected=(), host_namespaces=self.host.namespaces, lifecycle=True,
                               claims=self._claims, key="lifecycle", kill_wait=self.timeout)
        the_plan = self._bare_plan(nonce, tag=tag)
        if script is not None:
            plan.write_script(script, plan.program(the_plan))
        self.launches += 1
        try:
            done = run(
                self.argv(script),
                timeout=self.timeout,
                input=None if script is not None else plan.program(the_plan),
                env=env,
                cwd=str(lay.root),
                on_line=watch.on_line,
                after_exit=watch.after_exit,
                on_start=watch.on_start,
            )
        finally:
            watch.stop_looking()  # run() raising after on_start left the looks going for the process's life
        return {
            **watch.lifecycle_result,
            "survivors": list(watch.survivors or ()),
            "exit": done.returncode,
            "timed_out": done.timed_out,
        }

    def terminal(self) -> dict[str, Any]:
        """The terminal promise's launch (made once, cached): the launcher's controlling terminal, and its
        stderr, is a pseudo-terminal the harness holds, the way a user runs a sandbox from a shell;
        the task tries to push a byte into its input (TIOCSTI), and the harness reads what arrived."""
        self._join_started()
        if self._terminal is None:
            self._terminal = _or_error(self._terminal_launch)
        if isinstance(self._terminal, NoObservation):
            raise self._terminal
        return self._terminal

    def _terminal_launch(self) -> dict[str, Any]:
        import pty
        import tty

        if self.layout is None or self.host is None:
            raise NoObservation("witness session used outside its `with` block")
        env, script = self._launcher_env(), self._script()
        nonce = secrets.token_hex(8)
        the_plan = self._bare_plan(nonce, terminal=True)
        program = plan.program(the_plan)
        if script is not None:
            plan.write_script(script, program)
        # No tag: nothing to find at a handshake; the watch only judges and kills what the launch leaves.
        watch = observer.Watch("", nonce, protected=(), host_namespaces=self.host.namespaces,
                               claims=self._claims, key="terminal", kill_wait=self.timeout)
        master, slave = pty.openpty()
        tty.setraw(slave)  # an injected byte is readable at once, not held back for a whole line
        self.launches += 1
        try:
            done = run(
                self.argv(script),
                timeout=self.timeout,
                input=None if script is not None else program,
                env=env,
                cwd=str(self.layout.root),
                after_exit=watch.after_exit,
                on_start=watch.on_start,
                terminal=slave,
                terminal_master=master,  # read as it comes: unread, ~4 KiB would stop the launcher
            )
            os.set_blocking(slave, False)
            injected = _drain(slave)  # what reached the terminal's input
            said = done.stderr  # what the launch wrote to the terminal
        finally:
            os.close(master)
            os.close(slave)
        found: Any = None
        for line in reversed(done.stdout.splitlines()):
            if line.startswith("{") and '"terminal"' in line:
                with contextlib.suppress(json.JSONDecodeError):
                    found = json.loads(line).get("terminal")
                    break
        return {
            "terminal": found,
            "injected": injected.decode(errors="replace"),
            "exit": done.returncode,
            "timed_out": done.timed_out,
            "stderr": said[-500:],
            "survivors": list(watch.survivors or ()),
        }

    def _knocks(self) -> list[int]:
        """The host pids that connected to the planted daemon socket during the launch (accepted and
        closed here): SO_PEERCRED holds the connecting process's credentials as of connect(2)
        (unix(7)), in our pid namespace, so a knock is told from another run's task that walked /tmp."""
        pids = []
        while self._daemon is not None:
            try:
                conn, _ = self._daemon.accept()
            except (BlockingIOError, InterruptedError):
                break
            with conn:
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                pids.append(struct.unpack("3i", cred)[0])
        return pids


def _or_error(fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | NoObservation:
    try:
        return fn()
    except NoObservation as e:
        return e


def _drain(fd: int) -> bytes:
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 4096):
            data += chunk
            if len(data) > 65536:
                break
    return data


def _bind_long(sock: socket.socket, directory: Path, name: str) -> None:
    """bind(2) a unix socket at directory/name whatever the length of the path (sun_path holds 108 bytes,
    unix(7)): through /proc/self/fd/N/name, a magic link the kernel resolves to the directory itself."""
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        sock.bind(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


def _from_task(pids: list[int], seen: observer.Seen | None) -> int:
    """How many of the knocks came from the task's own processes (all of them, when the host never saw
    the task: nothing to tell them apart by, and no pass is made of that)."""
    if seen is None:
        return len(pids)
    mine = {seen.pid, *seen.reached.get("pids", ())}
    return sum(1 for p in pids if p in mine)


def check_document(name: str, doc: Mapping[str, Any], the_plan: plan.Plan) -> None:
    """The document answers THIS launch's plan, or the launch is a harness error: a recorded
    document replayed by a launcher carries another launch's nonce, and one that answers other ops
    would otherwise surface as a KeyError in some witness."""
    if doc.get("launch_nonce") != the_plan.launch_nonce:
        raise NoObservation(
            f"{name}: the witness document is not from this launch (nonce {doc.get('launch_nonce')!r}, "
            f"expected {the_plan.launch_nonce!r})"
        )
    answered = {
        (o.get("op"), o.get("path")) for o in doc.get("ops", []) if isinstance(o, dict) and "result" in o
    }
    missing = [f"{o['op']} {o['path']}" for o in the_plan.ops if (o["op"], o["path"]) not in answered]
    if missing:
        raise NoObservation(
            f"{name}: the witness document does not answer the plan: no {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )


def _own_cgroup() -> str:
    text = Path("/proc/self/cgroup").read_text()
    return own_cgroup(text) or ""


def _cgroup_seen(leaf: cgroup_leaf.Leaf, killer: _TreeKill | None, neighbour: cgroup_leaf.Leaf,
                 neighbour_before: str | None) -> dict[str, Any]:
    """What the host read of the task's leaf and its neighbour's, once the launch is over."""
    return dict(
        cgroup_leaf.summary(leaf),
        cgroup_path=leaf.cgroup_path,
        kill=killer.result if killer is not None else None,
        neighbour={
            "path": str(neighbour.path),
            "cgroup_path": neighbour.cgroup_path,
            "memory_max_before": neighbour_before,
            "memory_max_after": _read(neighbour.path / "memory.max"),
            "procs_after": neighbour.procs(),
        },
    )


def _remove_planted_outside(after: dict[str, str | None], root: Path) -> None:
    """A planted file outside our layout (a broken sandbox let it through into, say, /usr): removed,
    it is ours by its nonce."""
    for p in after:
        if after[p] is not None and not Path(p).is_relative_to(root):
            with contextlib.suppress(OSError):
                os.unlink(p)


def _bound(watch: observer.Watch, doc: dict[str, Any]) -> tuple[Any, str | None]:
    """(what the host saw of the task, why it saw none): only a process that carried the tag AND
    wrote this document counts. The host released the process it read with a number only that process
    received; a document without it was written by another process (a decoy carried the tag)."""
    seen = watch.seen
    if seen is None:
        return None, (f"no live task seen from the host: {watch.why_not} (a sandbox whose tasks run out "
                      "of this kernel's sight, such as gVisor or a VM, says so with --host-cannot-observe "
                      "'WHY')")
    hs = doc.get("handshake")
    released = hs.get("value") if isinstance(hs, dict) else None
    if released != watch.release_value:
        return None, ("the process the host read did not write this document: it was released with a "
                      f"value the document does not carry (the document says {released!r}); another process "
                      "carried the task's tag")
    return seen, None

def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def host_view(pid: int) -> dict[str, Any] | None:
    """A process as the host sees it (None once it is gone): its pid in each pid namespace (NSpid,
    innermost last), pid namespace, session, state, start time and cgroup, from /proc/PID."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        pidns = os.readlink(f"/proc/{pid}/ns/pid")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = observer.stat_fields(stat)
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    return {
        "pid": pid,
        "nspid": [int(x) for x in nspid],
        "pidns": pidns,
        "state": fields["state"],
        "sid": fields["sid"],
        "starttime": fields["starttime"],
        "cgroup": cgroup.splitlines(),
    }


def _alive(seen: dict[str, Any]) -> bool:
    now = host_view(seen["pid"])
    # A zombie is dead (it only waits for its new parent to reap it), unless other threads of it still
    # run (observer.dead). Same pid but another start time: reused by an unrelated process.
    if now is None or now["starttime"] != seen["starttime"]:
        return False
    return not observer.dead(seen["pid"], now["state"])


class _TreeKill:
    """The host side of the cgroup.kill witness. The witness program, once its document is out, leaves
    a tree (a child, a setsid child and its grandchild) and writes a marker in its workdir; this thread
    then records what the leaf holds (the task itself included: the own-leaf witness), kills the whole
    leaf with cgroup.kill, and records who survived. The launch then ends by that SIGKILL, which
    `runner` reports as the clean exit it is: the document was complete before the kill (the witness
    program flushes it first, and parse_document still demands its completion marker)."""

    def __init__(self, leaf: cgroup_leaf.Leaf, marker: Path, *, timeout: float) -> None:
        self.leaf, self.marker, self.timeout = leaf, marker, timeout
        self.result: dict[str, Any] = {"killed": False, "why": "the task never signalled its tree"}
        self._stop = threading.Event()
        self._killing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sbxc-tree-kill", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def killed(self) -> bool:
        return bool(self.result.get("killed"))

    def runner(self, argv: Any, **kw: Any) -> Completed:
        done = run(argv, **kw)
        if done.returncode == -signal.SIGKILL and self._killing.is_set():
            self._thread.join()  # the launcher died of our cgroup.kill: wait for the record of it
            if self.killed:
                done = done._replace(returncode=0)
        return done

    def _ready(self) -> dict[str, Any] | None:
        try:
            text = self.marker.read_text()
        except FileNotFoundError:
            return None
        if not text.endswith("\n"):
            return None  # opened, not yet written: the document is not out yet
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            return None
        return doc if isinstance(doc, dict) and doc.get("ready") else None

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._stop.is_set() and time.monotonic() < deadline:
            marker = self._ready()
            if marker is not None:
                self._kill(marker)
                return
            self._stop.wait(0.02)

    def _kill(self, marker: dict[str, Any]) -> None:
        try:
            before = [v for v in map(host_view, self.leaf.procs()) if v is not None]
            self._killing.set()
            kills.record(0, signal.SIGKILL, f"the cgroup promise: cgroup.kill of the leaf {self.leaf.path}")
            method = self.leaf.kill(timeout=10)
            self.result = {"killed": True, "method": str(method), "marker": marker, "before": before}
            after = self.leaf.procs()
            alive = [v["pid"] for v in before if _alive(v)]
            deadline = time.monotonic() + 2.0
            while alive and time.monotonic() < deadline:  # SIGKILLed tasks exit asynchronously
                time.sleep(0.02)
                alive = [v["pid"] for v in before if _alive(v)]
            self.result.update(after=after, alive_after=alive)
        except cgroup_leaf.CgroupUnusable as e:
            self.result = {"killed": False, "why": f"cgroup.kill failed: {e}"}
