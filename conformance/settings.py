"""The witness run's settings: validated once, frozen, handed to the pytest plugin.

`sandbox-conformance witness` builds them from its options and hands the object to the plugin; a plain
`pytest` run (the plugin's own `--sbxc-*` options and ini keys) builds them here too. Every check a
setting needs lives in `build`, so the two ways in cannot disagree. A bad value raises InvalidSettings
with one line naming the option; each caller turns it into its own usage error (exit 2)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from sandbox_conformance.conformance import bwrap_argv, remedies
from sandbox_conformance.conformance import profile as profile_mod
from sandbox_conformance.conformance import promises as promises_mod
from sandbox_conformance.conformance.launch import REFERENCE, Launcher, LauncherKind, external
from sandbox_conformance.conformance.options import (
    LAUNCH_TIMEOUT,
    REQUIRE_ENV,
    TCG_LAUNCH_TIMEOUT,
)
from sandbox_conformance.kernel.cgroupfs import statfs_magic
from sandbox_conformance.probes.finding import EMPTY, Finding
from sandbox_conformance.processes import inputs
from sandbox_conformance.processes.children import DEFAULT_PATH
from sandbox_conformance.processes.exits import MAX_SECONDS, seconds_ok

# A name a launcher's environment may carry: what a shell accepts as a variable name.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class InvalidSettings(ValueError):
    """One line naming the option and what was expected."""


# Per task launch, for a native host. In a TCG guest (qemu without KVM: every instruction translated)
# a launch is 10-20x slower, more beside busy loops: 30 s ran out in the systemd lab's `run --delegate`
# leg (reference launcher: "timed out after 32.6s", issue 28). 120 s is the VM mode's own for TCG
# (runners/vm/mode.py LAUNCH_TIMEOUT), passed as --launch-timeout; a `run` inside the guest passes none.
TCG_MODEL = "QEMU TCG CPU"  # qemu's model-id for -cpu max under TCG (target/i386/cpu.c)


def default_timeout(cpuinfo: Path = Path("/proc/cpuinfo")) -> float:
    """The per-launch timeout when none is given: TCG_LAUNCH_TIMEOUT in a TCG guest, else LAUNCH_TIMEOUT."""
    try:
        with open(cpuinfo, errors="replace") as f:
            head = f.read(4096)  # the first CPU's block names the model
    except OSError:
        return LAUNCH_TIMEOUT
    return TCG_LAUNCH_TIMEOUT if TCG_MODEL in head else LAUNCH_TIMEOUT


class Settings(NamedTuple):
    """One witness run's settings, checked once by `build` and frozen. `witness` and a plain pytest run
    each make one the same way and hand it to the pytest plugin."""

    profile: profile_mod.Profile
    launcher: Launcher
    as_user: str | None = None
    timeout: float = 30.0
    perturbations: frozenset[str] = frozenset()
    require: bool = False
    expected_skips: dict[str, str] | None = None  # None: no expected-skips file given
    host_cannot_observe: str | None = None  # why the host cannot see the launcher's tasks
    harness_leaf: bool = False  # an external launcher's tasks get the harness's cgroup leaf too
    # Extra variables for the launcher's otherwise minimal environment (--launcher-env NAME=VALUE).
    launcher_env: Mapping[str, str] = EMPTY
    # Where each task's layout is made (--layout-root): a sandbox with a private /tmp needs another.
    layout_root: str | None = None
    # Guard findings handed down by `run` (conformance/handover.py); None: the session probes for itself.
    preconditions: Mapping[str, Finding] | None = None
    # Which promises this run tests (--only/--skip); what it leaves out is also in profile.unselected.
    selection: promises_mod.Selection = promises_mod.Selection()
    adapter: str | None = None  # --adapter NAME: the sandbox kind remedies are written for

    @property
    def sandbox_kind(self) -> str:
        """The sandbox a BROKEN promise's remedy names flags of (conformance/remedies.py): the adapter's
        tool, bwrap for the reference sandbox, `generic` for a launcher of your own."""
        if self.adapter:
            return remedies.kind_of(self.adapter)
        return "bwrap" if self.launcher.kind is LauncherKind.reference else remedies.GENERIC

    @property
    def leaves_by_harness(self) -> bool:
        """The harness makes and enters each task's cgroup leaf: for its own sandbox only. Any other
        launcher's limits are that sandbox's own promise (conformance/harness.py)."""
        return self.launcher.kind is LauncherKind.reference or self.harness_leaf


def read_expected_skips(path: str | Path) -> dict[str, str]:
    """`test id | reason` per line, '#' comments. Ids are compared by their part after the last
    '::', so the same file works whatever pytest's rootdir makes of the module's path."""
    out: dict[str, str] = {}
    for n, line in enumerate(inputs.read_text(path).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        nodeid, bar, reason = line.partition("|")
        if not bar or not nodeid.strip():
            raise ValueError(f"{path}:{n}: expected `test id | reason`, got {line!r}")
        out[skip_key(nodeid.strip())] = reason.strip()
    return out


def skip_key(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[-1]


def parse_launcher_env(items: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not _ENV_NAME.fullmatch(name):
            raise InvalidSettings(f"--launcher-env {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def check_seconds(flag: str, seconds: float) -> float:
    """A finite, positive number of seconds, at most a day (processes/exits.py seconds_ok)."""
    if not seconds_ok(seconds):
        raise InvalidSettings(f"{flag} {seconds:g}: expected a positive number of seconds, at most "
                            f"{MAX_SECONDS:g}")
    return seconds


# statfs(2) f_type of filesystems that hold no files of ours (include/uapi/linux/magic.h).
_PSEUDO = {0x9FA0: "procfs", 0x62656572: "sysfs", 0x63677270: "cgroup2", 0x27E0EB: "cgroup",
           0x64626720: "debugfs", 0x74726163: "tracefs", 0x73636673: "securityfs", 0xCAFE4A11: "bpf"}


def check_launcher_program(prefix: str, path: str) -> None:
    """The program a launcher prefix runs exists: an absolute path, or a name on the PATH the launcher
    gets (processes/children.py minimal_env). Otherwise every launch would be a harness error (exit 1) where
    `./nonexistent` is already exit 2 (conformance/launch.py external). A word with a placeholder is
    only known at launch."""
    words = shlex.split(prefix)  # external() split it already
    first = words[0] if words else ""
    if not first or "{" in first:
        return
    if os.path.isabs(first):
        if not os.path.exists(first):
            raise InvalidSettings(f"--launcher: {first}: no such file")
        if not os.access(first, os.X_OK) or os.path.isdir(first):
            raise InvalidSettings(f"--launcher: {first}: not an executable file")
    elif "/" not in first and shutil.which(first, path=path) is None:
        raise InvalidSettings(f"--launcher: {first}: not found on the launcher's PATH ({path})")


def check_layout_root(path: str) -> str:
    """An existing directory we can create in, as an absolute path (the launch runs elsewhere)."""
    where = os.path.abspath(path)
    if not os.path.isdir(where):
        raise InvalidSettings(f"--layout-root {path}: no such directory")
    if not os.access(where, os.W_OK | os.X_OK):
        raise InvalidSettings(f"--layout-root {path}: not writable by this user")
    kind = _PSEUDO.get(statfs_magic(Path(where)) or 0)
    if kind is not None:
        # mkdir there fails (procfs) or makes something else than a directory of files (a cgroup).
        raise InvalidSettings(f"--layout-root {path}: a {kind} mount, not a filesystem for a task's files")
    try:
        # Tried, not assumed: root passes access(2) on /proc, where every mkdir fails.
        os.rmdir(tempfile.mkdtemp(prefix=".sbxc-layout-check-", dir=where))
    except OSError as e:
        raise InvalidSettings(f"--layout-root {path}: cannot create a directory there: "
                              f"{e.strerror}") from None
    return where


def select(prof: profile_mod.Profile, only: Iterable[str], skip: Iterable[str]
           ) -> tuple[profile_mod.Profile, promises_mod.Selection]:
    """The profile with what `--only`/`--skip` leave out marked unselected (its witnesses are then not
    generated, and no launch is made for them), and the selection. An unknown id, one id in both, or a
    selection that leaves none of the profile's promises is a InvalidSettings: nothing would be tested,
    and a run that tests nothing must not read as green."""
    try:
        selection = promises_mod.select(only, skip)
    except promises_mod.UnknownPromise as e:
        raise InvalidSettings(str(e)) from None
    if not selection:
        return prof, selection
    made = prof.promises()
    left_out = selection.left_out(made)
    if len(left_out) == len(made):
        given = " and ".join(f for f, ids in (("--only", selection.only), ("--skip", selection.skip)) if ids)
        raise InvalidSettings(f"{given}: leaves none of the promises profile {prof.name} makes to test "
                            f"(it makes {', '.join(made)})")
    return prof._replace(unselected=frozenset(left_out)), selection


def check_files(profile: str | None,
                expected_skips: str | None) -> tuple[profile_mod.Profile, dict[str, str] | None]:
    """The profile and the expected skips, read and checked: what they say does not depend on where
    the suite runs, so `run` checks them too, before it probes (commands/run.py), with the words the
    witness command would use."""
    try:
        prof = profile_mod.load(profile)
    except profile_mod.InvalidProfile as e:
        raise InvalidSettings(str(e)) from None
    if not prof.promises():
        raise InvalidSettings(f"{prof.source}: (profile): expected at least one promise the suite can "
                              "witness")
    # A FIFO, /dev/zero, a loop: one line, never a hang (processes/inputs.py).
    try:
        expected = read_expected_skips(expected_skips) if expected_skips is not None else None
    except inputs.UnusableInput as e:
        raise InvalidSettings(f"--expected-skips {expected_skips}: {e}") from None
    except (OSError, ValueError) as e:
        raise InvalidSettings(f"--expected-skips: {e}") from None
    return prof, expected


def check_named_files(profile: str | None,
                      expected_skips: str | None) -> tuple[profile_mod.Profile, dict[str, str] | None]:
    """check_files for a command that checks them before it starts anything (`run`, `matrix`): a file
    that cannot be read at all (none, a FIFO, /dev/zero, a loop: processes/inputs.py) is one line naming
    its option, `--profile PATH: no such file`; what a readable one says is in the witness's words."""
    for flag, path in (("--profile", profile), ("--expected-skips", expected_skips)):
        if path is not None:
            try:
                inputs.read_bytes(path)
            except inputs.UnusableInput as e:
                raise InvalidSettings(f"{flag} {inputs.shown(path)}: {e}") from None
    return check_files(profile, expected_skips)


