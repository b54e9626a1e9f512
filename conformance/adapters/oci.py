"""OCI runtime adapter: run the witness through `runc run`, `crun run` or gVisor's `runsc run` from a
bundle we generate (runsc has its own profile, runsc.toml: what the Sentry keeps of the same bundle).

The bundle (config.json + an empty rootfs directory) is ONE template with profile placeholders
({state}, {control}...). The launcher expands it against the task's layout; the profile
(conformance/adapters/oci.toml) is DERIVED from the same template by `derive_profile`, and a test
checks the shipped file equals the derivation, so the two cannot drift apart.

The sandbox: a read-only root (an empty directory with /bin, /lib... symlinks into /usr, as on a
usrmerged Debian host), the host's /usr bound read-only, the state tree bound read-only with its
database masked (linux.maskedPaths), an empty tmpfs over {state}/users that hides every other task
and user, then the task's own control dir (ro), workdir and per-user temp (rw) bound back on top;
new pid, ipc, uts, mount and network namespaces; no capabilities in any set; noNewPrivileges; a
seccomp filter that refuses CLONE_NEWUSER (as Docker's default profile does); and `runc spec`'s own
readonlyPaths and maskedPaths (/proc/sys read-only, /proc/kcore masked...).

Cgroups: this project never writes to a cgroup tree it was not delegated. runc as real root always
creates `<hierarchy>/<container id>` in every host hierarchy (libcontainer/cgroups/fs), so runc is
run ROOTLESS only (as an unprivileged user, `witness --as-user NAME`): its mkdir there fails with
EACCES, which rootless runc ignores when linux.cgroupsPath is empty. crun takes
`--cgroup-manager=disabled` and runs as root or rootless.

Launcher command (the witness appends `python3 -I -S -`):
    PYTHON -m sandbox_conformance.conformance.adapters.oci --runtime runc --
State (`--root`) and the bundle live in a fresh temp dir; the container is deleted (`delete
--force`) and the temp dir removed whatever happened, including SIGTERM."""

from __future__ import annotations

import argparse
import copy
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from sandbox_conformance.conformance.adapters import _guardian
from sandbox_conformance.conformance.profile import PLACEHOLDERS, expand
from sandbox_conformance.processes import owner

RUNTIMES = ("runc", "crun", "runsc")
SPEC_ENV = "SANDBOX_CONFORMANCE_TASK_SPEC"  # conformance.launch.SPEC_ENV (not imported: keep this light)
CLONE_NEWUSER = 0x10000000  # <linux/sched.h>
# Where a usrmerged host keeps the rest of the system (Debian >= 12: /bin -> usr/bin etc.).
USR_LINKS = ("bin", "sbin", "lib", "lib64")
HOSTNAME = "sbxc-task"
CAP_SETS = ("bounding", "effective", "inheritable", "permitted", "ambient")
# The layout paths a task must not see; the derived profile promises them absent when the template
# hides them (an empty tmpfs over an ancestor, nothing bound back at or under them).
HIDDEN_CANDIDATES = ("{neighbour_control}", "{other_user}")

WORKSPACE_PREFIX = "sbxc-oci-"  # the temp dir holding the bundle and the runtime's --root
RUN_TIMEOUT = _guardian.RUN_TIMEOUT


class BundleNotBuilt(Exception):
    """The bundle cannot be built for this task (bad spec): the launcher exits 2 with this line."""


