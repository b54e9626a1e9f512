"""Inside one VM guest (root, PID 1 is runners/vm/stage2.py): kernel-policy host shapes, each with
the real CLI. Prints one JSON document; tests/test_host_shape_lab.py asserts.

    python3 -I -S kernel_policy.py --cli REPO/.venv/bin/sandbox-conformance --repo REPO --user sbxc-test

How each shape is made, so that none leaks into another:
  mount shapes    built in a throwaway `unshare --mount --propagation private` around each command
                  (a masked /proc file, a read-only /proc/sys, a setuid copy bound over bwrap);
  nesting         the CLI runs inside `bwrap --unshare-user --disable-userns`, as the user;
  sysctl shapes   written to /proc/sys and restored in a `finally` (the guest's own kernel), one
                  at a time, after every other shape.
Per shape: `probe --json --only LADDER --as-user USER` (root's ladder and the user's, one process),
`run --print-mode` as root and/or as the user (MODES), and bwrap's own words: the stderr of a plain
`bwrap --unshare-user ...` as root and as the user, and of `--disable-userns` as the user.
Stdlib only (`python3 -I -S`): it imports nothing of ours and records what it saw, never a verdict."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator

# -I leaves this program's own directory off sys.path: put it back for the shared helpers.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guest

LADDER = "bwrap,userns,userns.map,netns,pidns.proc,disable_userns"
TIMEOUT = 240  # one CLI command under TCG on a loaded 2-core host: ~15 s seen, generous margin
sh = functools.partial(guest.sh, timeout=TIMEOUT)
BWRAP = "/usr/bin/bwrap"
# A file under /proc present on every kernel this boots: Docker's masked paths cover it too.
MASK_TARGET = "/proc/keys"
SETUID_COPY = "/var/tmp/sbxc-lab-bwrap-setuid"



def write(path: str, value: str) -> str:
    with open(path) as f:
        old = f.read().strip()
    with open(path, "w") as f:
        f.write(value)
    return old


@contextlib.contextmanager
def sysctl(path: str, value: str) -> Iterator[None]:
    old = write(path, value)
    try:
        yield
    finally:
        write(path, old)


def as_user(user: str, command: str) -> str:
    # --reset-env: HOME, USER, PATH as a login would set them (the CLI reads ~/.config).
    return (f"setpriv --reuid={user} --regid={user} --init-groups --inh-caps=-all --reset-env -- "
            f"{command}")


def nested(command: str, repo: str) -> str:
    """The command one level down in the sandbox a bwrap-based agent sandbox gives: its own user
    namespace with nesting disabled (bwrap >= 0.8 sets max_user_namespaces=1 in it, bubblewrap.c)."""
    return (f"{BWRAP} --unshare-user --disable-userns --die-with-parent --ro-bind / / --dev /dev "
            f"--proc /proc --tmpfs /tmp --ro-bind {shlex.quote(repo)} {shlex.quote(repo)} "
            f"--chdir {shlex.quote(repo)} -- {command}")


def in_mount_ns(setup: str, command: str) -> str:
    return f"unshare --mount --propagation private sh -c {shlex.quote(f'{setup} && exec {command}')}"


MOUNT_SHAPES = {
    # Docker's masked paths, in small: /dev/null over one /proc file (a locked mount over /proc
    # contents: fs/namespace.c mount_too_revealing refuses a fresh procfs in a new user namespace).
    "masked_proc": f"mount --bind /dev/null {MASK_TARGET}",
    # Docker's readonlyPaths, systemd-nspawn: /proc/sys bound read-only over itself.
    "readonly_proc_sys": "mount -o bind,ro /proc/sys /proc/sys",
    # A setuid copy of the installed bwrap over the real path (bubblewrap's setuid mode).
    "setuid_bwrap": f"mount --bind {SETUID_COPY} {BWRAP}",
}
SYSCTL_SHAPES = {
    # Debian's patch (kernel/fork.c): CLONE_NEWUSER needs CAP_SYS_ADMIN while this is 0.
    "unprivileged_userns_clone=0": ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
    # RHEL/CentOS >= 7.4's knob, upstream: no user namespace at all, root included (kernel/ucount.c).
    "max_user_namespaces=0": ("/proc/sys/user/max_user_namespaces", "0"),
}
# Both at once: Debian <= 10 shipped exactly this (the sysctl at 0 and a setuid bwrap).
COMBINED = {"setuid_bwrap+unprivileged_userns_clone=0": ("setuid_bwrap", "unprivileged_userns_clone=0")}


def commands(cli: str, user: str) -> dict[str, str]:
    q = shlex.quote(cli)
    bwrap_try = f"{BWRAP} --unshare-user --unshare-pid --unshare-net --ro-bind / / --proc /proc true"
    return {
        "probe": f"{q} probe --json --only {LADDER} --as-user {user}",
        "mode_root": f"{q} run --print-mode",
        "mode_user": as_user(user, f"{q} run --print-mode"),
        # bwrap's own words for the shape, as a user meets them.
        "bwrap_root": bwrap_try,
        "bwrap_user": as_user(user, bwrap_try),
        "bwrap_nested_user": as_user(user, f"{BWRAP} --unshare-user --disable-userns --ro-bind / / true"),
    }


# Which `run --print-mode` each shape needs: the identity the shape is about (a container's root for
# /proc masks, a user for setuid and the sysctls that exempt root), both where they differ.
MODES = {
    "baseline": ("mode_user",),
    "masked_proc": ("mode_root",),
    "readonly_proc_sys": ("mode_root",),
    "setuid_bwrap": ("mode_user",),
    "unprivileged_userns_clone=0": ("mode_root", "mode_user"),
    "max_user_namespaces=0": ("mode_user",),
    "setuid_bwrap+unprivileged_userns_clone=0": ("mode_user",),
}
BWRAP_LINES = ("bwrap_root", "bwrap_user", "bwrap_nested_user")


def run_shape(name: str, cmds: dict[str, str], wrap: Callable[[str], str],
              lanes: int = 1) -> dict[str, object]:
    """The shape's commands, `lanes` at a time (they only read the shape, never change it)."""
    started = time.monotonic()
    out: dict[str, object] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=lanes) as pool:
        futures = {key: pool.submit(sh, wrap(command)) for key, command in cmds.items()}
        for key, fut in futures.items():
            out[key] = fut.result()
    out["seconds"] = round(time.monotonic() - started, 1)
    print(f"lab: {name}: {out['seconds']}s", file=sys.stderr, flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--lanes", type=int, default=2, help="shapes without global state run this many "
                        "at a time (the guest has 2 vCPUs)")
    args = parser.parse_args()
    guest.hide_engines()
    os.chdir(args.repo)
    only = set(filter(None, args.only.split(",")))
    every = commands(args.cli, args.user)
    shapes: dict[str, object] = {}
    report = {"kernel": os.uname().release, "shapes": shapes}

    def pick(name: str) -> dict[str, str]:
        return {k: every[k] for k in ("probe", *MODES[name], *BWRAP_LINES)}

    def wanted(name: str) -> bool:
        return not only or name in only

    # Phase 1: shapes that live in their own mount namespace (or none): independent of each other,
    # so they share the guest's two vCPUs. Phase 2 changes kernel-wide sysctls: one shape at a time,
    # its commands sharing the vCPUs instead. Never more than `lanes` CLI runs at once: each probe
    # trial has 10 s, and under TCG two at a time already take up to ~5.5 s (seen).
    local: dict[str, tuple[dict[str, str], Callable[[str], str]]] = {}
    if wanted("baseline"):
        local["baseline"] = (pick("baseline"), lambda c: c)
    for name, setup in MOUNT_SHAPES.items():
        if wanted(name):
            local[name] = (pick(name), lambda c, s=setup: in_mount_ns(s, c))
    if wanted("nested"):
        inner = every["probe"].replace(f" --as-user {args.user}", "")
        local["nested"] = ({
            "probe_user": as_user(args.user, nested(inner, args.repo)),
            "mode_user": as_user(args.user, nested(f"{shlex.quote(args.cli)} run --print-mode", args.repo)),
        }, lambda c: c)
    with open(BWRAP, "rb") as src, open(SETUID_COPY, "wb") as dst:
        dst.write(src.read())
    os.chmod(SETUID_COPY, 0o4755)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.lanes)) as pool:
            futures = {name: pool.submit(run_shape, name, cmds, wrap) for name, (cmds, wrap) in local.items()}
            for name, fut in futures.items():
                shapes[name] = fut.result()
        for name, (path, value) in SYSCTL_SHAPES.items():
            if wanted(name):
                with sysctl(path, value):
                    shapes[name] = run_shape(name, pick(name), lambda c: c, lanes=args.lanes)
        for name, (mount_shape, sysctl_shape) in COMBINED.items():
            if wanted(name):
                path, value = SYSCTL_SHAPES[sysctl_shape]
                with sysctl(path, value):
                    shapes[name] = run_shape(name, pick(name),
                                             lambda c, m=mount_shape: in_mount_ns(MOUNT_SHAPES[m], c),
                                             lanes=args.lanes)
    finally:
        os.unlink(SETUID_COPY)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
