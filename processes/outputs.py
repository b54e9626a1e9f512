"""Output files: never an input nor another output, checked before any work, and written whole or not
at all (a temporary file beside the target, then rename(2)).

Issue 28: `witness --profile p.toml --json p.toml` replaced the profile with the report and exited 0;
`--json X --junitxml X` kept one of the two; `--junitxml -` wrote a file named `-`; `--json /dev/full`
or `/proc/version` was a traceback after PASS was printed. Every command with a file option checks
its outputs here first (UsageError: exit 2, one line naming the option)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from sandbox_conformance.processes.exits import UsageError
from sandbox_conformance.processes.inputs import UnusableInput, shown, stat_or_none

# (flag, value): an option as the user gave it; value None means the option was not given.
Named = tuple[str, "str | None"]


def same_file(a: str, b: str) -> bool:
    """One file under two names: the same real path, or (both existing) the same (st_dev, st_ino),
    which a hard link or a bind mount shares while its path differs."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_target(flag: str, value: str, *, stdout_ok: bool = False) -> None:
    """An output file we can replace: a regular file or a new name, in a directory where a file can
    be made (tried: a pseudo-filesystem such as /proc refuses it, so does a read-only mount).
    `stdout_ok`: `-` means stdout for this option; elsewhere it is a usage error, not a file named `-`."""
    if value == "":
        raise UsageError(f"{flag}: expected a file name, got an empty string")
    if value == "-":
        if stdout_ok:
            return
        raise UsageError(f"{flag} -: expected a file name ('-' is not stdout for {flag})")
    target = os.path.realpath(value)
    try:
        st = stat_or_none(target)
    except UnusableInput as e:  # ELOOP, ENOTDIR, EACCES on the way
        raise UsageError(f"{flag} {shown(value)}: {e}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{flag} {value}: is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # /dev/full, a FIFO, a socket: a report is renamed into place, which would replace the node.
        raise UsageError(f"{flag} {value}: not a regular file (a report replaces its file whole)")
    parent = os.path.dirname(target) or "."
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {value}: no such directory {os.path.dirname(value) or '.'}")
    if st is not None and not os.access(target, os.W_OK):
        raise UsageError(f"{flag} {value}: not writable")
    check_creatable(flag, value, target)


def check_creatable(flag: str, value: str, path: str) -> None:
    """The temporary file a write of `path` begins with (temp_beside) can be made: tried and removed, as
    root passes access(2) where every create fails (/proc, a read-only mount). The one line names the
    option as the user gave it, `{flag} {value}`."""
    try:
        tmp = temp_beside(path)
    except OSError as e:
        where = os.path.dirname(os.path.realpath(path)) or "."
        raise UsageError(f"{flag} {value}: cannot create a file in {where}: {e.strerror}") from None
    os.unlink(tmp)


def check_distinct(outputs: Iterable[Named], inputs: Iterable[Named] = ()) -> None:
    """No output is an input or another output (same_file). `-` (stdout) and unset options are not
    files."""
    outs = [(f, v) for f, v in outputs if v and v != "-"]
    ins = [(f, v) for f, v in inputs if v and v != "-"]
    for i, (flag, value) in enumerate(outs):
        for other_flag, other in ins:
            if same_file(value, other):
                raise UsageError(f"{flag} {value}: is also the input {other_flag} {other}: "
                                 "an output must not replace an input")
        for other_flag, other in outs[i + 1:]:
            if same_file(value, other):
                raise UsageError(f"{flag} {value}: is also {other_flag} {other}: each output needs a file "
                                 "of its own")


def temp_beside(path: str | Path) -> Path:
    """A new, empty file in the directory of `path`'s real path (a symlink to a report keeps pointing
    at it), named after it, for `commit` to rename into place."""
    target = os.path.realpath(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                               dir=os.path.dirname(target) or ".")
    os.close(fd)
    return Path(tmp)


def commit(tmp: Path, path: str | Path) -> None:
    """`tmp` (from temp_beside) renamed over `path`, with the old file's mode, or 0o666 less the umask
    as open(2) would give a new one (mkstemp makes it 0o600)."""
    target = os.path.realpath(path)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)
    os.replace(tmp, target)


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write the whole output to, renamed over `path` when the block
    ends without an exception, removed otherwise: a reader never sees half a report, and a failed or
    killed write leaves the previous file or none."""
    tmp = temp_beside(path)
    try:
        yield tmp
        commit(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str | Path, text: str) -> None:
    """`text` to `path`, whole or not at all (`replacing`). OSError (a full disk, EIO) is the caller's
    to turn into one line."""
    with replacing(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def check_reports(reports: Iterable[tuple[str, str | None, bool]], inputs: Iterable[Named]) -> None:
    """The one check of a command's reports, before any work (`witness`, `run`): each
    (flag, value, stdout_ok) that is set is a file it can replace (check_target), and none is an input
    or another report (check_distinct; issue 28: `--json` onto the profile)."""
    reports = list(reports)
    for flag, value, stdout_ok in reports:
        if value is not None:
            check_target(flag, value, stdout_ok=stdout_ok)
    check_distinct([(flag, value) for flag, value, _ in reports], inputs)


def launcher_file(prefix: str | None) -> str | None:
    """The file a `--launcher PREFIX` runs, when its first word names an existing one: an input that no
    output may replace."""
    if not prefix:
        return None
    import shlex

    try:
        words = shlex.split(prefix)
    except ValueError:
        return None
    first = words[0] if words else ""
    return first if "/" in first and os.path.exists(first) else None


# What a run needs free where it makes its layouts and scratch files (a layout, a task spec, the JUnit
# and JSON reports of each witness run: tens of KiB; a margin for a profile with thousands of paths).
MIN_FREE_BYTES = 1 << 20
MIN_FREE_INODES = 256


def check_space(what: str, directory: str) -> None:
    """UsageError (exit 2, one line) when `directory`'s filesystem has no room for a run: a full disk
    under --layout-root or TMPDIR was a traceback from the first file written (issue 28), and a
    `controls` baseline that could not write its report said 75, "did not run". Checked before any
    work; a disk that fills during the run is commands/cli.py's harness error naming ENOSPC."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return  # what does not exist is for the caller's own checks to say
    free = st.f_bavail * st.f_frsize
    inodes = st.f_favail if st.f_files else MIN_FREE_INODES  # 0 files in all: no inode limit (btrfs)
    if free < MIN_FREE_BYTES or inodes < MIN_FREE_INODES:
        raise UsageError(
            f"{what} {directory}: no space left on its filesystem ({free // 1024} KiB and {inodes} inodes "
            f"free; a run needs {MIN_FREE_BYTES >> 20} MiB and {MIN_FREE_INODES}): free some, or point "
            "TMPDIR (or --layout-root) at another filesystem")


def check_temp_space() -> None:
    """check_space for where the temporary files go: $TMPDIR (or TEMP, TMP), else /tmp, as named; not
    tempfile.gettempdir(), which raises where none is writable (a read-only sandbox), and that is for
    the refusal a run then makes to say."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        if os.environ.get(name):
            check_space(name, os.environ[name])
            return
    check_space("the temporary directory", "/tmp")
