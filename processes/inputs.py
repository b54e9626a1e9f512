"""Reading an input file a person named (a profile, an expected-skips list, mr-check's config): a
regular file, read whole up to a bound, or one line saying why not.

Issue 28: a FIFO as a profile hung the run (open(2) waits for a writer), `/dev/zero` read until memory
ran out, and a symlink loop was a traceback. The file is opened with O_NONBLOCK (a FIFO's open then
returns at once) and judged on fstat of what was opened, so nothing is read from a special file."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

# Far above any profile, config or skip list (the reference profile is ~3 KiB), far below a size that
# hurts to hold.
MAX_INPUT = 4 << 20
# The longest path the kernel takes, its NUL included (PATH_MAX, include/uapi/linux/limits.h).
PATH_MAX = 4096


class UnusableInput(ValueError):
    """Why the file cannot be an input, as the tail of one line (the caller names the option)."""


def shown(path: str | Path) -> str:
    """`path` as a one-line message names it: whole, unless it is longer than any path the kernel
    takes, which names no file (ENAMETOOLONG) and can be thousands of characters: then its first 200."""
    name = str(path)
    return name if len(name) < PATH_MAX else name[:200]


def stat_or_none(path: str | Path) -> os.stat_result | None:
    """os.stat of a path a person named: None when nothing is there (ENOENT); any other errno
    (ENAMETOOLONG, ELOOP, ENOTDIR, EACCES on the way) an UnusableInput in the kernel's words. Not
    Path.exists() or is_dir(): they let ENAMETOOLONG and EACCES through as a traceback (pathlib's
    _ignore_error keeps only ENOENT, ENOTDIR, EBADF, ELOOP)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnusableInput(e.strerror or str(e)) from None


def read_bytes(path: str | Path, *, limit: int = MAX_INPUT) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise UnusableInput("no such file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnusableInput("too many levels of symbolic links (a symlink loop?)") from None
        if e.errno == errno.EISDIR:
            raise UnusableInput("is a directory, not a file") from None
        raise UnusableInput(e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UnusableInput("is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise UnusableInput("not a regular file (a FIFO, a device or a socket is never read)")
        if st.st_size > limit:
            raise UnusableInput(f"{st.st_size} bytes: larger than the {limit} an input may have")
        chunks, total = [], 0
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError as e:
                raise UnusableInput(e.strerror or str(e)) from None
            if not chunk:
                break
            total += len(chunk)
            if total > limit:  # grew while read (or a file that lies about its size, in /proc)
                raise UnusableInput(f"larger than the {limit} bytes an input may have")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | Path, *, limit: int = MAX_INPUT) -> str:
    """The file as UTF-8 text."""
    data = read_bytes(path, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnusableInput(f"not UTF-8 text (byte {e.start})") from None
