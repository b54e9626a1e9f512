"""Inside one VM guest (root, PID 1 is runners/vm/stage2.py, Debian's 6.12 kernel with AppArmor as its
LSM): the AppArmor host shape, with the real CLI. Prints one JSON document;
tests/test_host_shape_apparmor.py asserts.

    python3 -I -S apparmor_host.py --cli REPO/.venv/bin/sandbox-conformance --repo REPO \
        --user sbxc-test --parser-tree /var/cache/sandbox-conformance/apparmor-lab/parser

The shape: the caller runs under an AppArmor profile in enforce mode that allows everything the probe
and bwrap need (files with inherited exec, capabilities, network, mount, pivot_root, signals, ptrace)
but has no `userns,` rule. Upstream AppArmor (6.7+, security/apparmor/lsm.c apparmor_userns_create)
then refuses the confined task's user namespaces, root's included. The positive control is the same
profile WITH `userns,`: the ladder must pass under it.

How it is built, so that nothing leaks:
  securityfs    mounted at /sys/kernel/security (stage 2 mounts only proc, sys, dev, cgroup2);
  the parser    trixie's apparmor_parser 4.1 (scripts/apparmor-lab-deps), run by chroot into its tree
                from a private mount namespace (`unshare --mount --propagation private`) that bind-mounts
                /sys/kernel/security and /proc into it: the binds end with that namespace; the guest's
                mount table is recorded after, to show none is left;
  attachment    by path: each profile attaches to the files under its own directory in the guest's
                tmpfs-backed root (copies of the CLI's entry script and of /bin/dash), so `cli probe`
                and `sh -c 'bwrap ...'` start confined, as root and after setpriv as the user;
  policy        loaded into the GUEST's kernel only (the host's LSM state is never touched; the host
                this lab was written on has no AppArmor at all).
Stdlib only (`python3 -I -S`): it imports nothing of ours and records what it saw, never a verdict."""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import shlex
import shutil
import sys
import time

# -I leaves this program's own directory off sys.path: put it back for the shared helpers.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guest

LADDER = "bwrap,userns,userns.map,netns,pidns.proc,disable_userns"
TIMEOUT = 240  # one CLI command under TCG on a loaded 2-core host
sh = functools.partial(guest.sh, timeout=TIMEOUT)
read = functools.partial(guest.read, error_as_text=True)
BWRAP = "/usr/bin/bwrap"
SECURITYFS = "/sys/kernel/security"
LAB = "/usr/local/lib/sbxc-lab-apparmor"  # in the guest's tmpfs upper layer: never on the host
# One profile per directory; each attaches to every file in its directory (the CLI copy, the shell).
PROFILES = {"deny": "sbxc-lab-deny", "allow": "sbxc-lab-allow"}

# Everything a probe, a `run --print-mode` and bwrap need, but user namespaces. `file,` allows every
# file access with inherited exec (ix), so the trials' python3, bwrap and setpriv run under the same
# profile. `abi <abi/4.0>,` declares the policy ABI that has the userns class: the kernel mediates
# user-namespace creation only for policy compiled with it (parser 4.0+; bookworm's 3.0.8 cannot).
# attach_disconnected: after bwrap's pivot_root the paths it opens (/proc/PID/uid_map, the old root)
# no longer connect to the profile's namespace root, and without the flag AppArmor refuses them
# ("Failed name lookup - disconnected path", seen here: bwrap then says "setting up uid map:
# Permission denied"); Ubuntu's own profiles for sandboxes carry it for the same reason.
ABI = "abi <abi/4.0>,\n"  # once per file: the parser takes no second abi statement
PROFILE = """profile {name} {attach} flags=(enforce, attach_disconnected, mediate_deleted) {{
  file,
  capability,
  network,
  mount,
  umount,
  remount,
  pivot_root,
  signal,
  ptrace,
  unix,
  dbus,
  mqueue,
{extra}}}
"""




def as_user(user: str, command: str) -> str:
    # --reset-env: HOME, USER, PATH as a login would set them (the CLI reads ~/.config).
    return (f"setpriv --reuid={user} --regid={user} --init-groups --inh-caps=-all --reset-env -- "
            f"{command}")


def setup(cli: str) -> dict[str, str]:
    """The attach targets: per profile a copy of the CLI's entry script (its shebang names the venv's
    python, so it runs from anywhere) and of /bin/dash."""
    paths: dict[str, str] = {}
    for kind in PROFILES:
        os.makedirs(f"{LAB}/{kind}", exist_ok=True)
        for name, source in (("cli", cli), ("sh", "/bin/dash")):
            dest = f"{LAB}/{kind}/{name}"
            shutil.copyfile(source, dest)
            os.chmod(dest, 0o755)
            paths[f"{kind}_{name}"] = dest
    return paths