def _seccomp() -> dict[str, Any]:
    # Refuse a nested user namespace, as Docker's default profile does for a container without
    # CAP_SYS_ADMIN: unshare(2) and clone(2) with CLONE_NEWUSER in the flags get EPERM; clone3(2)
    # passes its flags in a struct seccomp cannot read, so it gets ENOSYS and glibc falls back to
    # clone(2) (moby profiles/seccomp/default.json does the same).
    newuser = [{"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}]
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [
            {"names": ["unshare"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": newuser},
            {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": newuser},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
        ],
    }


# What `runc spec` writes into every bundle (runc 1.1 libcontainer/specconv/example.go; Docker and
# containerd's defaults are the same lists): the kernel's host-wide settings under /proc read-only,
# and the /proc and /sys files that show the host's memory, keys and timers masked. Without
# readonlyPaths a root container opens /proc/sys/kernel/core_pattern for writing (kernel_interfaces).
RUNTIME_MASKED = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
)
RUNTIME_READONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


def template(*, bind_state: bool = True) -> dict[str, Any]:
    """config.json with placeholders. `bind_state=False` is for the runtime-tools comparison: the
    config still masks {state}/db, but that path then does not exist in the container at all."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777"],
        },
        {
            "destination": "/usr",
            "type": "bind",
            "source": "/usr",
            "options": ["rbind", "ro", "nosuid", "nodev"],
        },
    ]
    if bind_state:
        mounts += [
            {"destination": "{state}", "type": "bind", "source": "{state}", "options": ["rbind", "ro"]},
            # runc and crun mount a tmpfs read-write first and make it read-only last, so the binds
            # below can still create their mount points in it (runc rootfs_linux.go mountPropagate).
            {
                "destination": "{state}/users",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["ro", "mode=755"],
            },
        ]
    mounts += [
        {"destination": "{control}", "type": "bind", "source": "{control}", "options": ["bind", "ro"]},
        {"destination": "{workdir}", "type": "bind", "source": "{workdir}", "options": ["bind", "rw"]},
        {"destination": "{user_tmp}", "type": "bind", "source": "{user_tmp}", "options": ["bind", "rw"]},
    ]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,  # stdin (the witness program) must reach the task as a pipe
            "user": {"uid": 0, "gid": 0},
            "args": ["python3", "-I", "-S", "-"],
            "env": ["PATH=/usr/bin:/bin", "HOME={workdir}", "LANG=C.UTF-8", "TASK_ID={task_id}"],
            "cwd": "{workdir}",
            "capabilities": {s: [] for s in CAP_SETS},
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": HOSTNAME,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            "maskedPaths": ["{state}/db", *RUNTIME_MASKED],
            "readonlyPaths": list(RUNTIME_READONLY),
            "seccomp": _seccomp(),
        },
    }


# ---- the profile, derived from the template -------------------------------------------------------


def _has_ns(config: Mapping[str, Any], kind: str) -> bool:
    # A namespace entry with a "path" joins an existing namespace: not a private one.
    return any(n.get("type") == kind and not n.get("path") for n in config["linux"].get("namespaces", []))


def _shape() -> dict[str, str]:
    """Placeholder values with the layout's real nesting ({control} under {state}/users/...), so
    "is this path under that mount" can be answered on templates (conformance/layout.py)."""
    from sandbox_conformance.conformance.layout import Layout

    lay = Layout(Path("/R"), "n", "T", "N", "U", 0, 0)
    return {**lay.values(), "user": lay.user}


def _covers(top: str, path: str) -> bool:
    shape = _shape()
    return PurePosixPath(expand(path, shape)).is_relative_to(PurePosixPath(expand(top, shape)))


def _seccomp_refuses_newuser(config: Mapping[str, Any]) -> bool:
    rules = (config["linux"].get("seccomp") or {}).get("syscalls", [])

    def refused(name: str) -> bool:
        return any(
            name in r["names"]
            and r["action"] == "SCMP_ACT_ERRNO"
            and (not r.get("args") or any(a["value"] & CLONE_NEWUSER for a in r["args"]))
            for r in rules
        )

    return refused("unshare") and refused("clone")


def _kernel_settings_writable(config: Mapping[str, Any]) -> str | None:
    """Why the bundle leaves the host's kernel settings open for writing, or None. A container's /proc
    is a procfs of its own pid namespace, but /proc/sys and /proc/sysrq-trigger in it are the host's
    (only a few net and ipc sysctls are per namespace): as root they take writes unless
    linux.readonlyPaths (or maskedPaths) covers them; a sysfs mount must be read-only likewise."""
    covered = {*config["linux"].get("readonlyPaths", []), *config["linux"].get("maskedPaths", [])}
    if any(m["type"] == "proc" for m in config["mounts"]):
        open_ = [p for p in ("/proc/sys", "/proc/sysrq-trigger") if p not in covered]
        if open_:
            return f"the bundle mounts /proc with {' and '.join(open_)} not in linux.readonlyPaths"
    if any(m["type"] == "sysfs" and "ro" not in m.get("options", []) for m in config["mounts"]):
        return "the bundle mounts sysfs read-write"
    return None


def derive_profile(config: Mapping[str, Any], *, name: str = "oci") -> dict[str, Any]:
    """The promises a bundle makes, as a profile document (what `conformance.profile.parse` reads).

    Narrowed where the bundle makes a promise this suite cannot witness at the same path: the
    read-only root itself (`/` inside is an empty directory, not the host's `/`, so comparing
    contents is meaningless) and masks on paths that are not directories the suite seeds."""
    proc = config["process"]
    binds = [m for m in config["mounts"] if m["type"] == "bind" and m["source"] == m["destination"]]
    ro = [m["destination"] for m in binds if "ro" in m.get("options", [])]
    rw = [m["destination"] for m in binds if "rw" in m.get("options", [])]
    masked = [p for p in config["linux"].get("maskedPaths", []) if p.startswith("{")]
    tmpfs = [m["destination"] for m in config["mounts"] if m["type"] == "tmpfs"]

    def hidden(path: str) -> bool:
        # Hidden when the last mount covering it is an empty tmpfs and nothing is bound at or under it.
        covering = [m for m in config["mounts"] if _covers(m["destination"], path)]
        return (
            bool(covering)
            and covering[-1]["type"] == "tmpfs"
            and covering[-1]["destination"] in tmpfs
            and covering[-1]["destination"].startswith("{")  # one of ours, not /tmp
            and not any(_covers(path, m["destination"]) for m in binds)
        )

    control = "{control}" if "{control}" in ro else None
    caps_none = all(not proc.get("capabilities", {}).get(s) for s in CAP_SETS)
    env_keys = [kv.split("=", 1)[0] for kv in proc.get("env", [])]
    doc: dict[str, Any] = {
        "profile": {
            "name": name,
            "description": "OCI bundle: ro root from host /usr, masked db, ro control, rw work and tmp, "
            "private pid/ipc/uts/net, no caps, noNewPrivileges, seccomp refuses CLONE_NEWUSER",
        },
        "filesystem": {
            "read_only": [p for p in ro if p != control],
            "masked": masked,
            "writable": [p for p in rw if p not in ("{user_tmp}",)],
            "absent": [p for p in HIDDEN_CANDIDATES if hidden(p)],
        },
        "task": {"workdir": proc["cwd"]},
        "network": {"mode": "none" if _has_ns(config, "network") else "host"},
        "userns": {"nested": "refused" if _seccomp_refuses_newuser(config) else "allowed"},
        "namespaces": {k: "private" if _has_ns(config, k) else "shared" for k in ("pid", "ipc", "uts")},
        "process": {
            "capabilities": "none" if caps_none else "any",
            "no_new_privs": bool(proc.get("noNewPrivileges")),
        },
        "environment": {"allow": env_keys},
    }
    if control:
        doc["task"].update(control=control, control_files=["system_prompt.txt"])
    if "{user_tmp}" in rw:
        doc["task"]["user_tmp"] = "{user_tmp}"
    if config.get("hostname") and _has_ns(config, "uts"):
        doc["namespaces"]["hostname"] = config["hostname"]
    # The default promises (descriptors, secrets, devices, host sockets) follow from a bundle that binds
    # only its own paths, lists its environment and gives the runtime's /dev; the host's kernel settings
    # depend on the bundle's readonlyPaths.
    why = _kernel_settings_writable(config)
    if why:
        doc["promises"] = {"not_claimed": {"kernel_interfaces": why}}
    return doc


def profile_toml(doc: Mapping[str, Any], header: str = "") -> str:
    """A small TOML writer for the profile document (tomllib reads only; the shapes here are
    strings, booleans, lists of strings and one level of tables)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)  # a JSON string is a valid TOML basic string for these characters
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, Mapping):  # an inline table, keyed by bare words ([promises] not_claimed)
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"cannot write {v!r} as TOML here")

    lines = [header.rstrip("\n")] if header else []
    for section, table in doc.items():
        lines += ["", f"[{section}]"] if lines else [f"[{section}]"]
        lines += [f"{k} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


PROFILE_HEADER = """\
# The OCI adapter's profile (runc and crun alike), DERIVED from the bundle template in
# conformance/adapters/oci.py by `derive_profile`: regenerate it with
#     python -m sandbox_conformance.conformance.adapters.oci --print-profile > conformance/adapters/oci.toml
# (tests/test_adapters_e2e.py::test_the_shipped_oci_profile_is_the_one_derived_from_the_bundle fails
# when this file and the derivation differ).
#
# Narrowed where the bundle makes a promise this suite cannot witness at the same path:
#   root.readonly   `/` inside is an empty directory of ours, not the host's `/`: nothing to compare
#   /proc, /dev...  the runtime's own mounts are not host paths; no promise about them here
# Not claimed by the bundle, so not promised: a memory or pids limit (no linux.resources: this
# project writes no cgroup it was not delegated), PID 1's name (it is the task itself).
# The default promises (descriptors, secrets, kernel_interfaces, devices, host_sockets) are all kept:
# kernel_interfaces by runc's own default linux.readonlyPaths (/proc/sys, /proc/sysrq-trigger...),
# which the bundle sets; without them crun as root opened /proc/sys/kernel/core_pattern for writing.
# The devices witness reports BROKEN all the same: maskedPaths binds /dev/null (char 1:3) over
# /proc/keys and /proc/timer_list, and it allows a node by its path (tests/witness_cli.py).
"""


def shipped_profile_text() -> str:
    return profile_toml(derive_profile(template()), PROFILE_HEADER)


# ---- OCI runtime-tools' masked-path check, for comparison -------------------------------------


def runtime_tools_masked_check(stat: Mapping[str, Any], listing: Mapping[str, Any]) -> bool:
    """What opencontainers/runtime-tools' `runtimetest` concludes about one masked path, given the
    task's own stat and list observations of it (a port of cmd/runtimetest/main.go
    validateMaskedPaths + testReadAccess + testDirectoryReadAccess; True = its TAP line is "ok").

    It asks only "can the task read something there?": a stat error that IsNotExist is not an
    error, and `readable` stays false, so a MISSING path passes. Our masked witness instead
    requires an empty read-only tmpfs mounted at the path: a missing path is not a kept mask."""
    if not stat.get("ok"):
        # `if err != nil && !os.IsNotExist(err) && err != errAccess { return err }`: ENOENT passes;
        # any other error aborts the validation (not a pass).
        return stat.get("errno") == "ENOENT"
    value = stat.get("value") or {}
    if value.get("type") == "dir":
        # testDirectoryReadAccess: readable iff ReadDir succeeds with at least one entry.
        return not (listing.get("ok") and listing.get("value"))
    return False  # a non-empty regular file: this port has no read of it, call it readable


# ---- rendering and running ----------------------------------------------------------------------


def render(config: Mapping[str, Any], values: Mapping[str, str], args: Sequence[str]) -> dict[str, Any]:
    """The template with every placeholder expanded and the witness's argv as process.args."""

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return expand(v, values)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    out: dict[str, Any] = walk(copy.deepcopy(dict(config)))
    out["process"]["args"] = list(args)
    return out


def rootless(config: dict[str, Any], uid: int, gid: int) -> dict[str, Any]:
    """Rootless: a user namespace mapping container root to the caller (runc/docs/rootless)."""
    config["linux"]["namespaces"].append({"type": "user"})
    config["linux"]["uidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
    config["linux"]["gidMappings"] = [{"containerID": 0, "hostID": gid, "size": 1}]
    return config


def values_from_spec(spec: Mapping[str, Any]) -> dict[str, str]:
    missing = [k for k in PLACEHOLDERS if not isinstance(spec.get(k), str)]
    if missing:
        raise BundleNotBuilt(f"task spec lacks {', '.join(missing)}")
    return {k: spec[k] for k in PLACEHOLDERS}


def write_bundle(bundle: Path, config: Mapping[str, Any]) -> None:
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    for name in USR_LINKS:
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), rootfs / name)
    (bundle / "config.json").write_text(json.dumps(config, indent=1))


