"""The mr-check configuration: which globs touch the sandbox, and which tier covers them.

Read from `[tool.sandbox-conformance]` in the repository's pyproject.toml, or from a TOML file named
by `--config` (the same table at its top level, or under `[tool.sandbox-conformance]`):

    [[tool.sandbox-conformance.tiers]]
    name = "witness-reference"
    globs = ["src/sandbox/**", "deploy/bwrap/*.py"]
    run = { kind = "witness", profile = "sandbox/profile.toml", launcher = "./launch.sh" }

Validation is strict (an unknown key or table is an error, not ignored): a typo in a sandbox gate
such as `[[tool.sandbox-conformance.tier]]` must not silently switch the gate off. Every error is ONE
line naming the file, the key and what was expected. A glob that matches no file at HEAD is only a
warning (a gate may be declared before the tree it guards exists), printed on every run.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.mrcheck.globs import InvalidGlob, compile_glob, dead_glob_hint
from sandbox_conformance.processes import inputs
from sandbox_conformance.processes.exits import seconds_ok

TABLE = "tool.sandbox-conformance"
DEFAULT_TIMEOUT = 1800.0  # seconds: a whole witness run in container mode builds an image first


class InvalidConfig(Exception):
    """One line: file, key, what was expected."""


class MissingConfig(InvalidConfig):
    """No tiers declared at all: exit 2 naming what to add."""


class TierKind(enum.StrEnum):
    witness = enum.auto()  # the witness suite with a profile and a launcher
    cgroup = enum.auto()   # the cgroup witnesses (the witness suite, selected to its cgroup tests)
    command = enum.auto()  # a command of the user's, gated by the runner's refusals


@dataclasses.dataclass(frozen=True)
class Tier:
    name: str
    globs: tuple[str, ...]
    kind: TierKind
    profile: str | None = None        # witness/cgroup: path relative to the repository root
    launcher: str | None = None       # witness/cgroup: launcher prefix, repository paths made absolute
    as_user: str | None = None        # witness/cgroup: launch tasks as this unprivileged user
    pytest_args: tuple[str, ...] = ()  # witness/cgroup: after `--`
    require: bool = False              # witness/cgroup: every skip is a failure
    expected_skips: str | None = None  # witness/cgroup: `test id | reason` file, relative to the root
    argv: tuple[str, ...] = ()        # command: the user's command, run from the repository root
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # command: added to its environment
    timeout: float = DEFAULT_TIMEOUT
    # Run from the repository root before the tier (build the launcher, the image...); a string is
    # stored as `sh -c STRING`, so what is printed is what runs.
    prepare: tuple[str, ...] = ()
    # The launcher as configured (for people), and as one shell word for the printed commands, with
    # `$PWD/` where a repository path was made absolute: those commands run from the repository root,
    # so they stay exact on a reviewer's checkout too (resolve_launcher).
    launcher_written: str | None = None
    launcher_shown: str | None = None

    def describe(self) -> str:
        """What the tier is, for a person: used in the handover paragraph."""
        if self.kind is TierKind.command:
            return "a command of the project's"
        what = "the witness suite" if self.kind is TierKind.witness else "the cgroup witnesses"
        bits = [f"profile {self.profile or '(reference)'}",
                f"launcher {self.launcher_written or self.launcher or '(reference bwrap)'}"]
        if self.as_user:
            bits.append(f"as user {self.as_user}")
        return f"{what}, {', '.join(bits)}"


@dataclasses.dataclass(frozen=True)
class Config:
    source: Path
    tiers: tuple[Tier, ...]


# Keys each run kind accepts; everything else is a typo until proven otherwise.
_RUN_KEYS: dict[TierKind, frozenset[str]] = {
    TierKind.witness: frozenset({"kind", "profile", "launcher", "as_user", "pytest_args", "require",
                                 "expected_skips"}),
    TierKind.cgroup: frozenset({"kind", "profile", "launcher", "as_user", "pytest_args", "require",
                                "expected_skips"}),
    TierKind.command: frozenset({"kind", "argv", "env"}),
}
_TIER_KEYS = frozenset({"name", "globs", "run", "timeout", "prepare"})
# The only key of [tool.sandbox-conformance] itself. `tier` (singular), `base`, `require`... are
# typos or wishes: ignoring them would leave a gate the author believes is on switched off.
_TABLE_KEYS = frozenset({"tiers"})


def _str(value: Any, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidConfig(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidConfig(f"{where}: expected true or false, got {value!r}")
    return value


def _str_list(value: Any, where: str, *, empty_ok: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidConfig(f"{where}: expected a list of non-empty strings, got {value!r}")
    if not value and not empty_ok:
        raise InvalidConfig(f"{where}: expected at least one entry")
    return tuple(value)


def _prepare(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        if not value.strip():
            raise InvalidConfig(f"{where}: expected a non-empty shell command or an argv list")
        return ("sh", "-c", value)
    return _str_list(value, where, empty_ok=False)


def _unknown(keys: Any, known: frozenset[str]) -> str:
    """`a, b (did you mean tiers?)` for the unknown keys, or ""."""
    unknown = sorted(set(keys) - known)
    if not unknown:
        return ""
    close = {m for k in unknown for m in difflib.get_close_matches(k, known, n=1)}
    return ", ".join(unknown) + (f" (did you mean {', '.join(sorted(close))}?)" if close else "")


def parse_tier(raw: Any, where: str) -> Tier:
    if not isinstance(raw, dict):
        raise InvalidConfig(f"{where}: expected a table with name, globs and run")
    unknown = sorted(set(raw) - _TIER_KEYS)
    if unknown:
        raise InvalidConfig(f"{where}.{unknown[0]}: unknown key "
                          f"(expected one of {', '.join(sorted(_TIER_KEYS))})")
    for key in ("name", "globs", "run"):
        if key not in raw:
            raise InvalidConfig(f"{where}.{key}: missing (a tier needs name, globs and run)")
    name = _str(raw["name"], f"{where}.name")
    assert name is not None
    globs = _str_list(raw["globs"], f"{where}.globs", empty_ok=False)
    for i, g in enumerate(globs):
        try:
            compile_glob(g)
        except InvalidGlob as e:
            raise InvalidConfig(f"{where}.globs[{i}]: {e}") from None
    timeout = raw.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not seconds_ok(timeout):
        raise InvalidConfig(f"{where}.timeout: expected a positive number of seconds (at most a day), "
                          f"got {timeout!r}")
    prepare = _prepare(raw["prepare"], f"{where}.prepare") if "prepare" in raw else ()

    run = raw["run"]
    rwhere = f"{where}.run"
    if not isinstance(run, dict):
        raise InvalidConfig(f"{rwhere}: expected a table like "
                          f"{{ kind = \"witness\", profile = ..., launcher = ... }}")
    raw_kind = run.get("kind")
    try:
        kind = TierKind(raw_kind) if isinstance(raw_kind, str) else None
    except ValueError:
        kind = None
    if kind is None:
        raise InvalidConfig(f"{rwhere}.kind: expected one of {', '.join(TierKind)}, "
                          f"got {raw_kind!r}")
    unknown = sorted(set(run) - _RUN_KEYS[kind])
    if unknown:
        raise InvalidConfig(f"{rwhere}.{unknown[0]}: unknown key for kind {kind!s} "
                          f"(expected one of {', '.join(sorted(_RUN_KEYS[kind]))})")
    if kind is TierKind.command:
        if "argv" not in run:
            raise InvalidConfig(f"{rwhere}.argv: missing "
                                "(kind command needs argv = [\"prog\", \"arg\", ...])")
        env = run.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise InvalidConfig(f"{rwhere}.env: expected a table of string values, got {env!r}")
        return Tier(name, globs, kind, argv=_str_list(run["argv"], f"{rwhere}.argv", empty_ok=False),
                    env=dict(env), timeout=float(timeout), prepare=prepare)
    return Tier(
        name, globs, kind,
        profile=_str(run.get("profile"), f"{rwhere}.profile", optional=True),
        launcher=_str(run.get("launcher"), f"{rwhere}.launcher", optional=True),
        as_user=_str(run.get("as_user"), f"{rwhere}.as_user", optional=True),
        pytest_args=_str_list(run.get("pytest_args", []), f"{rwhere}.pytest_args", empty_ok=True),
        require=_bool(run.get("require", False), f"{rwhere}.require"),
        expected_skips=_str(run.get("expected_skips"), f"{rwhere}.expected_skips", optional=True),
        timeout=float(timeout),
        prepare=prepare,
    )


def _table(doc: Mapping[str, Any], whole_file: bool) -> tuple[Any, str]:
    """The [tool.sandbox-conformance] table and its TOML prefix for messages, or (None, TABLE).

    With --config the tiers may also sit at the file's top level; a file that is not a pyproject
    (no [project], no [build-system]) is then read as the table itself, so its `[[tier]]` typo is
    named rather than reported as "nothing declared"."""
    tool = doc.get("tool")
    table = tool.get("sandbox-conformance") if isinstance(tool, dict) else None
    if table is not None:
        return table, TABLE
    if whole_file and ("tiers" in doc or not ({"project", "build-system", "tool"} & set(doc))):
        return doc, ""
    return None, TABLE


def parse(doc: Mapping[str, Any], source: Path, *, whole_file: bool) -> Config:
    """`doc` is the parsed TOML; with whole_file the table may also sit at the top level (--config)."""
    table, prefix = _table(doc, whole_file)
    if table is not None and not isinstance(table, dict):
        raise InvalidConfig(f"{source}: [{TABLE}]: expected a table")
    unknown = _unknown(table or {}, _TABLE_KEYS)
    if unknown:
        where = f"[{prefix}]" if prefix else "the top level"
        tiers_key = f"{prefix}.tiers" if prefix else "tiers"
        raise InvalidConfig(f"{source}: unknown key in {where}: {unknown}: expected only [[{tiers_key}]], "
                          f"and a gate with a typo would be silently off")
    if table is None or "tiers" not in table:
        raise MissingConfig(
            f"{source}: no sandbox-touching globs declared: add [[{TABLE}.tiers]] with name, globs and run "
            f"(kind witness, cgroup or command)"
            + ("" if whole_file else ", or pass --config FILE"))
    tiers_raw = table["tiers"]
    twhere = f"{prefix}.tiers" if prefix else "tiers"
    if not isinstance(tiers_raw, list) or not tiers_raw:
        raise InvalidConfig(f"{source}: {twhere}: expected a non-empty array of tables ([[{twhere}]])")
    tiers = tuple(parse_tier(t, f"{source}: {twhere}[{i}]") for i, t in enumerate(tiers_raw))
    seen: set[str] = set()
    for i, t in enumerate(tiers):
        if t.name in seen:
            raise InvalidConfig(f"{source}: {twhere}[{i}].name: duplicate tier name {t.name!r}")
        seen.add(t.name)
    return Config(source, tiers)


def load(root: Path, config: Path | None) -> Config:
    """The repository's pyproject.toml, or the file named by --config (relative to the working directory)."""
    path = config if config is not None else root / "pyproject.toml"
    if not os.path.lexists(path):
        if config is not None:
            raise InvalidConfig(f"--config {config}: no such file")
        raise MissingConfig(
            f"{path}: no such file: add a pyproject.toml with [[{TABLE}.tiers]] (name, globs, run) "
            f"or pass --config FILE")
    try:
        # A regular file, read up to a bound: a FIFO, /dev/zero or a symlink loop is one line, never a
        # hang or a traceback (processes/inputs.py).
        text = inputs.read_text(path)
    except inputs.UnusableInput as e:
        raise InvalidConfig(f"{path}: cannot read: {e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidConfig(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise InvalidConfig(f"{path}: not valid TOML: nested too deeply") from None
    return parse(doc, path, whole_file=config is not None)


def resolve(config: Config, root: Path) -> Config:
    """The configuration bound to the repository at `root`, checked before anything runs.

    The files a tier names must exist (relative to the repository root, where the tier runs), so a
    typo is a one-line exit 2 now rather than a runner error after minutes of set-up; a cgroup tier's
    profile must promise limits; relative launcher paths are made absolute (resolve_launcher)."""
    tiers = []
    for t in config.tiers:
        where = f"{config.source}: tier {t.name!r}"
        for key, value in (("profile", t.profile), ("expected_skips", t.expected_skips)):
            if value is not None and not (root / value).is_file():
                raise InvalidConfig(f"{where} run.{key}: {value}: no such file under {root}")
        if t.kind is TierKind.cgroup:
            _check_limits(t, root, where)
        if t.launcher is not None:
            paths = resolve_launcher(t.launcher, root, f"{where} run.launcher")
            t = dataclasses.replace(t, launcher=paths.run, launcher_written=t.launcher,
                                    launcher_shown=paths.shown)
        tiers.append(t)
    return dataclasses.replace(config, tiers=tuple(tiers))


def _check_limits(tier: Tier, root: Path, where: str) -> None:
    """A cgroup tier runs only the cgroup witnesses, and the suite generates them only for a profile
    with a [limits] section (conformance/profile.py, Profile.promises): without one the tier would
    select nothing and could never say anything about the change."""
    from sandbox_conformance.conformance import profile as profile_mod

    try:
        prof = profile_mod.load(None if tier.profile is None else root / tier.profile)
    except profile_mod.InvalidProfile as e:
        raise InvalidConfig(f"{where} run.profile: {e}") from None
    if "cgroup" not in prof.promises():
        raise InvalidConfig(f"{where}: kind cgroup, but profile {tier.profile or prof.name} has no [limits] "
                          "(a memory_max or pids_max other than \"max\"), so there is no cgroup promise to "
                          "test: add [limits] to the profile, or make the tier kind witness")


@dataclasses.dataclass(frozen=True)
class LauncherPaths:
    run: str                  # the prefix passed to the runner: repository paths absolute
    shown: str | None = None  # one shell word for printed commands; None: shlex.quote(run)


def resolve_launcher(launcher: str, root: Path, where: str) -> LauncherPaths:
    """`./launch.sh` or `node dist/cli.js` with the repository's paths made absolute.

    The harness launches each task from a temporary layout directory (conformance/harness.py), not
    from the repository, so a relative path there names nothing. The first word is resolved against
    the root when it is a relative path with a `/` (a bare word such as `node` is looked up on PATH);
    a later word when it is a relative path with a `/` that exists under the root (a script the
    launcher runs). Placeholders (`{workdir}`) and options are left alone."""
    if launcher.startswith("entry-point:"):
        return LauncherPaths(launcher)
    try:
        words = shlex.split(launcher)
    except ValueError as e:
        raise InvalidConfig(f"{where}: cannot split {launcher!r} like a shell would: {e}") from None
    if not words:
        raise InvalidConfig(f"{where}: empty launcher")
    out = list(words)
    relative: dict[int, str] = {}
    for i, word in enumerate(words):
        if not _repo_relative(word) or (i > 0 and not (root / word).exists()):
            continue
        rel = os.path.normpath(word)
        if i == 0 and not (root / rel).is_file():
            raise InvalidConfig(f"{where}: {word}: no such file under {root} "
                              "(a relative launcher is resolved against the repository root)")
        out[i], relative[i] = str(root / rel), rel
    if not relative:
        return LauncherPaths(launcher)
    return LauncherPaths(shlex.join(out), _shown(words, relative, root))


_SHELL_SAFE = re.compile(r"[\w@%+=:,./-]+")  # the characters shlex.quote leaves bare
_PWD = "\0PWD\0"


def _shown(words: list[str], relative: Mapping[int, str], root: Path) -> str | None:
    """The launcher as one double-quoted shell word with `$PWD/` for the resolved paths, or None when
    that would not be the same prefix here (a root or path the prefix's own splitting would break)."""
    if not _SHELL_SAFE.fullmatch(str(root)) or not all(_SHELL_SAFE.fullmatch(r) for r in relative.values()):
        return None
    inner = " ".join(f"{_PWD}/{relative[i]}" if i in relative else shlex.quote(w)
                     for i, w in enumerate(words))
    # Inside double quotes only `\`, `"`, `$` and a backquote are special (POSIX sh, 2.2.3).
    escaped = re.sub(r'([\\"$`])', r"\\\1", inner).replace(_PWD, "$PWD")
    return f'"{escaped}"'


def _repo_relative(word: str) -> bool:
    return "/" in word and not word.startswith(("/", "-", "~", "{", "$")) and "{" not in word


def dead_globs(config: Config, files: Sequence[str]) -> list[str]:
    """PURE: one warning per glob that matches no file at HEAD: a gate that can never fire."""
    out = []
    for t in config.tiers:
        for g in t.globs:
            hint = dead_glob_hint(g, files)
            if hint is not None:
                out.append(f"{config.source.name}: tier {t.name!r}: glob {g!r} matches no file at HEAD{hint}")
    return out
