"""What changed: committed since the merge-base with the base, plus uncommitted and untracked paths.

Every git call goes through the injectable runner (processes.children.run by default) with a timeout. Output
is read in `-z` form: NUL-separated, so a path with a space, a newline or non-ASCII bytes is neither
quoted nor split (git-diff(1) and git-status(1), "-z").
"""

from __future__ import annotations

import dataclasses
import enum
import os
import stat
from pathlib import Path

from sandbox_conformance.processes import inputs
from sandbox_conformance.processes.children import Completed, Runner, minimal_env, run

GIT_TIMEOUT = 60.0
DEEPEN_BY = 200  # commits: what the shallow-clone hint suggests fetching first


class GitRefused(Exception):
    """Not a repository, an unknown base, git missing: exit 2 with this one line."""


class Source(enum.StrEnum):
    committed = enum.auto()    # in merge-base..HEAD
    uncommitted = enum.auto()  # staged or unstaged in the work tree
    untracked = enum.auto()    # new, not ignored (--exclude-standard rules)


class ChangeStatus(enum.StrEnum):
    added = enum.auto()
    modified = enum.auto()
    deleted = enum.auto()
    renamed = enum.auto()
    copied = enum.auto()
    type_changed = enum.auto()
    unmerged = enum.auto()
    untracked = enum.auto()


_LETTER = {"A": ChangeStatus.added, "M": ChangeStatus.modified, "D": ChangeStatus.deleted,
           "R": ChangeStatus.renamed,
           "C": ChangeStatus.copied, "T": ChangeStatus.type_changed, "U": ChangeStatus.unmerged}


@dataclasses.dataclass(frozen=True)
class Change:
    path: str
    status: ChangeStatus
    source: Source
    old_path: str | None = None  # renamed/copied from

    @property
    def paths(self) -> tuple[str, ...]:
        """Both sides of a rename count: moving a file out of the sandbox's tree changes the sandbox."""
        return (self.path,) if self.old_path is None else (self.path, self.old_path)

    def how(self) -> str:
        how = f"{self.status} from {self.old_path}" if self.old_path else str(self.status)
        return how + ", uncommitted" if self.source is Source.uncommitted else how

    def describe(self) -> str:
        return f"{self.path} ({self.how()})"


@dataclasses.dataclass(frozen=True)
class Changes:
    root: Path
    base: str          # as the user named it, or the default we resolved
    base_commit: str
    merge_base: str
    head: str
    changes: tuple[Change, ...]
    head_short: str = ""  # `git rev-parse --short HEAD`: the commit a report says it tested

    @property
    def uncommitted(self) -> tuple[Change, ...]:
        """Staged, unstaged and untracked: what the commit does not hold."""
        return tuple(c for c in self.changes if c.source is not Source.committed)

    @property
    def dirty(self) -> bool:
        return bool(self.uncommitted)


class Git:
    def __init__(self, cwd: Path, runner: Runner = run, timeout: float = GIT_TIMEOUT) -> None:
        self.cwd = cwd
        self.runner = runner
        self.timeout = timeout

    def __call__(self, *args: str) -> Completed:
        # HOME and XDG_CONFIG_HOME so the user's safe.directory and config still apply; LC_ALL=C for
        # messages we quote; GIT_OPTIONAL_LOCKS=0 so `git status` does not write the index behind the
        # back of a concurrent git (git(1), GIT_OPTIONAL_LOCKS).
        env = minimal_env({"LC_ALL": "C", "GIT_OPTIONAL_LOCKS": "0"})
        for key in ("HOME", "XDG_CONFIG_HOME"):
            if key in os.environ:
                env[key] = os.environ[key]
        done = self.runner(["git", *args], timeout=self.timeout, env=env, cwd=str(self.cwd))
        if done.not_found:
            raise GitRefused("git not found on PATH (apt-get install git)")
        if done.timed_out:
            raise GitRefused(f"`git {' '.join(args)}` timed out after {self.timeout:.0f}s in {self.cwd}")
        return done

    def ok(self, *args: str) -> str:
        done = self(*args)
        if not done.ok:
            raise GitRefused(f"`git {' '.join(args)}` failed in {self.cwd}: {git_message(done)}")
        return done.stdout

    def commit(self, rev: str) -> str | None:
        done = self("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
        return done.stdout.strip() if done.ok and done.stdout.strip() else None


def git_message(done: Completed) -> str:
    """git's own one-line reason: its first `fatal:`/`error:` line (a hint may follow it, e.g. the
    safe.directory advice after "detected dubious ownership"), else its last line, else the exit code."""
    lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("fatal:", "error:")):
            return ln
    return lines[-1] if lines else f"exit {done.returncode}"


def toplevel(cwd: Path, runner: Runner = run) -> Path:
    try:
        st = inputs.stat_or_none(cwd)
    except inputs.UnusableInput as e:
        raise GitRefused(f"not a git repository: {inputs.shown(cwd)}: {e}") from None
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise GitRefused(f"not a git repository: {cwd} is not a directory")
    done = Git(cwd, runner)("rev-parse", "--show-toplevel")
    if not done.ok or not done.stdout.strip():
        raise GitRefused(f"not a git repository: {cwd} (git rev-parse: {git_message(done)})")
    return Path(done.stdout.strip())


