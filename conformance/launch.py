"""Launchers: whose sandbox a task runs in, and the one way a task is launched.

- reference: the embedded bubblewrap sandbox built from the profile (conformance/bwrap_argv.py).
- external `--launcher 'PREFIX'`: runs `PREFIX python3 -I -S -` with placeholders {task_id} {user}
  {control} {user_tmp} {workdir} {state} {neighbour_control} {other_user} expanded in each word,
  and the task spec in the JSON file named by $SANDBOX_CONFORMANCE_TASK_SPEC.
- entry point `--launcher 'entry-point:NAME'`: a Python callable registered in the entry-point group
  `sandbox_conformance.launchers`, called with the task spec (a dict) and returning the argv prefix.

Every launch goes through processes.children.run (timeout, whole process group killed). A missing or
partial document, a non-zero exit or a timeout is a NoObservation naming the launcher: never a pass.
Exit 75 (EX_TEMPFAIL) is the launcher saying its sandbox cannot run on this host or as this user:
SandboxUnavailable, which `witness` reports once as "did not run" and exits 75 with (docs/launchers.md)."""

from __future__ import annotations

import enum
import json
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sandbox_conformance.processes import kills
from sandbox_conformance.processes.children import Completed, Runner, run
from sandbox_conformance.processes.exits import EXIT_UNAVAILABLE

ENTRY_POINT_GROUP = "sandbox_conformance.launchers"
ENTRY_POINT_PREFIX = "entry-point:"
SPEC_ENV = "SANDBOX_CONFORMANCE_TASK_SPEC"
# A name a platform would give an API key, not one that says "this is a witness run" (issue 27): a
# launcher keyed on our names could sandbox only when it is being tested.
SECRET_ENV = "AGENT_API_KEY"
WITNESS_ARGV = ("python3", "-I", "-S", "-")  # the program on stdin, where the launcher asks for that
DOC_VERSION = 2


class NoObservation(Exception):
    """The suite could not get a complete observation from a task: nothing was witnessed."""


