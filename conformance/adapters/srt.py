"""Anthropic's sandbox-runtime (`srt`, npm @anthropic-ai/sandbox-runtime) as a sandbox.

On Linux srt wraps the command in bubblewrap: the host's `/` bound read-only, the `allowWrite` paths
bound back read-write, every `denyRead` directory covered by an EMPTY WRITABLE tmpfs (nothing written
there reaches the host), a network namespace of its own whose only way out is srt's HTTP/SOCKS proxy
(a process on the host, relayed in over a unix socket by socat and named in HTTPS_PROXY and its kin),
and a helper (apply-seccomp) that refuses AF_UNIX sockets and every door to a new user namespace
(srt's README, "Linux" and "The command stays in the namespaces made for it").

The settings srt gets are built from the task spec ($SANDBOX_CONFORMANCE_TASK_SPEC), per task:
  filesystem.denyRead   {state}/db, {neighbour_control}, {other_user}   (srt.toml: hidden)
  filesystem.allowWrite {workdir}, {user_tmp}                           (writable; the rest read-only)
  network.allowedDomains  for a `proxy` profile, the names the suite serves (ROOT/network.json, written
      by conformance/plan.py), each with the address:port it is served at: srt refuses a name that
      resolves to loopback or to one of the host's own addresses unless that literal is allowed too
      (README, "Resolved-address check"), so loopback at any other port stays refused. For `none`: [].

Where srt keeps its own files: TMPDIR (the settings, its proxy sockets claude-http-*.sock, which it
binds into the task) is a short directory of its own in /tmp, removed once srt has exited; HOME is
{workdir}: srt binds "~/.npm/_logs" and "~/.claude/debug" read-write into every command as a
convenience, and with the caller's real home those would be host directories writable from every task
(the write-surface witness names them).

Launcher command (the witness appends `python3 -I -S -`, run here with the pinned /usr/bin/python3):
    PYTHON -m sandbox_conformance.conformance.adapters.srt --
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.conformance.adapters._unavailable import Unavailable
from sandbox_conformance.processes import owner
from sandbox_conformance.processes.children import die_with_parent

# Shared with conformance/adapters/codex.py, the other npm-installed agent sandbox: installed, npm_prefix,
# tool_env, launcher_dir_entries,
# pinned, read_spec, run.

SPEC_ENV = "SANDBOX_CONFORMANCE_TASK_SPEC"  # conformance.launch.SPEC_ENV (not imported: keep this light)
NPM_PREFIX_ENV = "SANDBOX_CONFORMANCE_NPM_PREFIX"
DEFAULT_NPM_PREFIX = "/var/cache/sandbox-conformance/npm"  # scripts/test-tier-deps installs here
PACKAGE = "@anthropic-ai/sandbox-runtime"
VERSION = "0.0.83"  # pinned: srt.toml describes what this version does
NETWORK_FILE = "network.json"  # conformance.plan.NETWORK_FILE
EX_USAGE = 64
EX_TEMPFAIL = 75
# The witness's own launch timeout is 30 s by default: give up (and clean up) before it kills us.
RUN_TIMEOUT = 25.0
OWN_PREFIX = "sbxc-srt-"
SYSTEM_PATH = "/usr/bin:/bin"


def npm_prefix(env: Mapping[str, str]) -> Path:
    return Path(env.get(NPM_PREFIX_ENV) or DEFAULT_NPM_PREFIX)


def installed(prefix: Path, package: str, version: str) -> str | None:
    """Why the pinned npm package is not usable under `prefix`, or None."""
    meta = prefix / "node_modules" / package / "package.json"
    try:
        found = json.loads(meta.read_text()).get("version")
    except FileNotFoundError:
        return f"{package}@{version} is not installed under {prefix} (scripts/test-tier-deps installs it)"
    except (OSError, ValueError) as e:
        return f"cannot read {meta}: {e}"
    if found != version:
        return f"{package} {found} is installed under {prefix}, the adapter is pinned to {version}"
    return None


def tools(env: Mapping[str, str]) -> dict[str, str]:
    """node, bwrap, socat and rg as srt will run them, or Unavailable naming what is missing."""
    path = env.get("PATH") or SYSTEM_PATH
    found = {name: shutil.which(name, path=path) for name in ("node", "bwrap", "socat", "rg")}
    missing = [n for n, p in found.items() if p is None]
    if missing:
        packages = {"node": "nodejs", "bwrap": "bubblewrap", "socat": "socat", "rg": "ripgrep"}
        raise Unavailable(
            f"srt needs {', '.join(missing)}, not on PATH "
            f"(apt-get install {' '.join(packages[m] for m in missing)})"
        )
    return {n: str(p) for n, p in found.items()}


def cli(env: Mapping[str, str]) -> Path:
    prefix = npm_prefix(env)
    why = installed(prefix, PACKAGE, VERSION)
    if why:
        raise Unavailable(why)
    return prefix / "node_modules" / PACKAGE / "dist" / "cli.js"


def prefix(env: Mapping[str, str]) -> str:
    """The --launcher prefix; Unavailable when srt or what it runs on is missing."""
    cli(env)
    tools(env)
    return shlex.join([sys.executable or "python3", "-m", "sandbox_conformance.conformance.adapters.srt",
                       "--"])


# ---- the settings, from the task spec ----------------------------------------------------------------


def allowed_domains(network: Mapping[str, Any] | None) -> list[str]:
    """Each served name, and the literal address:port it is served at (see the module doc)."""
    if not network or network.get("mode") != "proxy":
        return []
    out: list[str] = []
    for name in network.get("allowed", []):
        out.append(name)
        for s in network.get("served", []):
            if s["name"] == name:
                out.append(f"{s['address']}:{s['port']}")
    return list(dict.fromkeys(out))


# What the tool (and through it, the task) gets of the launcher's environment: srt passes its whole
# environment to the command, and bwrap's own PID 1 keeps it too, so a secret the launcher holds (an
# API key) would be readable in every process of the sandbox (/proc/PID/environ). HOME and TMPDIR are
# set by the adapter.
TOOL_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")


def tool_env(env: Mapping[str, str], **fixed: str) -> dict[str, str]:
    """The tool's environment: the allowlisted names of `env`, then `fixed` (PURE)."""
    out = {k: env[k] for k in TOOL_ENV if k in env}
    out.setdefault("PATH", SYSTEM_PATH)
    return {**out, **fixed}


