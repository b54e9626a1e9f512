"""The witness command's options as `run` takes and forwards them: every option of
conformance/options.py's TABLE that `run` takes, carried as one record and turned back into the
witness's own arguments, here or in a container or a VM."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NamedTuple

from sandbox_conformance.conformance import options, promises
from sandbox_conformance.conformance.options import Crossing
from sandbox_conformance.processes.exits import UsageError


class WitnessOptions(NamedTuple):
    """The witness command's options as `run` forwards them: one field per option of
    conformance/options.py that `run` takes (tests/test_runner_parts.py holds the two to each other),
    plus the pytest arguments. None/False/() forward nothing, so the witness decides for itself (its
    own default; a table only where its own stdout is a terminal)."""

    profile: str | None = None
    adapter: str | None = None
    launcher: str | None = None
    launcher_spec: bool = False
    launcher_stdin: bool = False
    launcher_env: tuple[str, ...] = ()
    layout_root: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    as_user: str | None = None
    junitxml: str | None = None
    json: str | None = None
    format: str | None = None
    verbose: bool = False
    log: str | None = None
    require: bool = False
    expected_skips: str | None = None
    launch_timeout: float | None = None
    host_cannot_observe: str | None = None
    pytest_args: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WitnessOptions:
        given: dict[str, Any] = {}
        for o in options.FORWARDED:
            value = getattr(args, o.dest, None)
            if o.action == "append":
                value = tuple(value or ())
            elif o.action == "store_true":
                value = bool(value)
            elif value == o.default:
                value = None  # the witness's own default: nothing to forward
            given[o.dest] = value
        return cls(**given, pytest_args=tuple(getattr(args, "pytest_args", None) or ()))

    def relocated(self, infile: Callable[[str, str], str],
                  outfile: Callable[[str, str], str]) -> WitnessOptions:
        """The same options for a run elsewhere (a container, a VM): each input file given is mapped
        through infile(path, key), each report through outfile(path, key); the tasks' user is set per
        leg. The keys name the file in the run's own words (profile, report, junit, log, ...)."""
        changed: dict[str, Any] = {}
        for o in options.FORWARDED:
            value = getattr(self, o.dest)
            if o.crosses is Crossing.leg:
                changed[o.dest] = None
            elif value is not None and o.crosses is Crossing.input:
                changed[o.dest] = infile(value, _KEYS.get(o.dest, o.dest.replace("_", "-")))
            elif value is not None and o.crosses is Crossing.output:
                changed[o.dest] = outfile(value, _KEYS.get(o.dest, o.dest))
        return self._replace(**changed)

    def argv(self) -> list[str]:
        """The witness command's arguments, an option and its value side by side."""
        out: list[str] = []
        for o in options.FORWARDED:
            value = getattr(self, o.dest)
            if o.action == "store_true":
                out += [o.flag] if value else []
            elif o.action == "append":
                out += [w for v in value for w in (o.flag, v)]
            elif value is not None:
                out += [o.flag, value if isinstance(value, str) else f"{value:g}"]
        if self.pytest_args:
            out += ["--", *self.pytest_args]
        return out


# The name each file has in a run's exchange (runners/container.py, runners/vm/mode.py).
_KEYS = {"json": "report", "junitxml": "junit"}


def check(args: argparse.Namespace) -> None:
    """The witness options `run` checks itself before it probes or builds anything: the promise ids,
    and that they leave some promise of the profile to test (an adapter's profile, or one that does
    not parse, is the witness's to read and say)."""
    options.check(args, options.RUN)  # the bounds the table knows (a launch timeout's)
    only, skip = getattr(args, "only", None) or (), getattr(args, "skip", None) or ()
    try:
        promises.select(only, skip)
        if (only or skip) and not getattr(args, "adapter", None):
            # Only for a selection: the profile's parse (~30 ms of imports) stays off run's usual path.
            from sandbox_conformance.conformance import profile as profile_mod
            from sandbox_conformance.conformance import settings as settings_mod

            try:
                prof = profile_mod.load(args.profile)
            except (profile_mod.InvalidProfile, OSError, ValueError):
                return
            settings_mod.select(prof, only, skip)
    except (promises.UnknownPromise, ValueError) as e:  # settings.InvalidSettings is a ValueError
        raise UsageError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("witness options (passed to `sandbox-conformance witness`)")
    options.add_arguments(g, options.RUN)  # conformance/options.py: each option declared once
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST ARGS", help="passed to pytest after `--`")
