"""The OpenAI Codex CLI's own sandbox (npm @openai/codex), as `codex sandbox [-c ...] -- CMD`: the one
Codex puts around the commands its agent runs, with no model and no account involved.

On Linux Codex runs the command through its helper (codex-linux-sandbox, re-executed from Codex's own
binary) in a bubblewrap it bundles: the host's `/` bound read-only, the profile's "write" paths bound
back read-write, every "none" path covered by an empty read-only tmpfs of mode 000 (EACCES, even for
root: the task holds no capability), protected names under a writable root (.git, .codex, .agents,
.aws) covered read-only, new user, pid, ipc, mount and network namespaces, every capability dropped,
no_new_privs and a seccomp filter that refuses socket(2) for the network families (EPERM).

The permissions profile is built from the task spec ($SANDBOX_CONFORMANCE_TASK_SPEC), per task, and
given with `-c` (Codex's config overrides, parsed as TOML), so nothing of it lives in a config file:
    default_permissions = "sbxc"
    permissions.sbxc.filesystem = { ":root" = "read", {workdir} = "write", {user_tmp} = "write",
                                    {state}/db = "none", {neighbour_control} = "none", {other_user} = "none" }
CODEX_HOME is a directory of the caller's own outside /tmp (~/.cache/sandbox-conformance/codex-home):
Codex writes its helper's alias there and refuses to do so under the temp dir (then the sandbox cannot
start: "execvp codex-linux-sandbox"). HOME is the task's workdir, as for the other adapters.
Codex's two directories in the temp dir stay there, as any use of Codex leaves them: the
`codex-bwrap-synthetic-mount-targets-UID` directory and its `lock` are, by the binary's own messages,
the "synthetic bubblewrap mount registry" that every Codex of one user shares to track the placeholder
mount targets it creates for paths that do not exist (and to remove stale ones). A TMPDIR of the
launch's own made it private to one Codex (018d38f, reverted): the first launch of a fresh clone then
hung for 25 s, once, with the matrix's Codex columns running beside it (the likely cause: two
registries, so neither Codex saw the other's targets; not reproduced alone). `codex-daemon-UID` is
made there whatever TMPDIR says and masked by a mode-000 tmpfs in every sandbox Codex makes; rmdir(2)
of it while another Codex holds it as a mount point would detach that mount there.

Launcher command (the witness appends `python3 -I -S -`, run here with the pinned /usr/bin/python3):
    PYTHON -m sandbox_conformance.conformance.adapters.codex --
"""

from __future__ import annotations

import json
import os
import platform
import pwd
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.conformance.adapters._unavailable import Unavailable
from sandbox_conformance.conformance.adapters.srt import (
    EX_USAGE,
    SYSTEM_PATH,
    installed,
    launcher_dir_entries,
    npm_prefix,
    pinned,
    read_spec,
    run,
    tool_env,
)

PACKAGE = "@openai/codex"
VERSION = "0.171.0"  # pinned: codex.toml describes what this version does
PROFILE = "sbxc"
# The native binary the npm package's launcher (bin/codex.js) executes, by platform package.
NATIVE = {"x86_64": ("@openai/codex-linux-x64", "x86_64-unknown-linux-musl")}
HOME_DIR = ".cache/sandbox-conformance/codex-home"


def node(env: Mapping[str, str]) -> str:
    found = shutil.which("node", path=env.get("PATH") or SYSTEM_PATH)
    if found is None:
        raise Unavailable("codex's launcher needs node, not on PATH (apt-get install nodejs)")
    return found


def cli(env: Mapping[str, str]) -> Path:
    prefix = npm_prefix(env)
    why = installed(prefix, PACKAGE, VERSION)
    if why:
        raise Unavailable(why)
    machine = platform.machine()
    if machine not in NATIVE:
        raise Unavailable(f"no native codex is pinned for {machine} (known: {', '.join(NATIVE)})")
    package, triple = NATIVE[machine]
    binary = prefix / "node_modules" / package / "vendor" / triple / "bin" / "codex"
    if not os.access(binary, os.X_OK):
        raise Unavailable(f"{package} (codex's native binary) is not installed under {prefix}")
    return prefix / "node_modules" / PACKAGE / "bin" / "codex.js"


def prefix(env: Mapping[str, str]) -> str:
    """The --launcher prefix; Unavailable when codex or node is missing."""
    cli(env)
    node(env)
    return shlex.join([sys.executable or "python3", "-m", "sandbox_conformance.conformance.adapters.codex",
                       "--"])


def _toml(value: Any) -> str:
    # A TOML string or inline table, as `codex -c key=VALUE` parses VALUE (JSON strings are TOML
    # basic strings for the paths a layout has).
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def filesystem(spec: Mapping[str, Any], launcher_dir: Sequence[str] = ()) -> dict[str, str]:
    """The permissions profile's filesystem table for this task (PURE). `launcher_dir`: the entries of
    the launcher's own directory, "none" as well (srt.launcher_dir_entries: its .env, its sockets)."""
    return {
        ":root": "read",
        spec["workdir"]: "write",
        spec["user_tmp"]: "write",
        f"{spec['state']}/db": "none",
        spec["neighbour_control"]: "none",
        spec["other_user"]: "none",
        **{p: "none" for p in launcher_dir},
    }


def overrides(spec: Mapping[str, Any], launcher_dir: Sequence[str] = ()) -> list[str]:
    """`codex sandbox` arguments that select the per-task permissions profile (PURE)."""
    return [
        "-c",
        f"default_permissions={_toml(PROFILE)}",
        "-c",
        f"permissions.{PROFILE}.filesystem={_toml(filesystem(spec, launcher_dir))}",
    ]


def codex_home() -> Path:
    home = Path(pwd.getpwuid(os.getuid()).pw_dir) / HOME_DIR
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args or not args[args.index("--") + 1 :]:
        print("usage: python -m sandbox_conformance.conformance.adapters.codex -- CMD...", file=sys.stderr)
        return EX_USAGE
    cmd = pinned(args[args.index("--") + 1 :])
    try:
        js, exe = cli(os.environ), node(os.environ)
        spec, _ = read_spec(os.environ)
        home = codex_home()
    except (Unavailable, ValueError, OSError) as e:
        print(f"codex adapter: {e}", file=sys.stderr)
        return EX_USAGE
    # Codex passes its environment to the command (and its helper, PID 1 inside, keeps it): the tool
    # gets the allowlisted names only, so the launcher's secrets stay with the launcher.
    env = tool_env(os.environ, CODEX_HOME=str(home), HOME=spec["workdir"])
    here = os.getcwd()
    own_dir = launcher_dir_entries(spec, here, os.listdir(here))
    return run([exe, str(js), "sandbox", *overrides(spec, own_dir), "--", *cmd], env=env, cwd=spec["workdir"])


if __name__ == "__main__":
    sys.exit(main())
