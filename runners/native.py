"""Native mode: run the witness suite on this host, in this environment, as a child of this process."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence

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
    return [python, "-m", "runners.cli", "witness", *options.argv()]


def native_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in DROPPED_ENV}


def delegate_argv(run_argv: Sequence[str], *, systemd_run: str, python: str = sys.executable) -> list[str]:
    """Re-execute `run` under the user manager, in a transient unit with a delegated cgroup subtree.

    `--pipe --wait` rather than the `--pty` a person types: our child runs in its own session (so a
    timeout can kill its group), which cannot own the terminal; the suite needs no tty, and
    stdout/stderr and the exit status still flow back (systemd-run(1))."""
    return [systemd_run, "--user", "--quiet", "--collect", "-p", "Delegate=yes", "--pipe", "--wait",
            f"--setenv={DELEGATED_ENV}=1", f"--working-directory={os.getcwd()}",
            "--", python, "-m", "runners.cli", "run", *run_argv]


def run_native(options: WitnessOptions, *, timeout: float,
               environ: Mapping[str, str] | None = None) -> int | None:
    env = native_env(os.environ if environ is None else environ)
    # SIGTERM if we die: the witness run is ours and removes its own layout and leaves on the way out.
    return run(witness_argv(options), timeout=timeout, env=env, capture=False,
               die_with=signal.SIGTERM).returncode
