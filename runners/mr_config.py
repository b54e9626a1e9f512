"""The mr-check configuration: which globs touch the sandbox, and which tier covers them.

Read from `[tool.sandbox-conformance]` in the repository's pyproject.toml, or from a TOML file named
by `--config` (the same table at its top level, or under `[tool.sandbox-conformance]`):

    [[tool.sandbox-conformance.tiers]]
    name = "witness-reference"
    globs = ["src/sandbox/**", "deploy/bwrap/*.py"]
    run = { kind = "witness", profile = "sandbox/profile.toml", launcher = "./launch.sh" }

Validation is strict (an unknown key is an error, not ignored): a typo in a sandbox gate must not
silently switch the gate off. Every error is ONE line naming the file, the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import enum
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runners.mr_globs import GlobError, compile_glob

TABLE = "tool.sandbox-conformance"
DEFAULT_TIMEOUT = 1800.0  # seconds: a whole witness run in container mode builds an image first


class ConfigError(Exception):
    """One line: file, key, what was expected."""


class MissingConfig(ConfigError):
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
    launcher: str | None = None       # witness/cgroup: launcher prefix, passed through verbatim
    as_user: str | None = None        # witness/cgroup: launch tasks as this unprivileged user
    pytest_args: tuple[str, ...] = ()  # witness/cgroup: after `--`
    require: bool = False              # witness/cgroup: every skip is a failure
    expected_skips: str | None = None  # witness/cgroup: `test id | reason` file, relative to the root
    argv: tuple[str, ...] = ()        # command: the user's command, run from the repository root
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # command: added to its environment
    timeout: float = DEFAULT_TIMEOUT

    def describe(self) -> str:
        """What the tier is, for a person: used in the handover paragraph."""
        if self.kind is TierKind.command:
            return "a command of the project's"
        what = "the witness suite" if self.kind is TierKind.witness else "the cgroup witnesses"
        bits = [f"profile {self.profile or '(reference)'}",
                f"launcher {self.launcher or '(reference bwrap)'}"]
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
_TIER_KEYS = frozenset({"name", "globs", "run", "timeout"})


def _str(value: Any, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def _str_list(value: Any, where: str, *, empty_ok: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a list of non-empty strings, got {value!r}")
    if not value and not empty_ok:
        raise ConfigError(f"{where}: expected at least one entry")
    return tuple(value)


def parse_tier(raw: Any, where: str) -> Tier:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table with name, globs and run")
    unknown = sorted(set(raw) - _TIER_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key "
                          f"(expected one of {', '.join(sorted(_TIER_KEYS))})")
    for key in ("name", "globs", "run"):
        if key not in raw:
            raise ConfigError(f"{where}.{key}: missing (a tier needs name, globs and run)")
    name = _str(raw["name"], f"{where}.name")
    assert name is not None
    globs = _str_list(raw["globs"], f"{where}.globs", empty_ok=False)
    for i, g in enumerate(globs):
        try:
            compile_glob(g)
        except GlobError as e:
            raise ConfigError(f"{where}.globs[{i}]: {e}") from None
    timeout = raw.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"{where}.timeout: expected a positive number of seconds, got {timeout!r}")

    run = raw["run"]
    rwhere = f"{where}.run"
    if not isinstance(run, dict):
        raise ConfigError(f"{rwhere}: expected a table like "
                          f"{{ kind = \"witness\", profile = ..., launcher = ... }}")
    try:
        kind = TierKind(run.get("kind"))
    except ValueError:
        raise ConfigError(f"{rwhere}.kind: expected one of {', '.join(TierKind)}, "
                          f"got {run.get('kind')!r}") from None
    unknown = sorted(set(run) - _RUN_KEYS[kind])
    if unknown:
        raise ConfigError(f"{rwhere}.{unknown[0]}: unknown key for kind {kind!s} "
                          f"(expected one of {', '.join(sorted(_RUN_KEYS[kind]))})")
    if kind is TierKind.command:
        if "argv" not in run:
            raise ConfigError(f"{rwhere}.argv: missing (kind command needs argv = [\"prog\", \"arg\", ...])")
        env = run.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ConfigError(f"{rwhere}.env: expected a table of string values, got {env!r}")
        return Tier(name, globs, kind, argv=_str_list(run["argv"], f"{rwhere}.argv", empty_ok=False),
                    env=dict(env), timeout=float(timeout))
    return Tier(
        name, globs, kind,
        profile=_str(run.get("profile"), f"{rwhere}.profile", optional=True),
        launcher=_str(run.get("launcher"), f"{rwhere}.launcher", optional=True),
        as_user=_str(run.get("as_user"), f"{rwhere}.as_user", optional=True),
        pytest_args=_str_list(run.get("pytest_args", []), f"{rwhere}.pytest_args", empty_ok=True),
        require=_bool(run.get("require", False), f"{rwhere}.require"),
        expected_skips=_str(run.get("expected_skips"), f"{rwhere}.expected_skips", optional=True),
        timeout=float(timeout),
    )


def parse(doc: Mapping[str, Any], source: Path, *, whole_file: bool) -> Config:
    """`doc` is the parsed TOML; with whole_file the table may also sit at the top level (--config)."""
    table: Any = doc.get("tool", {}).get("sandbox-conformance") if isinstance(doc.get("tool"), dict) else None
    prefix = TABLE
    if table is None and whole_file and "tiers" in doc:
        table, prefix = doc, ""
    if table is None or "tiers" not in table:
        raise MissingConfig(
            f"{source}: no sandbox-touching globs declared: add [[{TABLE}.tiers]] with name, globs and run "
            f"(kind witness, cgroup or command)"
            + ("" if whole_file else ", or pass --config FILE"))
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [{TABLE}]: expected a table")
    tiers_raw = table["tiers"]
    twhere = f"{prefix}.tiers" if prefix else "tiers"
    if not isinstance(tiers_raw, list) or not tiers_raw:
        raise ConfigError(f"{source}: {twhere}: expected a non-empty array of tables ([[{twhere}]])")
    tiers = tuple(parse_tier(t, f"{source}: {twhere}[{i}]") for i, t in enumerate(tiers_raw))
    seen: set[str] = set()
    for i, t in enumerate(tiers):
        if t.name in seen:
            raise ConfigError(f"{source}: {twhere}[{i}].name: duplicate tier name {t.name!r}")
        seen.add(t.name)
    return Config(source, tiers)


def load(root: Path, config: Path | None) -> Config:
    """The repository's pyproject.toml, or the file named by --config (relative to the working directory)."""
    path = config if config is not None else root / "pyproject.toml"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if config is not None:
            raise ConfigError(f"--config {config}: no such file") from None
        raise MissingConfig(
            f"{path}: no such file: add a pyproject.toml with [[{TABLE}.tiers]] (name, globs, run) "
            f"or pass --config FILE") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return parse(doc, path, whole_file=config is not None)


def check_paths(config: Config, root: Path) -> None:
    """The files a tier names must exist (relative to the repository root, where the tier runs), so a
    typo is a one-line exit 2 now rather than a runner error after minutes of set-up."""
    for t in config.tiers:
        for key, value in (("profile", t.profile), ("expected_skips", t.expected_skips)):
            if value is not None and not (root / value).is_file():
                raise ConfigError(f"{config.source}: tier {t.name!r} run.{key}: {value}: no such file "
                                  f"under {root}")