def load_policy(tree: str) -> dict[str, object]:
    """Compile and load both profiles with trixie's parser, chrooted into its tree from a private
    mount namespace; the policy text comes on stdin (`apparmor_parser -r` with no file reads it)."""
    text = ABI + "".join(PROFILE.format(name=PROFILES[kind], attach=f"{LAB}/{kind}/*",
                                  extra="  userns,\n" if kind == "allow" else "")
                   for kind in PROFILES)
    t = shlex.quote(tree)
    inner = (f"mkdir -p {t}{SECURITYFS} {t}/proc && mount --rbind {SECURITYFS} {t}{SECURITYFS} && "
             f"mount --rbind /proc {t}/proc && exec chroot {t} /usr/sbin/apparmor_parser -r -v")
    done = sh(f"unshare --mount --propagation private sh -c {shlex.quote(inner)}", timeout=120, stdin=text)
    done["policy"] = text
    return done


def commands(paths: dict[str, str], user: str) -> dict[str, str]:
    q = {k: shlex.quote(v) for k, v in paths.items()}
    bwrap_try = f"{BWRAP} --unshare-user --unshare-pid --unshare-net --ro-bind / / --proc /proc true"
    label = "cat /proc/self/attr/apparmor/current"
    out: dict[str, str] = {}
    for kind in PROFILES:
        cli, shell = q[f"{kind}_cli"], q[f"{kind}_sh"]
        out |= {
            # Root's ladder and the user's (setpriv from the confined process: the profile is kept).
            f"{kind}_probe": f"{cli} probe --json --only {LADDER} --as-user {user}",
            # The user starting the CLI themselves: attached at their own exec.
            f"{kind}_probe_user": as_user(user, f"{cli} probe --json --only {LADDER}"),
            f"{kind}_mode_root": f"{cli} run --print-mode",
            f"{kind}_mode_user": as_user(user, f"{cli} run --print-mode"),
            # bwrap's own words under the profile, and the label the task really had.
            f"{kind}_bwrap_root": f"{shell} -c {shlex.quote(bwrap_try)}",
            f"{kind}_bwrap_user": as_user(user, f"{shell} -c {shlex.quote(bwrap_try)}"),
            f"{kind}_label_root": f"{shell} -c {shlex.quote(label)}",
            f"{kind}_label_user": as_user(user, f"{shell} -c {shlex.quote(label)}"),
        }
    # The positive control needs less: root's and the user's ladder (one probe) and the user's
    # decision; dropping the other two keeps the boot inside its budget under TCG.
    for key in ("allow_probe_user", "allow_mode_root"):
        del out[key]
    # The same bwrap unconfined: the guest itself allows user namespaces.
    out["unconfined_bwrap_user"] = as_user(user, bwrap_try)
    out["unconfined_label"] = label
    return out


def mounts_under(prefix: str) -> list[str]:
    text = read("/proc/self/mountinfo") or ""
    return [line for line in text.splitlines() if len(line.split()) > 4
            and (line.split()[4] == prefix or line.split()[4].startswith(prefix.rstrip("/") + "/"))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--parser-tree", required=True)
    parser.add_argument("--lanes", type=int, default=2, help="CLI runs at a time (the guest has 2 vCPUs)")
    parser.add_argument("--only", default="", help="comma-separated command keys (default: all)")
    args = parser.parse_args()
    os.chdir(args.repo)
    started = time.monotonic()
    report: dict[str, object] = {"kernel": os.uname().release}
    if not os.path.isdir(f"{SECURITYFS}/apparmor"):
        report["securityfs_mount"] = sh(f"mount -t securityfs securityfs {SECURITYFS}", timeout=30)
    report["lsm"] = read(f"{SECURITYFS}/lsm")
    report["apparmor_enabled"] = read("/sys/module/apparmor/parameters/enabled")
    report["features_namespaces"] = sorted(os.listdir(f"{SECURITYFS}/apparmor/features/namespaces")) \
        if os.path.isdir(f"{SECURITYFS}/apparmor/features/namespaces") else None
    # Upstream says it mediates userns creation in the namespaces mask (apparmorfs.c aa_sfs_entry_ns:
    # "userns_create"); Ubuntu's kernels also have a namespaces/userns_create file.
    report["namespaces_mask"] = read(f"{SECURITYFS}/apparmor/features/namespaces/mask")
    report["sysctls"] = {name: read(f"/proc/sys/kernel/{name}") for name in (
        "apparmor_restrict_unprivileged_userns", "apparmor_restrict_unprivileged_unconfined",
        "unprivileged_userns_clone")}
    paths = setup(args.cli)
    report["load"] = load_policy(args.parser_tree)
    report["profiles"] = read(f"{SECURITYFS}/apparmor/profiles")
    report["tree_mounts_after_load"] = mounts_under(args.parser_tree)
    only = set(filter(None, args.only.split(",")))
    every = commands(paths, args.user)
    runs: dict[str, object] = {}
    report["runs"] = runs
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.lanes)) as pool:
        futures = {k: pool.submit(sh, c) for k, c in every.items() if not only or k in only}
        for key, fut in futures.items():
            runs[key] = fut.result()
    # The kernel's own word on each refusal (the audit records AppArmor prints to the kernel log).
    dmesg = sh("dmesg", timeout=30)
    report["audit"] = [line for line in str(dmesg["stdout"]).splitlines()
                       if "apparmor=" in line][:40]
    # Nothing of the parser's chroot is left in the guest's mount table (its binds lived in the
    # private namespace of one `unshare`), nor anything under the attach targets.
    report["tree_mounts_at_end"] = mounts_under(args.parser_tree) + mounts_under(LAB)
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
