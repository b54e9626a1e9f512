"""Inside one VM guest booted with systemd as PID 1 (runners/vm/qemu.py SystemdGuest): the host shape most
users have. Runs as root in the guest's command unit; prints one JSON document that
tests/test_host_shape_lab.py asserts.

    python3 -I -S systemd_host.py --cli REPO/.venv/bin/sandbox-conformance --user sbxc-test --out DIR \
        --launch-timeout SECONDS

In order, in one boot:
  linger      `loginctl enable-linger USER`: logind starts user@UID.service, the user's manager;
  probe       as USER, with the environment a login gives (XDG_RUNTIME_DIR, the session bus):
              systemd_user, cgroup, cgroup.delegation;
  delegate    `run --delegate` as USER: re-executed under `systemd-run --user -p Delegate=yes`, the
              witness suite with reports in DIR (the cgroup witnesses must run in that subtree);
  adapter     `witness --adapter systemd-run` as root: transient system services as the sandbox;
  deployment  a signature naming a unit suffix; a transient unit with that name started under the
              system manager, then under USER's manager: `probe --only deployment`, and `run` under
              auto, with each unit active and with none (the control).
Stdlib only (`python3 -I -S`): it records what it saw, never a verdict."""

from __future__ import annotations

import argparse
import functools
import json
import os
import pwd
import sys
import time

# -I leaves this program's own directory off sys.path: put it back for the shared helpers.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guest

TIMEOUT = 600  # a witness suite under TCG on a loaded 2-core host
# The witness's own per-launch default, for a native host: the host passes the guest's own
# (runners/vm/mode.py LAUNCH_TIMEOUT, 120 s under TCG), as the VM mode does (issue 28).
LAUNCH_TIMEOUT = 30.0
sh = functools.partial(guest.run, timeout=TIMEOUT, log=True)
read = guest.read
# The signature's unit suffix, and the transient unit that carries it under each manager: a name
# nothing else on a Debian host ends with (gpg-agent.service would match a bare "-agent.service").
SUFFIX = "-sbxc-lab-agent.service"
UNIT = "deploy-sbxc-lab-agent"




def adapter_argv(cli: str, out: str, launch_timeout: float) -> list[str]:
    """The adapter leg: every promise through transient system services, each launch given the
    guest's launch timeout (a TCG guest's launch is 10-20x a native one, more under load)."""
    return [cli, "witness", "--adapter", "systemd-run", "--launch-timeout", str(launch_timeout),
            "--json", f"{out}/adapter.json", "--junitxml", f"{out}/adapter.xml"]


def wait_for(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.5)
    return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--out", required=True, help="a directory the user may write reports into")
    parser.add_argument("--launch-timeout", type=float, default=LAUNCH_TIMEOUT,
                        help="per task launch, each witness's --timeout: the host's choice for this guest")
    args = parser.parse_args()
    guest.hide_engines()
    pw = pwd.getpwnam(args.user)
    runtime = f"/run/user/{pw.pw_uid}"
    cli = args.cli
    report: dict[str, object] = {"kernel": os.uname().release, "pid1": read("/proc/1/comm"),
                                 "own_cgroup": read("/proc/self/cgroup")}

    def as_user(*argv: str, extra_env: dict[str, str] | None = None) -> list[str]:
        # What a login session gives a user: its runtime directory and session bus (pam_systemd).
        env = {"XDG_RUNTIME_DIR": runtime, "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime}/bus",
               **(extra_env or {})}
        return ["setpriv", f"--reuid={args.user}", f"--regid={args.user}", "--init-groups",
                "--inh-caps=-all", "--reset-env", "--", "env", *(f"{k}={v}" for k, v in env.items()), *argv]

    os.makedirs(args.out, exist_ok=True)
    os.chmod(args.out, 0o1777)

    report["linger"] = sh(["loginctl", "enable-linger", args.user], timeout=120)
    report["user_manager_up"] = wait_for(f"{runtime}/systemd/private", 180) and wait_for(f"{runtime}/bus", 60)
    service = f"/sys/fs/cgroup/user.slice/user-{pw.pw_uid}.slice/user@{pw.pw_uid}.service"
    report["user_service_controllers"] = read(f"{service}/cgroup.controllers")
    report["probe_user"] = sh(as_user(cli, "probe", "--json", "--only",
                                      "systemd_user,cgroup,cgroup.delegation"), cwd=args.repo)

    out = args.out
    # Only the cgroup promises, the point of --delegate: the other launches (lifecycle, terminal) cost
    # tens of seconds each in a TCG guest, and its default 30 s launch timeout ran out under load.
    report["delegate"] = sh(as_user(cli, "run", "--delegate", "--only", "cgroup,memory_max,pids_max",
                                    "--json", f"{out}/delegate.json",
                                    "--junitxml", f"{out}/delegate.xml"), cwd=args.repo)

    report["adapter"] = sh(adapter_argv(cli, out, args.launch_timeout), cwd=args.repo)

    signature = f"{out}/deployment.toml"
    with open(signature, "w") as f:
        f.write(f'[deployment]\nunit_suffixes = ["{SUFFIX}"]\n')
    os.chmod(signature, 0o644)
    promise = {"SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG": signature}
    root_env = {**os.environ, **promise}
    deployment: dict[str, object] = {}
    report["deployment"] = deployment
    deployment["clear_probe"] = sh([cli, "probe", "--json", "--only", "deployment"], env=root_env,
                                   cwd=args.repo)
    deployment["system_start"] = sh(["systemd-run", f"--unit={UNIT}", "--service-type=exec", "sleep", "900"],
                                    timeout=60)
    try:
        deployment["system_probe"] = sh([cli, "probe", "--json", "--only", "deployment"], env=root_env,
                                        cwd=args.repo)
        deployment["system_run"] = sh([cli, "run"], env=root_env, cwd=args.repo)
    finally:
        deployment["system_stop"] = sh(["systemctl", "stop", f"{UNIT}.service"], timeout=60)
    deployment["user_start"] = sh(as_user("systemd-run", "--user", f"--unit={UNIT}", "--service-type=exec",
                                          "sleep", "900"), timeout=60)
    try:
        deployment["user_probe"] = sh(as_user(cli, "probe", "--json", "--only", "deployment",
                                              extra_env=promise), cwd=args.repo)
        deployment["user_mode"] = sh(as_user(cli, "run", "--print-mode", extra_env=promise), cwd=args.repo)
    finally:
        deployment["user_stop"] = sh(as_user("systemctl", "--user", "stop", f"{UNIT}.service"), timeout=60)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