def launcher_dir_entries(spec: Mapping[str, Any], launcher_dir: str, names: Sequence[str]) -> list[str]:
    """What of the launcher's own directory to deny the task (PURE): each of its entries (`names`) but
    the one that leads to the task's state. That is where a platform keeps its .env and its daemon's
    socket (the witness's layout root: .env, run/agentd.sock). Nothing when the launcher runs in `/` or
    inside the task's own trees. Entry by entry, not the directory with the state read back: srt then
    cannot make its mount points for the mandatory denies in the workdir (bwrap: "Can't create file
    at .../work/.gitconfig: Read-only file system", srt 0.0.83)."""
    here = Path(launcher_dir)
    if here == Path("/") or any(here.is_relative_to(spec[k]) for k in ("state", "workdir")):
        return []
    state = Path(spec["state"])
    keep = state.relative_to(here).parts[0] if state.is_relative_to(here) else None
    return [str(here / n) for n in sorted(names) if n != keep]


def settings(
    spec: Mapping[str, Any],
    network: Mapping[str, Any] | None,
    found: Mapping[str, str],
    launcher_dir: Sequence[str] = (),
) -> dict[str, Any]:
    """srt's settings file for this task (PURE). `launcher_dir`: the entries of the launcher's own
    directory to deny as well (launcher_dir_entries). No setting makes /proc/sys read-only: srt emits
    every deny bind first and bwrap's --proc last (dist/sandbox/linux-sandbox-utils.js), so a
    denyWrite of /proc/sys lies under the fresh procfs (srt.toml: kernel_interfaces not claimed)."""
    deny = [*launcher_dir, f"{spec['state']}/db", spec["neighbour_control"], spec["other_user"]]
    return {
        "network": {"allowedDomains": allowed_domains(network), "deniedDomains": []},
        "filesystem": {
            "denyRead": deny,
            "allowRead": [],
            "allowWrite": [spec["workdir"], spec["user_tmp"]],
            "denyWrite": [],
        },
        # The binaries srt runs, as resolved here, not looked up again on whatever PATH it has.
        "bwrapPath": found["bwrap"],
        "socatPath": found["socat"],
        "ripgrep": {"command": found["rg"]},
    }


