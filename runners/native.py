"""Native mode: run the witness suite on this host, in this environment, as a child of this process."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sandbox_conformance.conformance.handover import GO, PRECONDITION_PROBES, STANDBY_FLAG, handover
from sandbox_conformance.probes.finding import Finding
from sandbox_conformance.processes.children import Background, Completed, Forked, NotForkable, run
from sandbox_conformance.runners.witness_args import WitnessOptions

# Native mode never builds a cgroup root and never rearranges the host's tree. An inherited
# promise would make the cgroup witnesses fail on a root this run did not make (set and unusable is
# a failure, by design), so it is dropped: the witnesses fall through to the probe's resolved root,
# usable only where the run has a delegated subtree of its own (systemd-run --user -p Delegate=yes).
DROPPED_ENV = ("SANDBOX_CONFORMANCE_CGROUP_ROOT",)

# Set in the environment of a run re-executed under systemd-run, so it does not re-execute again.
DELEGATED_ENV = "SANDBOX_CONFORMANCE_DELEGATED"


def witness_argv(options: WitnessOptions, *, python: str = sys.executable,
                 standby_fd: int | None = None) -> list[str]:
    return [python, "-m", "sandbox_conformance", "witness", *_witness_arguments(options, standby_fd)]


def _witness_arguments(options: WitnessOptions, standby_fd: int | None) -> list[str]:
    return [*([STANDBY_FLAG, str(standby_fd)] if standby_fd is not None else []), *options.argv()]


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
                                               "sandbox_conformance", "run", *run_argv))]


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


class Standby:
    """The witness process, started before this run probes, and told afterwards whether to go.

    A witness run's own start (an interpreter, the suite's imports: a third of a native run) does not
    depend on what the probes find, so it overlaps them on another core instead of following them
    (bench/run_bench.py). It is the same child as ever: its own session, killed as a group on the
    timeout, SIGTERM if we die (it then removes what it made, docs/cancellation.md), tracked for the
    guardian. Until `go`, it has made nothing: it waits on a pipe of ours (`witness --standby-fd`),
    before its first check of the host. `go` hands it the findings this run probed; `discard` closes
    the pipe unsaid, and it exits 0 without a word.

    `witness_main` (the witness command, given its options as data: the record's fields and
    `standby_fd`): the child is a fork of this process (processes/children.py Forked), which has the
    interpreter and much of the suite's imports ready; without it, or with a thread running here, a
    fresh `python -m sandbox_conformance witness` with them as arguments."""

    def __init__(self, options: WitnessOptions, *, timeout: float, environ: Mapping[str, str] | None = None,
                 python: str = sys.executable,
                 witness_main: Callable[[dict[str, Any]], int] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._as_user = options.as_user
        self._timeout = timeout
        self._read, self._write = os.pipe()  # both close-on-exec; pass_fds hands the child its end
        env = native_env(self._environ)
        self._forked: Forked | None = None
        self._spawned: Background[Completed] | None = None
        if witness_main is not None:
            values = {**options._asdict(), "standby_fd": self._read}
            body = functools.partial(_forked_witness, witness_main, values, env, self._write)
            with contextlib.suppress(NotForkable):  # a thread runs here: spawned instead
                self._forked = Forked(body)
        if self._forked is None:
            start = functools.partial(run, witness_argv(options, python=python, standby_fd=self._read),
                                      timeout=timeout, env=env, capture=False, die_with=signal.SIGTERM,
                                      pass_fds=(self._read,))
            self._spawned = Background(start, name="sbxc-witness")
        self._said = False

    def _result(self) -> int | None:
        if self._forked is not None:
            return self._forked.wait(self._timeout)
        assert self._spawned is not None
        return self._spawned.result().returncode

    def go(self, findings: Iterable[Finding] = ()) -> int | None:
        """Run the suite with these findings; its exit code (None: it timed out)."""
        needed = [f for f in findings if f.probe in PRECONDITION_PROBES]
        # Made in our environment, which native_env changed for the child: the record says which, and
        # the child re-probes where that matters (conformance/handover.py).
        mine = needed and self._as_user is None  # another user's findings are that user's to probe
        payload = handover(needed, as_user=None, environ=self._environ) if mine else ""
        self._say(GO + payload.encode())
        return self._result()

    def discard(self) -> None:
        """The run will not be native: the child exits unasked, and is reaped before we go on."""
        self._say(b"")
        self._result()

    def _say(self, data: bytes) -> None:
        """Write once and close our end: the child reads to EOF. Our copy of its end stays open
        until the child is reaped (__exit__): a spawning thread may not have forked yet, and a
        descriptor closed under it would be handed on by number, whatever it then is."""
        if self._said:
            return
        self._said = True
        try:
            view = memoryview(data)
            while view:  # a pipe takes 64 KiB before a write waits for the reader (pipe(7))
                view = view[os.write(self._write, view):]
        except BrokenPipeError:
            pass  # it died before reading: its exit code says how
        finally:
            os.close(self._write)

    def __enter__(self) -> Standby:
        return self

    def __exit__(self, *exc: object) -> None:
        """The child reaped, whatever happened here (discarded if go() was never said), then our
        copy of its end of the pipe closed."""
        try:
            self.discard()
        finally:
            os.close(self._read)


def _forked_witness(witness_main: Callable[[dict[str, Any]], int], values: dict[str, Any],
                    env: Mapping[str, str], our_end: int) -> int:
    """The forked child's body: the environment a spawned witness would have had, without our end of
    the pipe (its EOF is how a discarded child learns it), then the witness command."""
    os.close(our_end)
    os.environ.clear()
    os.environ.update(env)
    return witness_main(values)