def default_base(git: Git) -> str:
    """origin/HEAD when the clone recorded it, else a `main` or `master` that exists (local, then origin)."""
    done = git("symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD")
    if done.ok and done.stdout.strip() and git.commit(done.stdout.strip()):
        return done.stdout.strip()
    for name in ("main", "master"):
        for ref in (f"refs/heads/{name}", f"refs/remotes/origin/{name}"):
            if git.commit(ref):
                return name if ref.startswith("refs/heads/") else f"origin/{name}"
    raise GitRefused(f"no default branch in {git.cwd} (origin/HEAD unset, no main or master): "
                     "pass --base REV")


def parse_diff_z(out: str) -> list[Change]:
    """`git diff --name-status -z`: STATUS NUL PATH NUL, or R<score>/C<score> NUL OLD NUL NEW NUL."""
    fields = out.split("\0")
    result: list[Change] = []
    i = 0
    while i < len(fields) and fields[i]:
        letter = fields[i][0]
        if letter in "RC":
            old, new = fields[i + 1], fields[i + 2]
            result.append(Change(new, _LETTER[letter], Source.committed, old))
            i += 3
        else:
            result.append(Change(fields[i + 1], _LETTER.get(letter, ChangeStatus.modified), Source.committed))
            i += 2
    return result


def parse_status_z(out: str) -> list[Change]:
    """`git status --porcelain=v1 -z`: `XY PATH` NUL, and for a rename or copy `XY NEW` NUL `OLD` NUL.

    X is the index, Y the work tree; `??` is untracked. Unmerged pairs (DD, AU, UD, UA, DU, AA, UU)
    are reported as unmerged."""
    fields = out.split("\0")
    result: list[Change] = []
    i = 0
    while i < len(fields) and fields[i]:
        entry = fields[i]
        xy, path = entry[:2], entry[3:]
        i += 1
        if xy == "??":
            result.append(Change(path, ChangeStatus.untracked, Source.untracked))
            continue
        if xy == "!!":
            continue
        if "U" in xy or xy in ("DD", "AA"):
            result.append(Change(path, ChangeStatus.unmerged, Source.uncommitted))
            continue
        old = None
        if "R" in xy or "C" in xy:
            old = fields[i]
            i += 1
        # The index side says what the change is when it is staged; the work tree side otherwise.
        letter = xy[0] if xy[0] not in " ." else xy[1]
        if old is not None:
            letter = "R" if "R" in xy else "C"
        result.append(Change(path, _LETTER.get(letter, ChangeStatus.modified), Source.uncommitted, old))
    return result


def collect(cwd: Path, base: str | None, runner: Runner = run) -> Changes:
    root = toplevel(cwd, runner)
    git = Git(root, runner)
    name = base if base is not None else default_base(git)
    base_commit = git.commit(name)
    if base_commit is None:
        # A shallow, single-branch clone (a CI checkout) has not fetched the base at all.
        hint = (f" (a shallow clone: fetch the base first, e.g. `git fetch --deepen={DEEPEN_BY} origin "
                "BRANCH`)" if is_shallow(git) else "")
        raise GitRefused(f"unknown base {name!r}: not a commit in {root}{hint}")
    head = git.commit("HEAD")
    if head is None:
        raise GitRefused(f"HEAD has no commit yet in {root}: nothing to compare with {name!r}")
    done = git("merge-base", base_commit, head)
    if not done.ok or not done.stdout.strip():
        raise GitRefused(no_merge_base(git, name))
    merge_base = done.stdout.strip()
    committed = parse_diff_z(git.ok("diff", "--name-status", "-z", "-M", "--no-ext-diff", "--no-textconv",
                                    merge_base, head, "--"))
    # --untracked-files=all lists files inside new directories one by one (a new directory alone
    # would not match `dir/*.py`); ignored files are left out by the standard exclude rules.
    worktree = parse_status_z(git.ok("status", "--porcelain=v1", "-z", "--renames", "--untracked-files=all"))
    short = git.ok("rev-parse", "--short", head).strip()
    return Changes(root, name, base_commit, merge_base, head, tuple(committed + worktree), short)


def no_merge_base(git: Git, base: str) -> str:
    """Why base and HEAD share no commit, and what to do. In a shallow clone (CI checkouts often
    fetch one commit) the merge-base exists upstream but was not fetched: deepening fixes it, where
    naming another --base would not (git-fetch(1), --deepen and --unshallow)."""
    if is_shallow(git):
        return (f"base {base!r} and HEAD have no merge-base in {git.cwd}, which is a shallow clone: the "
                f"merge-base was not fetched; deepen it with `git fetch --deepen={DEEPEN_BY}` (repeat as "
                "needed) or `git fetch --unshallow`, then re-run")
    return f"base {base!r} and HEAD have no merge-base in {git.cwd}: pass a --base on this history"


def is_shallow(git: Git) -> bool:
    done = git("rev-parse", "--is-shallow-repository")
    return done.ok and done.stdout.strip() == "true"


def files_at_head(root: Path, runner: Runner = run) -> list[str]:
    """Every file in HEAD's tree, repository-relative (for the dead-glob warning)."""
    out = Git(root, runner).ok("ls-tree", "-r", "-z", "--name-only", "--full-tree", "HEAD")
    return [p for p in out.split("\0") if p]