def pinned(cmd: Sequence[str]) -> list[str]:
    """`python3 ...` with the system interpreter (a pyenv shim first on PATH is not the sandbox's)."""
    cmd = list(cmd)
    if cmd and cmd[0] == "python3":
        cmd[0] = shutil.which("python3", path=SYSTEM_PATH) or "/usr/bin/python3"
    return cmd


def read_spec(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The task spec, and the network the suite set up beside it (None when it set up none)."""
    name = env.get(SPEC_ENV)
    if not name:
        raise ValueError(f"${SPEC_ENV} is not set: run me as the witness suite's --launcher")
    spec = dict(json.loads(Path(name).read_text()))
    try:
        network = json.loads((Path(name).parent / NETWORK_FILE).read_text())
    except FileNotFoundError:
        network = None
    return spec, network


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args or not args[args.index("--") + 1 :]:
        print("usage: python -m sandbox_conformance.conformance.adapters.srt -- CMD...", file=sys.stderr)
        return EX_USAGE
    cmd = pinned(args[args.index("--") + 1 :])
    try:
        found = tools(os.environ)
        js = cli(os.environ)
        spec, network = read_spec(os.environ)
    except (Unavailable, ValueError, OSError) as e:
        print(f"srt adapter: {e}", file=sys.stderr)
        return EX_USAGE
    # srt's own files (this settings file, its proxy sockets, its empty mount sources) go where srt's
    # TMPDIR says: a fresh short directory in /tmp, since a unix socket's path must fit in 108 bytes
    # (unix(7), sun_path) and the task's layout is deeper than that. Removed once srt has exited; the
    # owner's stamp in its name lets a later sweep remove it after a SIGKILL (processes/owner.py).
    own = Path(tempfile.mkdtemp(prefix=f"{OWN_PREFIX}{owner.stamp()}-"))
    try:
        settings_file = own / "settings.json"
        here = os.getcwd()
        own_dir = launcher_dir_entries(spec, here, os.listdir(here))
        settings_file.write_text(json.dumps(settings(spec, network, found, own_dir), indent=2))
        env = tool_env(os.environ, TMPDIR=str(own), HOME=spec["workdir"])
        return run(
            [found["node"], str(js), "--settings", str(settings_file), "--", *cmd],
            env=env,
            cwd=spec["workdir"],
        )
    finally:
        shutil.rmtree(own, ignore_errors=True)


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: str) -> int:
    """The tool as our child, with our stdio (the witness program on stdin, its document on stdout),
    so that we are still here to clean up after it. SIGTERM is passed on; RUN_TIMEOUT bounds it. The
    tool dies with us (PR_SET_PDEATHSIG): a platform whose worker is SIGKILLed must not leave the
    tool, and the task it runs, behind (the lifecycle promise)."""
    proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, preexec_fn=die_with_parent())
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        code = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        print(
            f"adapter: {os.path.basename(argv[1])} still running after {RUN_TIMEOUT:g}s: killed",
            file=sys.stderr,
        )
        return EX_TEMPFAIL
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