UNIFIED = "/sys/fs/cgroup/unified"  # cgroup2 in a hybrid layout (systemd's "hybrid" mode)


def _hybrid_wrap(runtime: str) -> list[str]:
    """crun refuses a hybrid host whose cgroup2 hierarchy has controllers ("cgroups in hybrid mode
    not supported, drop all controllers from cgroupv2", crun 1.8 libcrun/cgroup-utils.c), even with
    --cgroup-manager=disabled. Run it in a private mount namespace without the cgroup2 mount: crun
    then sees a v1 host and, its cgroup manager disabled, touches no cgroup at all. The host's
    mounts are unchanged (the umount happens in the copy)."""
    if runtime != "crun" or not os.path.ismount(UNIFIED):
        return []
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        f'umount {UNIFIED} && exec "$@"',
        "sh",
    ]


def runtime_argv(runtime: str, state: Path, *command: str) -> list[str]:
    exe = shutil.which(runtime) or runtime
    if runtime == "crun":
        # crun can leave cgroups alone entirely (crun(1): --cgroup-manager=disabled).
        return [*_hybrid_wrap(runtime), exe, "--root", str(state), "--cgroup-manager=disabled", *command]
    if runtime == "runsc":
        # gVisor (runsc flags): no cgroup of the host's (--ignore-cgroups); the bundle's network
        # namespace holds only lo, and --network=none gives the Sentry's netstack none either;
        # --oci-seccomp: runsc ignores linux.seccomp unless asked (measured: without it a nested user
        # namespace was created by unshare and clone).
        return [exe, "--root", str(state), "--ignore-cgroups", "--network=none", "--oci-seccomp", *command]
    return [exe, "--root", str(state), *command]


