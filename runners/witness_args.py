"""The witness command's options, as `run` accepts and forwards them (`sandbox-conformance witness
[--profile F] [--launcher 'PREFIX'] [--as-user NAME] [--junitxml F] [--json F] [--require]
[--expected-skips F] [--only IDS] [--skip IDS] [-- pytest args]`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NamedTuple

from sandbox_conformance.conformance import output, promises
from sandbox_conformance.processes.exits import UsageError


class WitnessOptions(NamedTuple):
    """The witness command's options as `run` forwards them: made from `run`'s arguments (`from_args`),
    remapped for a run elsewhere (`relocated`), and turned back into the witness's arguments (`argv`)."""

    profile: str | None = None
    adapter: str | None = None
    launcher: str | None = None
    as_user: str | None = None
    junitxml: str | None = None
    json: str | None = None
    require: bool = False
    expected_skips: str | None = None
    pytest_args: tuple[str, ...] = ()
    # Output (conformance/output.py): None/False forward nothing, so the witness decides for itself
    # (a table only where its own stdout is a terminal).
    format: str | None = None
    verbose: bool = False
    log: str | None = None
    # What an external launcher asked for: the task spec, the program on stdin (conformance/launch.py).
    launcher_spec: bool = False
    launcher_stdin: bool = False
    # --only/--skip as given (each `ID[,ID]`), checked by `check` before any work.
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WitnessOptions:
        return cls(args.profile, args.adapter, args.launcher, args.as_user, args.junitxml, args.json,
                   bool(args.require), args.expected_skips, tuple(args.pytest_args or ()),
                   getattr(args, "format", None), bool(getattr(args, "verbose", False)),
                   getattr(args, "log", None), bool(getattr(args, "launcher_spec", False)),
                   bool(getattr(args, "launcher_stdin", False)), tuple(getattr(args, "only", None) or ()),
                   tuple(getattr(args, "skip", None) or ()))

    def relocated(self, infile: Callable[[str, str], str],
                  outfile: Callable[[str, str], str]) -> WitnessOptions:
        """The same options for a run elsewhere (a container, a VM): each input file given is mapped
        through infile(path, key), each report through outfile(path, key); tasks' user is set per leg."""
        def each(f: Callable[[str, str], str], path: str | None, key: str) -> str | None:
            return None if path is None else f(path, key)

        return self._replace(
            profile=each(infile, self.profile, "profile"),
            expected_skips=each(infile, self.expected_skips, "expected-skips"),
            junitxml=each(outfile, self.junitxml, "junit"),
            json=each(outfile, self.json, "report"),
            log=each(outfile, self.log, "log"),
            as_user=None,
        )

    def argv(self) -> list[str]:
        """The witness command's arguments, an option and its value side by side."""
        out: list[str] = []
        for flag, value in (("--profile", self.profile), ("--adapter", self.adapter),
                            ("--launcher", self.launcher),
                            ("--as-user", self.as_user), ("--junitxml", self.junitxml), ("--json", self.json),
                            ("--expected-skips", self.expected_skips)):
            if value is not None:
                out += [flag, value]
        if self.launcher_spec:
            out.append("--launcher-spec")
        if self.launcher_stdin:
            out.append("--launcher-stdin")
        out += [w for ids in self.only for w in ("--only", ids)]
        out += [w for ids in self.skip for w in ("--skip", ids)]
        if self.require:
            out.append("--require")
        if self.format is not None:
            out += ["--format", self.format]
        if self.verbose:
            out.append("--verbose")
        if self.log is not None:
            out += ["--log", self.log]
        if self.pytest_args:
            out += ["--", *self.pytest_args]
        return out


def check(args: argparse.Namespace) -> None:
    """The witness options `run` checks itself before it probes or builds anything: the promise ids,
    and that they leave some promise of the profile to test (an adapter's profile, or one that does
    not parse, is the witness's to read and say)."""
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
    g.add_argument("--profile", metavar="FILE", help="the sandbox profile (default: the embedded reference)")
    g.add_argument("--adapter", metavar="NAME", help="a sandbox tool's adapter: unshare, runc, crun, ...")
    g.add_argument("--launcher", metavar="PREFIX", help="an external launcher command prefix")
    g.add_argument("--launcher-spec", action="store_true", help="give the launcher the task spec")
    g.add_argument("--launcher-stdin", action="store_true", help="the witness program on stdin")
    g.add_argument("--as-user", metavar="NAME", help="(native, root only) launch tasks as this user")
    g.add_argument("--junitxml", metavar="FILE", help="JUnit XML (container: NAME-root.EXT, NAME-sbxc.EXT)")
    g.add_argument("--json", metavar="FILE", help="JSON report (container: NAME-root.EXT, NAME-sbxc.EXT)")
    g.add_argument("--require", action="store_true", help="turn every skip into a failure")
    g.add_argument("--expected-skips", metavar="FILE", help="`test id | reason` lines; other skips fail")
    g.add_argument("--only", action="append", default=[], metavar="IDS", help=promises.ONLY_HELP)
    g.add_argument("--skip", action="append", default=[], metavar="IDS", help=promises.SKIP_HELP)
    output.add_arguments(g)
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST ARGS", help="passed to pytest after `--`")
