"""The witness options, each declared once (issue 30): its flag, value, default and help, which
commands take it (`witness`, `run`, the pytest plugin), and how `run` hands it to a witness that runs
elsewhere (a container, a VM).

`witness`'s and `run`'s argparse options and the plugin's `--sbxc-*` options and ini keys are all
made from TABLE (`add_arguments`, `add_pytest_options`); `runners/witness_args.py` forwards every
one `run` takes by the same table, so a new option is one line here (and the field its record
carries). What each value means, and its checks, stay with what reads it (`conformance/settings.py`,
`conformance/output.py`)."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable
from typing import Any, NamedTuple

from sandbox_conformance.conformance import output, promises
from sandbox_conformance.conformance.profile import PLACEHOLDERS
from sandbox_conformance.conformance.render import Format
from sandbox_conformance.processes.exits import MAX_SECONDS, seconds_ok

WITNESS, RUN, PLUGIN = "witness", "run", "plugin"
REQUIRE_ENV = "SANDBOX_CONFORMANCE_REQUIRE"  # --require, for a whole CI job


class Crossing(enum.Enum):
    """How `run` gives an option to a witness it starts in a container or a VM."""

    value = "value"  # as given
    input = "input"  # a file read there: mapped to where the run binds it
    output = "output"  # a report written there: mapped, and copied back (NAME-root.EXT, NAME-sbxc.EXT)
    leg = "leg"  # set per leg by the mode (the tasks' user)
    stays = "stays"  # never forwarded (witness-only, or a hidden control switch)


class Option(NamedTuple):
    flag: str  # "--launch-timeout"
    help: str
    metavar: str | None = None
    action: str | None = None  # None (one value), "store_true", "append"
    type: Callable[[str], Any] | None = None
    default: Any = None
    commands: frozenset[str] = frozenset({WITNESS, RUN, PLUGIN})
    crosses: Crossing = Crossing.value
    ini: bool = False  # the plugin also reads it from an ini key (`sbxc_NAME`), to pin it in a project
    short: str | None = None  # "-v"
    choices: tuple[str, ...] | None = None
    hidden: bool = False
    # Read by conformance/settings.py `build` (by its dest), not only by the output or the command.
    settings: bool = True
    # Older spellings `witness` and the plugin still accept, each with the line said when it is used
    # (never on `run`, where the old name means something else: `run --timeout` is the whole run).
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def pytest_flag(self) -> str:
        return "--sbxc-" + self.flag[2:]

    @property
    def pytest_dest(self) -> str:
        return "sbxc_" + self.dest


_BOTH = frozenset({WITNESS, RUN})
_REPORT = " (run elsewhere: NAME-root.EXT and NAME-sbxc.EXT, one per leg)"
LAUNCH_TIMEOUT, TCG_LAUNCH_TIMEOUT = 30.0, 120.0  # conformance/settings.py default_timeout

TABLE: tuple[Option, ...] = (
    Option("--profile", "the sandbox profile TOML (default: the embedded reference profile)", "FILE",
           crosses=Crossing.input, ini=True),
    Option("--adapter", "test a sandbox this project did not write: unshare, runc, crun, runsc, systemd-run, "
           "docker, podman, firejail, nspawn, srt or codex (sets --profile and --launcher; "
           "`sandbox-conformance adapters` lists them); a BROKEN promise's remedy then names that tool's "
           "flags", "NAME", commands=_BOTH),
    Option("--launcher", "test YOUR sandbox: run `PREFIX python3 WORKDIR/NAME.py`, the way a platform hands "
           "it a task (" + " ".join("{" + p + "}" for p in PLACEHOLDERS) + " expanded), or "
           "entry-point:NAME from group sandbox_conformance.launchers; default: the reference bwrap",
           "PREFIX", ini=True),
    Option("--launcher-spec", "give the launcher the task spec (JSON, named by "
           "$SANDBOX_CONFORMANCE_TASK_SPEC): for a launcher that builds its sandbox from it",
           action="store_true", default=False, commands=_BOTH),
    Option("--launcher-stdin", "run `PREFIX python3 -I -S -` with the witness program on stdin instead of "
           "as a script", action="store_true", default=False, commands=_BOTH),
    Option("--launcher-env", "set NAME in the launcher's environment, which is otherwise minimal (PATH, "
           "LANG, LC_ALL, TERM, TZ, the task spec's path); repeatable", "NAME=VALUE", action="append",
           default=()),
    Option("--layout-root", "make each task's layout (its state tree and task spec) under DIR instead of "
           "$TMPDIR or /tmp: for a sandbox that gives its tasks a private /tmp (a path where the witness "
           "runs)", "DIR"),
    Option("--only", promises.ONLY_HELP, "IDS", action="append", default=()),
    Option("--skip", promises.SKIP_HELP, "IDS", action="append", default=()),
    Option("--as-user", "(root only) launch tasks as this unprivileged user", "NAME", crosses=Crossing.leg),
    Option("--junitxml", "write JUnit XML here" + _REPORT, "FILE",
           commands=_BOTH, crosses=Crossing.output, settings=False),
    Option("--json", "write the JSON report here ('-' for stdout instead of lines)" + _REPORT, "FILE",
           commands=_BOTH, crosses=Crossing.output, settings=False),
    Option("--format", output.FORMAT_HELP, choices=tuple(f.value for f in Format), commands=_BOTH,
           settings=False),
    Option("--verbose", output.VERBOSE_HELP, action="store_true", default=False, commands=_BOTH, short="-v",
           settings=False),
    Option("--log", output.LOG_HELP, "FILE", commands=_BOTH, crosses=Crossing.output, settings=False),
    Option("--require", f"every skip is a failure (also {REQUIRE_ENV}=1)", action="store_true",
           default=False),
    Option("--expected-skips", "`test id | reason` lines: fail unless the skipped witnesses are exactly "
           "these", "FILE", crosses=Crossing.input),
    # No default here: conformance/settings.py default_timeout() gives it (longer in a TCG guest).
    Option("--launch-timeout", f"seconds one task launch may take (default {LAUNCH_TIMEOUT:g}; "
           f"{TCG_LAUNCH_TIMEOUT:g} in a TCG guest)", "SECONDS", type=float, ini=True,
           aliases=(("--timeout", "--timeout is one launch's here, now spelled --launch-timeout (as in "
                     "`controls`); `run --timeout` is the whole run"),)),
    Option("--host-cannot-observe", "the launcher runs tasks where this host's kernel cannot see them (a "
           "remote engine, a VM-based sandbox): promises about kernel state are then `not tested: WHY` (a "
           "failure under --require), never judged on the task's own /proc", "WHY"),
    # For the negative controls (issue 6): flip ONE thing in the reference sandbox.
    Option("--perturb", "", action="append", default=(), commands=frozenset({WITNESS, PLUGIN}),
           crosses=Crossing.stays, hidden=True),
    # For our own control launchers (the reference sandbox with one thing changed): their tasks get the
    # harness's cgroup leaf, as the reference launcher's do. A user's launcher keeps its own.
    Option("--harness-leaf", "", action="store_true", default=False, commands=frozenset({WITNESS, PLUGIN}),
           crosses=Crossing.stays, hidden=True),
)
BY_DEST = {o.dest: o for o in TABLE}
# What `run` takes and hands on: runners/witness_args.py WitnessOptions carries exactly these.
FORWARDED = tuple(o for o in TABLE if RUN in o.commands)


def check(args: argparse.Namespace, command: str) -> None:
    """What the table alone can say about the values given, before any work: a number of seconds is
    finite, positive and bounded. Every command that takes an option calls this, so `run` refuses
    a bad witness option before it probes, as `witness` does."""
    from sandbox_conformance.processes.exits import check_seconds

    for o in TABLE:
        if command in o.commands and o.type is float:
            value = getattr(args, o.dest, None)
            if value is not None and value != o.default:
                check_seconds(o.flag, value)


def settings_values(value: Callable[[Option], Any], command: str) -> dict[str, Any]:
    """conformance/settings.py `build`'s keyword arguments: `value(option)` for each option of
    `command` that the settings read, by its dest."""
    return {o.dest: value(o) for o in TABLE if command in o.commands and o.settings}


def namespace(command: str) -> argparse.Namespace:
    """Every option `command` takes at the value its parser gives when the option is not given."""
    out = argparse.Namespace()
    for o in TABLE:
        if command in o.commands:
            value = False if o.action == "store_true" else [] if o.action == "append" else o.default
            setattr(out, o.dest, value)
    return out


def _kwargs(o: Option, dest: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"dest": dest, "help": argparse.SUPPRESS if o.hidden else o.help}
    if o.action == "store_true":
        kw.update(action="store_true", default=False)
    else:
        if o.action == "append":
            kw.update(action="append", default=[])
        elif o.default is not None:
            kw["default"] = o.default
        if o.metavar:
            kw["metavar"] = o.metavar
        if o.type is not None:
            kw["type"] = o.type
        if o.choices is not None:
            kw["choices"] = o.choices
    return kw


class _Alias(argparse.Action):
    """An older spelling: stores into the option's dest and says once, on stderr, what it is now."""

    def __init__(self, *a: Any, said: str = "", **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.said = said

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        import sys

        if isinstance(values, float) and not seconds_ok(values):
            # Said here, in one line with the new name, not as the notice and then the new option's
            # own error (two lines for one bad input; issue 28).
            parser.error(f"{option_string} {values:g}: expected a positive number of seconds, at most "
                         f"{MAX_SECONDS:g} ({self.said})")
        print(f"{parser.prog}: {self.said}", file=sys.stderr)
        setattr(namespace, self.dest, values)  # converted by argparse (`type`) before this


def add_arguments(p: Any, command: str) -> None:
    """The options `command` takes, on an argparse parser or group."""
    for o in TABLE:
        if command not in o.commands:
            continue
        p.add_argument(*((o.short,) if o.short else ()), o.flag, **_kwargs(o, o.dest))
        for alias, said in o.aliases if command == WITNESS else ():
            p.add_argument(alias, dest=o.dest, metavar=o.metavar, help=argparse.SUPPRESS, action=_Alias,
                           said=said, type=o.type, default=argparse.SUPPRESS)


def add_pytest_options(group: Any, parser: Any) -> None:
    """The plugin's `--sbxc-*` options (prefixed: the plugin loads into every pytest session of its
    environment, and a bare `--profile` collides with other plugins), with an ini key where `ini`."""
    for o in TABLE:
        if PLUGIN not in o.commands:
            continue
        kw = _kwargs(o, o.pytest_dest)
        if o.ini:
            kw["default"] = None  # unset: the ini key, then the option's own default (plugin._option)
            parser.addini(o.pytest_dest, o.help, default=None)
        group.addoption(o.pytest_flag, **kw)
        for alias, _ in o.aliases:
            group.addoption("--sbxc-" + alias[2:], dest=o.pytest_dest, type=o.type, metavar=o.metavar,
                            help=argparse.SUPPRESS)
            parser.addini("sbxc_" + alias[2:].replace("-", "_"), argparse.SUPPRESS, default=None)