def unavailable(runtime: str, euid: int | None = None) -> str | None:
    """Why this runtime cannot be an adapter here, or None."""
    if shutil.which(runtime) is None:
        return f"{runtime} not installed (apt-get install {runtime})"
    euid = os.geteuid() if euid is None else euid
    if runtime == "runc" and euid == 0:
        return (
            "runc as root creates a cgroup in every host hierarchy (no way to turn that off) and this "
            "project writes only to a delegated cgroup subtree: run it rootless, `--as-user NAME`"
        )
    if runtime == "crun" and euid != 0 and os.path.ismount(UNIFIED):
        return (
            "rootless crun refuses this hybrid cgroup host and only root can hide cgroup2 from it: "
            "run it as root (no --as-user)"
        )
    return None


def cleanup(runtime: str, workspace: Path, cid: str) -> None:
    """Delete the container (killing it if it still runs) and remove the workspace. Idempotent."""

    state = workspace / "state"
    if state.is_dir():
        # `delete --force` on a container that already exited and was removed by `run` says
        # "does not exist": nothing to do, so its exit status is not ours to report.
        _guardian.run_cleanup(runtime_argv(runtime, state, "delete", "--force", cid))
    shutil.rmtree(workspace, ignore_errors=True)


def guardian(runtime: str) -> int:
    """The guardian: its first line on stdin names the workspace and the container; then it blocks
    until the launcher is gone (EOF on stdin, however it died), then cleans up. Needed because the
    harness SIGKILLs the launcher's process group on a timeout, and the container is NOT in that
    group: runc and crun start it in a session of its own, so it would outlive us, hold the
    harness's stdout pipe open and keep its state and bundle on disk. The workspace carries the
    guardian's stamp, not the launcher's: another run's sweep (processes/owner.py) removes a dead
    owner's directory and kills what names it, and must not race the guardian's own clean-up."""
    named = _guardian.told(WORKSPACE_PREFIX)
    if named is None:
        return 2
    workspace, cid = named
    while sys.stdin.buffer.read(4096):
        pass
    cleanup(runtime, workspace, cid)
    return 0


