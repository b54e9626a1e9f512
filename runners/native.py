"""Native mode: run the witness suite on this host, in this environment, as a child of this process."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable, Mapping, Sequence

from conformance.handover import FINDINGS_ENV, GUARD_PROBES, handover
from probes.finding import Finding
from probes.run import run
from runners.witness_args import WitnessOptions

# Native mode never builds a cgroup root and never rearranges the host's tree. An inherited
# promise would make the cgroup witnesses fail on a root this run did not make (set and unusable is
# a failure, by design), so it is dropped: the witnesses fall through to the probe's resolved root,
# usable only where the run has a delegated subtree of its own (systemd-run --user -p Delegate=yes).
DROPPED_ENV = ("SANDBOX_CONFORMANCE_CGROUP_ROOT",)

# Set in the environment of a run re-executed under systemd-run, so it does not re-execute again.
DELEGATED_ENV = "SANDBOX_CONFORMANCE_DELEGATED"


def witness_argv(options: WitnessOptions, *, python: str = sys.executable) -> list[str]:
    return [python, "-m", "commands.cli", "witness", *options.argv()]


def native_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in DROPPED_ENV}


def delegate_argv(run_argv: Sequence[str], *, systemd_run: str, python: str = sys.executable) -> list[str]:
    """Re-execute `run` under the user manager, in a transient unit with a delegated cgroup subtree.

    `--pipe --wait` rather than the `--pty` a person types: our child runs in its own session (so a
    timeout can kill its group), which cannot own the terminal; the suite needs no tty, and
    stdout/stderr and the exit status still flow back (systemd-run(1))."""
    return [systemd_run, "--user", "--quiet", "--collect", "-p", "Delegate=yes", "--pipe", "--wait",
            f"--setenv={DELEGATED_ENV}=1", f"--working-directory={os.getcwd()}",
            "--", *(unit_literal(a) for a in ("/bin/sh", "-c", ENTER_SUPERVISOR, "sh", python, "-m",
                                               "commands.cli", "run", *run_argv))]


def unit_literal(arg: str) -> str:
    """An argument systemd passes on as written: the manager expands `$NAME` and `${NAME}` in every
    command line it starts, transient ones included, and `$$` is a literal `$` (systemd.service(5),
    "Command lines"; systemd-run only gained --expand-environment=no in 254, Debian 12 has 252).
    Unescaped, the shell below lost every variable (observed: the move never happened)."""
    return arg.replace("$", "$$")


# The unit's cgroup is the delegated root, and the rerun starts in it: cgroup v2's "no internal
# processes" rule then refuses to enable memory/pids for its children (EBUSY, observed with systemd
# 252 on a real kernel, tests/test_host_shape_lab.py), so the cgroup witnesses could never run. The
# rerun moves itself into a `supervisor/` child first and enables memory and pids for the root's
# children, as runners/cgroup_setup.py does in the VM and container modes (systemd >= 254 does the
# move with DelegateSubgroup=); the probe's root stays the unit (probes/cgroup.py resolve_root), and
# the tasks' leaves are made beside supervisor/. A step that fails changes nothing else: the probe
# then says why.
ENTER_SUPERVISOR = (
    'while IFS= read -r line; do case "$line" in 0::*) own="${line#0::}" ;; esac; done < /proc/self/cgroup; '
    'cg="/sys/fs/cgroup${own:-/nowhere}"; '
    '{ mkdir -p "$cg/supervisor" && echo $$ > "$cg/supervisor/cgroup.procs" && '
    'for c in memory pids; do echo "+$c" > "$cg/cgroup.subtree_control"; done; } 2>/dev/null; '
    'exec "$@"'
)


def run_native(options: WitnessOptions, *, timeout: float, environ: Mapping[str, str] | None = None,
               findings: Iterable[Finding] = ()) -> int | None:
    """`findings`: what this run already probed, handed to the witness process so it does not probe
    the same things again (conformance/settings.py: it re-probes where the user or the environment
    they depend on differ)."""
    ours = os.environ if environ is None else environ
    env = native_env(ours)
    guard = [f for f in findings if f.probe in GUARD_PROBES]
    if guard and options.as_user is None:
        # Made in our environment, which native_env may have changed: the record says which.
        env[FINDINGS_ENV] = handover(guard, as_user=None, environ=ours)
    # SIGTERM if we die: the witness run is ours and removes its own layout and leaves on the way out.
    return run(witness_argv(options), timeout=timeout, env=env, capture=False,
               die_with=signal.SIGTERM).returncode