def build(
    *,
    profile: str | None,
    launcher: str | None,
    as_user: str | None = None,
    launch_timeout: float | str | None = None,
    perturb: Iterable[str] = (),
    require: bool = False,
    expected_skips: str | None = None,
    host_cannot_observe: str | None = None,
    harness_leaf: bool = False,
    launcher_env: Iterable[str] = (),
    layout_root: str | None = None,
    environ: Mapping[str, str] | None = None,
    launcher_spec: bool = False,
    launcher_stdin: bool = False,
    only: Iterable[str] = (),
    skip: Iterable[str] = (),
    adapter: str | None = None,
) -> Settings:
    environ = os.environ if environ is None else environ
    # An empty value is a mistake (an unset variable in CI), never "the default" (issue 28).
    for flag, value in (("--profile", profile), ("--expected-skips", expected_skips),
                        ("--layout-root", layout_root), ("--as-user", as_user),
                        ("--launch-timeout", launch_timeout)):
        if value == "":
            raise InvalidSettings(f"{flag}: expected a value, got an empty string")
    prof, expected = check_files(profile, expected_skips)
    prof, selection = select(prof, only, skip)
    try:
        # `--launcher ''` is a mistake, not a request for the built-in sandbox.
        lau = REFERENCE
        if launcher is not None:
            lau = external(launcher, spec=launcher_spec, stdin=launcher_stdin)
    except ValueError as e:
        raise InvalidSettings(str(e)) from None
    env_extra = parse_launcher_env(launcher_env)
    if lau.kind is LauncherKind.external and lau.prefix:
        check_launcher_program(lau.prefix, env_extra.get("PATH") or environ.get("PATH") or DEFAULT_PATH)
    perturbations = frozenset(perturb)
    unknown = perturbations - set(bwrap_argv.PERTURBATIONS)
    if unknown:
        raise InvalidSettings(
            f"--perturb: unknown {', '.join(sorted(unknown))}; known: {', '.join(bwrap_argv.PERTURBATIONS)}"
        )
    if perturbations and lau.kind is not LauncherKind.reference:
        raise InvalidSettings("--perturb applies to the reference launcher only, not with --launcher")
    try:
        seconds = float(launch_timeout) if launch_timeout is not None else default_timeout()
    except ValueError:
        raise InvalidSettings(f"--launch-timeout {launch_timeout!r}: expected a number of seconds") from None
    seconds = check_seconds("--launch-timeout", seconds)
    if host_cannot_observe is not None and not host_cannot_observe.strip():
        raise InvalidSettings("--host-cannot-observe: say why the host cannot see the task")
    return Settings(
        profile=prof,
        launcher=lau,
        as_user=as_user,
        timeout=seconds,
        perturbations=perturbations,
        require=require or environ.get(REQUIRE_ENV, "") not in ("", "0"),
        expected_skips=expected,
        host_cannot_observe=host_cannot_observe,
        harness_leaf=harness_leaf,
        launcher_env=env_extra,
        layout_root=check_layout_root(layout_root) if layout_root is not None else None,
        preconditions=None,  # probed by the session, unless `run` handed them on (commands/witness.py)
        selection=selection,
        adapter=adapter,
    )