def launch(runtime: str, args: Sequence[str], spec: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """Build the bundle, run the container in the foreground with our stdio, always delete it."""
    values = values_from_spec(spec)
    rendered = render(config, values, args)
    st = os.stat(values["workdir"])
    if os.geteuid() != 0:
        rootless(rendered, os.geteuid(), os.getegid())
    elif st.st_uid != 0:
        rendered["process"]["user"] = {"uid": st.st_uid, "gid": st.st_gid}
    cid = f"sbxc-{values['task_id']}-{secrets.token_hex(3)}"
    guardian, w = _guardian.start_guardian("sandbox_conformance.conformance.adapters.oci", runtime)
    # The guardian's stamp in the name: if this launcher and its guardian both die, the next run's
    # sweep deletes the container and the workspace (processes/owner.py); while the guardian lives, no
    # sweep touches it.
    start = owner.start_time(guardian.pid)
    stamp = owner.Stamp(guardian.pid, start, owner.host_key()) if start is not None else owner.mine()
    workspace = Path(tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{stamp}-{values['task_id']}-"))
    _guardian.tell(w, workspace, cid)
    state, bundle = workspace / "state", workspace / "bundle"
    # If this launcher and its guardian both die, the sweep that removes the workspace deletes the
    # container first (`delete --force` of an id never created is a harmless error).
    owner.ask_before_removal(workspace, [runtime_argv(runtime, state, "delete", "--force", cid)])

    def prepare() -> None:
        state.mkdir(mode=0o700)
        write_bundle(bundle, rendered)

    # stdin, stdout and stderr are ours: the witness program arrives on stdin and its document leaves
    # on stdout (terminal=false: the runtime passes the fds through to the container).
    return _guardian.run_with_guardian(
        runtime_argv(runtime, state, "run", "--bundle", str(bundle), cid),
        what=runtime, guardian=guardian, pipe=w, prepare=prepare,
        cleanup=lambda: cleanup(runtime, workspace, cid),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sandbox_conformance.conformance.adapters.oci", description=__doc__.splitlines()[0]
    )
    p.add_argument("--runtime", choices=RUNTIMES)
    p.add_argument("--print-profile", action="store_true", help="print the profile derived from the bundle")
    p.add_argument("--mask-missing", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--guardian", metavar="RUNTIME", help=argparse.SUPPRESS)
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- the task's argv")
    a = p.parse_args(argv)
    if a.print_profile:
        sys.stdout.write(shipped_profile_text())
        return 0
    if a.guardian:
        if a.guardian not in RUNTIMES:
            p.error("--guardian: not one of our runtimes")
        return guardian(a.guardian)
    if a.runtime is None:
        p.error("--runtime is required")
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        p.error("no task argv after --")
    why = unavailable(a.runtime)
    if why:
        print(f"oci adapter: {why}", file=sys.stderr)
        return 75
    spec_file = os.environ.get(SPEC_ENV)
    if not spec_file:
        print(
            f"oci adapter: ${SPEC_ENV} is not set (run me through `sandbox-conformance witness`)",
            file=sys.stderr,
        )
        return 2
    try:
        spec = json.loads(Path(spec_file).read_text())
        # --mask-missing: the runtime-tools comparison (tests/test_adapters_e2e.py): the config
        # still masks {state}/db, but the state tree is not in the rootfs, so the path is missing.
        config = template(bind_state=not a.mask_missing)
        return launch(a.runtime, args, spec, config)
    except (OSError, ValueError, BundleNotBuilt) as e:
        print(f"oci adapter: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
