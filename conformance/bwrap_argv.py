"""The reference launcher's bubblewrap argv: a PURE function of (profile, layout values, facts,
perturbations). No I/O here: the facts (bwrap path, which system dirs are symlinks, whether
--disable-userns works) are gathered once by the caller, so this can be tested as a table and the
negative controls (issue 6) can flip exactly one thing by naming a perturbation.

The reference sandbox, modelled on an agent platform:
  a tmpfs root; /usr read-only and /bin, /lib... as on the host; fresh /proc, /dev, /tmp;
  every `read_only` path ro-bound, every `writable` path bound, every `masked` path an empty
  tmpfs remounted read-only; the task's control dir ro-bound on its own (scoped to THIS task);
  an `absent` path under a bound tree hidden by an empty read-only tmpfs on the bound tree's child
  that leads to it, with the task's own binds put back on top (bwrap creates their mount points).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import NamedTuple

from sandbox_conformance.conformance.profile import Caps, Nested, NetworkMode, Profile, Sharing, expand
from sandbox_conformance.probes.finding import EMPTY

# One thing each, named for what a broken sandbox gets wrong (issue 6's negative controls).
PERTURBATIONS: Mapping[str, str] = {
    "mask_dropped": "masked paths are not covered at all",
    "mask_writable": "masked paths are a writable tmpfs",
    "control_rw": "the control directory is bound read-write",
    "control_scoped_per_user": "the read-only control bind covers the user's whole tree, not one task",
    "other_user_bound": "another user's subtree is bound in",
    "network_shared": "the host network namespace is shared",
    "nested_userns_enabled": "--disable-userns is left out",
    "pid_shared": "the host pid namespace is shared (host /proc bound in)",
    "ipc_shared": "the host ipc namespace is shared",
    "uts_shared": "the host uts namespace is shared",
    "caps_kept": "capabilities are kept (--cap-add ALL)",
    "env_kept": "the launcher's environment is passed through (no --clearenv)",
    # Not an argv change: the harness (conformance/harness.py) still makes and enters the task's
    # cgroup leaf, but writes none of the profile's limits into it.
    "secret_in_init": "bwrap is started with the launcher's environment (--clearenv alone)",
    "proc_sys_writable": "the task's /proc/sys is left as bwrap's --proc makes it (read-write)",
    "limits_dropped": "the task's cgroup leaf gets no memory.max / pids.max",
    "leaf_not_entered": "the task's cgroup leaf is made with its limits, but the task never enters it",
}

# Where a usrmerged host keeps the rest of the system: /bin -> usr/bin etc.
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class UnbuildableProfile(ValueError):
    """The profile asks for something this launcher cannot build (a harness error, not a red witness)."""


class Facts(NamedTuple):
    """What the reference argv needs from the host, gathered once by the caller so that `reference_argv`
    stays a pure function (see the module doc)."""

    bwrap: str
    python: str = "/usr/bin/python3"
    env: str = "/usr/bin/env"
    disable_userns: bool = False  # the `disable_userns` probe: supported
    # /bin etc. -> their symlink target on the host, or None for a real directory; absent: not listed.
    system_links: Mapping[str, str | None] = EMPTY


class _Mount(NamedTuple):
    """One mount `reference_argv` asks bwrap for at a path in the task: a bind of a host path, read-only or
    not, or a tmpfs, which may be remounted read-only once everything beneath it is mounted."""

    kind: str  # "ro-bind", "bind", "tmpfs"
    path: str
    source: str | None = None
    readonly_tmpfs: bool = False


def _depth(path: str) -> int:
    return len(PurePosixPath(path).parts)


def _under(path: str, top: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(top)) and path != top


def _mounts(profile: Profile, values: Mapping[str, str], perturb: frozenset[str]) -> list[_Mount]:
    fs, task = profile.filesystem, profile.task
    mounts: dict[str, _Mount] = {}

    def add(m: _Mount) -> None:
        mounts.setdefault(m.path, m)  # the first word on a path wins: masks before binds

    for p in fs.masked:
        if "mask_dropped" not in perturb:
            add(_Mount("tmpfs", expand(p, values), readonly_tmpfs="mask_writable" not in perturb))
    mistakes: list[_Mount] = []  # added after the absent paths are hidden: nothing corrects them
    if task.control is not None:
        control = expand(task.control, values)
        if "control_scoped_per_user" in perturb:
            # users/<user>/tasks/<task>/control -> users/<user>: the scoping mistake.
            user_tree = str(PurePosixPath(control).parents[2])
            mistakes.append(_Mount("ro-bind", user_tree, user_tree))
        add(_Mount("bind" if "control_rw" in perturb else "ro-bind", control, control))
    for rw in (task.user_tmp, task.workdir, *fs.writable):
        if rw is not None:
            add(_Mount("bind", expand(rw, values), expand(rw, values)))
    for p in fs.read_only:
        add(_Mount("ro-bind", expand(p, values), expand(p, values)))
    if "other_user_bound" in perturb and "other_user" in values:
        mistakes.append(_Mount("ro-bind", values["other_user"], values["other_user"]))

    binds = [m.path for m in mounts.values() if m.kind != "tmpfs"]
    for p in fs.absent:
        absent = expand(p, values)
        tops = [b for b in binds if _under(absent, b)]
        if not tops:
            continue  # nothing bound above it: the tmpfs root has no such path
        top = max(tops, key=_depth)
        hide = str(PurePosixPath(top) / PurePosixPath(absent).relative_to(top).parts[0])
        if hide == absent:
            raise UnbuildableProfile(
                f"cannot make {absent} absent: it is a direct child of the bound {top}, "
                "and a bind mount cannot drop one entry"
            )
        add(_Mount("tmpfs", hide, readonly_tmpfs=True))
    for m in mistakes:
        add(m)
    # Parents before children: a bind over a hidden tree must come after the tmpfs that hides it.
    return sorted(mounts.values(), key=lambda m: _depth(m.path))


def reference_argv(
    profile: Profile, values: Mapping[str, str], facts: Facts, perturbations: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    unknown = set(perturbations) - set(PERTURBATIONS)
    if unknown:
        raise UnbuildableProfile(
            f"unknown perturbation(s) {', '.join(sorted(unknown))}; known: {', '.join(PERTURBATIONS)}"
        )
    p, ns = perturbations, profile.namespaces
    argv: list[str] = []
    if profile.environment.allow is not None and not {"secret_in_init", "env_kept"} & p:
        # bwrap runs as the sandbox's PID 1 (and its monitor outside) with the environment it was
        # started with: --clearenv clears only what the TASK execs with, and the task reads the rest
        # from /proc/1/environ (proc(5): the environment as it was at execve). So bwrap itself is
        # started with none; --setenv below gives the task exactly the profile's variables.
        argv += [facts.env, "-i"]
    argv += [facts.bwrap]
    # Always a user namespace: it is what lets an unprivileged user run a non-setuid bwrap, and
    # --disable-userns requires it (bwrap: "--disable-userns requires --unshare-user").
    argv += ["--unshare-user"]
    if ns.pid is Sharing.private and "pid_shared" not in p:
        argv += ["--unshare-pid"]
    if ns.ipc is Sharing.private and "ipc_shared" not in p:
        argv += ["--unshare-ipc"]
    if ns.uts is Sharing.private and "uts_shared" not in p:
        argv += ["--unshare-uts"]
        if ns.hostname:
            argv += ["--hostname", ns.hostname]
    if profile.network is NetworkMode.none and "network_shared" not in p:
        argv += ["--unshare-net"]  # bwrap brings up lo in the new namespace
    argv += ["--unshare-cgroup-try"]
    if profile.nested_userns is Nested.refused and facts.disable_userns and "nested_userns_enabled" not in p:
        # bwrap >= 0.8: sets max_user_namespaces=1 in the task's userns, then enters a nested
        # one, so unshare(CLONE_NEWUSER) inside fails with ENOSPC (bubblewrap.c, --disable-userns).
        argv += ["--disable-userns"]
    if "caps_kept" in p:
        argv += ["--cap-add", "ALL"]
    elif profile.process.capabilities is Caps.none:
        # As root bwrap keeps capabilities unless told (bwrap(1): --cap-drop).
        argv += ["--cap-drop", "ALL"]
    # --new-session: no TIOCSTI into the launcher's terminal (CVE-2017-5226).
    argv += ["--die-with-parent", "--new-session"]
    env = profile.environment
    if env.allow is not None and "env_kept" not in p:
        argv += ["--clearenv"]
    for key, value in env.set.items():
        argv += ["--setenv", key, expand(value, values)]

    argv += ["--ro-bind", "/usr", "/usr"]
    for d in SYSTEM_DIRS:
        if d not in facts.system_links:
            continue
        target = facts.system_links[d]
        argv += ["--symlink", target, d] if target is not None else ["--ro-bind", d, d]
    if ns.pid is Sharing.private and "pid_shared" not in p:
        argv += ["--proc", "/proc"]
        if "proc_sys_writable" not in p:
            # bwrap covers /proc/sys with a read-only bind only when access(W_OK) succeeds in its setup,
            # which it does not under --unshare-user (bubblewrap.c cover_proc_dirs): as root, uid 0 is
            # mapped to the host's, and the host's sysctls (owner root, 0644) stay writable through the
            # fresh procfs. The host's /proc/sys, bound read-only, shows the same tables: a sysctl file
            # answers for the namespaces of whoever opens it (fs/proc/proc_sysctl.c).
            argv += ["--ro-bind", "/proc/sys", "/proc/sys"]
            argv += ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    else:
        # A fresh procfs needs a pid namespace our userns owns; without one, show the host's.
        argv += ["--ro-bind", "/proc", "/proc"]
    argv += ["--dev", "/dev", "--tmpfs", "/tmp"]

    mounts = _mounts(profile, values, frozenset(p))
    for m in mounts:
        if m.path == "/usr":
            continue
        argv += ["--tmpfs", m.path] if m.kind == "tmpfs" else [f"--{m.kind}", m.source or m.path, m.path]
    # Remount read-only only after everything beneath is mounted: bwrap must still mkdir the mount
    # points of the binds that go back on top of a hiding tmpfs.
    for m in mounts:
        if m.kind == "tmpfs" and m.readonly_tmpfs:
            argv += ["--remount-ro", m.path]
    workdir = profile.task.workdir
    argv += ["--chdir", expand(workdir, values) if workdir else "/"]
    argv += [facts.python, "-I", "-S", "-"]
    return tuple(argv)