class SandboxUnavailable(NoObservation):
    """The launcher exited 75 (EX_TEMPFAIL, sysexits.h: "try again later", here: elsewhere): its
    sandbox cannot run on this host or as this user (systemd-nspawn as a user: "Need to be root").
    Nothing was tested and nothing failed; `reason` is what the launcher said on stderr. A
    NoObservation still, so whoever catches those (the plugin's fixtures, the controls) never reads it
    as a pass."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: did not run: {reason}")
        self.launcher, self.reason = name, reason


class LauncherKind(enum.StrEnum):
    reference = "reference"  # the embedded bwrap sandbox, built from the profile
    external = "external"  # `--launcher 'PREFIX'`
    entry_point = "entry-point"  # `--launcher 'entry-point:NAME'`


class Launcher(NamedTuple):
    """How to turn a task into an argv. `name` is what error messages call it."""

    name: str
    kind: LauncherKind
    prefix: str = ""
    factory: Callable[[Mapping[str, Any]], Sequence[str]] | None = None
    # What the launcher asked for (--launcher-spec, --launcher-stdin; an adapter asks for both): the
    # task spec named in its environment, and the witness program on stdin. Otherwise it gets what a
    # platform hands a sandbox, a command: `python3 /WORKDIR/NAME.py`, and nothing of ours in its
    # environment, so a launcher cannot sandbox only when it sees a witness run (docs/threat-model.md).
    spec: bool = False
    stdin: bool = False

    def argv(
        self, spec: Mapping[str, Any], values: Mapping[str, str], script: str | None = None
    ) -> tuple[str, ...]:
        command = ("python3", script) if script is not None else WITNESS_ARGV
        if self.kind is LauncherKind.external:
            # Split first, then expand inside each word: a path with a space stays one word.
            return tuple(_expand_word(w, values) for w in shlex.split(self.prefix)) + command
        if self.kind is LauncherKind.entry_point and self.factory is not None:
            prefix = self.factory(dict(spec))
            if isinstance(prefix, str) or not all(isinstance(w, str) for w in prefix):
                raise NoObservation(f"{self.name}: returned {prefix!r}, expected a list of argv words")
            return (*prefix, *command)
        raise NoObservation(f"{self.name}: no argv (the reference launcher is built from the profile)")


def _expand_word(word: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        word = word.replace("{" + key + "}", value)
    return word


def external(prefix: str, *, spec: bool = False, stdin: bool = False) -> Launcher:
    """Validated `--launcher` value; ValueError (a usage error) for an empty or unparsable prefix."""
    if prefix.startswith(ENTRY_POINT_PREFIX):
        return entry_point(prefix[len(ENTRY_POINT_PREFIX) :])
    try:
        words = shlex.split(prefix)
    except ValueError as e:
        raise ValueError(f"--launcher {prefix!r}: cannot split it like a shell would: {e}") from None
    if not words:
        raise ValueError("--launcher: empty prefix")
    first = words[0]
    if "/" in first and not os.path.isabs(first) and "{" not in first:
        # The launch runs in the harness's temp layout, not where the user typed the command: a
        # relative launcher (./my-sandbox) means the one next to the user, so make it absolute now.
        where = os.path.abspath(first)
        if not os.path.exists(where):
            raise ValueError(f"--launcher: {first}: no such file (looked in {os.getcwd()})")
        prefix = shlex.join([where, *words[1:]])
    return Launcher(
        name=f"launcher {prefix!r}", kind=LauncherKind.external, prefix=prefix, spec=spec, stdin=stdin
    )


def entry_point(name: str) -> Launcher:
    from importlib import metadata  # here: ~15 ms of every `run`, which never resolves a launcher

    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        known = sorted(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))
        raise ValueError(
            f"--launcher {ENTRY_POINT_PREFIX}{name}: no such entry point in group "
            f"{ENTRY_POINT_GROUP} (known: {', '.join(known) or 'none'})"
        )
    # A Python launcher is handed the spec itself, and keeps the program on stdin as it always had.
    return Launcher(name=f"launcher entry point {name!r}", kind=LauncherKind.entry_point,
                    factory=found[0].load(), spec=True, stdin=True)


REFERENCE = Launcher(name="reference launcher (bwrap)", kind=LauncherKind.reference)


def as_user_prefix(user: str | None) -> tuple[str, ...]:
    """Run the launcher as `user` with no capabilities (root only). Unlike Host.trial_prefix, no
    --reset-env: the planted secret must reach the launcher, so a sandbox that keeps the
    environment is caught."""
    if user is None:
        return ()
    import pwd

    # The primary group by number: setpriv reads --regid=NAME as a group's name, and `nobody`'s primary
    # group is `nogroup` ("setpriv: failed to parse regid", issue 28).
    gid = pwd.getpwnam(user).pw_gid
    return ("setpriv", f"--reuid={user}", f"--regid={gid}", "--init-groups", "--inh-caps=-all", "--")


def parse_document(name: str, done: Completed) -> dict[str, Any]:
    """The witness document from a finished launch, or a NoObservation saying what went wrong."""
    if done.not_found:
        raise NoObservation(f"{name}: could not be executed: {done.stderr_tail()}")
    if done.timed_out:
        raise NoObservation(
            f"{name}: timed out after {done.seconds:.1f}s (process group killed); "
            f"stderr: {done.stderr_tail() or '(empty)'}"
        )
    doc = None
    for line in reversed(done.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                candidate = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(candidate, dict) and "version" in candidate:
                doc = candidate
                break
    if done.returncode == EXIT_UNAVAILABLE:
        raise SandboxUnavailable(
            name, done.stderr_tail() or "(it said nothing on stderr) the sandbox cannot run here (exit 75)"
        )
    if done.returncode != 0:
        # Which signal ended it, if one did, and whether we sent it (processes/kills.py, issue 28).
        how = (kills.ended(done.returncode, done.pid, done.started, done.exited)
               if done.started is not None and done.exited is not None and done.returncode is not None
               else f"exited {done.returncode}")
        raise NoObservation(f"{name}: {how}; stderr: {done.stderr_tail() or '(empty)'}")
    if doc is None:
        head = done.stdout.strip().replace("\n", " | ")[:160] or "(nothing)"
        raise NoObservation(
            f"{name}: printed no witness document; stdout: {head}; stderr: {done.stderr_tail() or '(empty)'}"
        )
    if doc.get("version") != DOC_VERSION:
        raise NoObservation(f"{name}: witness document version {doc.get('version')!r}, "
                            f"expected {DOC_VERSION}")
    if doc.get("complete") is not True:
        raise NoObservation(
            f"{name}: witness document is partial (no completion marker); "
            f"stderr: {done.stderr_tail() or '(empty)'}"
        )
    return doc


def launch(
    name: str,
    argv: Sequence[str],
    program: str | None,
    *,
    env: Mapping[str, str],
    timeout: float,
    runner: Runner = run,
    cwd: str | None = None,
    hooks: Mapping[str, Callable[..., None]] | None = None,
) -> dict[str, Any]:
    """`hooks`: on_line / after_exit for processes.children.run (the host-side observer's handshake)."""
    done = runner(argv, timeout=timeout, input=program, env=env, cwd=cwd, **dict(hooks or {}))
    return parse_document(name, done)
