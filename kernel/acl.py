"""POSIX access ACLs, read from the inode and checked the way the kernel checks them.

Mode bits alone can say "no" where the kernel says "yes": a directory 0700 owned by root with an
entry `user:1000:--x`, or a socket 0600 with `group:100:rw-`, lets those ids through although the
`other` bits refuse them. A judgement that a task cannot reach or write a host object must read the
ACL too, or a sandbox that leaves such an object in the task's view is excused.

The ACL lives in the `system.posix_acl_access` xattr, in the kernel's on-disk order
(include/uapi/linux/posix_acl_xattr.h: a le32 version 2, then { le16 tag, le16 perm, le32 id }
entries; the ids come back translated into the reader's user namespace, and the observer reads from
the initial one, so they are the host's ids). The check is acl(5)'s ACCESS CHECK ALGORITHM, as
fs/posix_acl.c posix_acl_permission implements it."""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Iterable
from typing import NamedTuple

XATTR = "system.posix_acl_access"
_VERSION = 2
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
# Tags (include/uapi/linux/posix_acl.h).
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
READ, WRITE, EXECUTE = 4, 2, 1


class Entry(NamedTuple):
    tag: int
    perm: int
    id: int  # meaningful for USER and GROUP only (ACL_UNDEFINED_ID otherwise)


def parse(raw: bytes) -> tuple[Entry, ...]:
    """The entries of an access ACL xattr. Raises ValueError on a value the kernel would not hand out."""
    if len(raw) < _HEADER.size or (len(raw) - _HEADER.size) % _ENTRY.size:
        raise ValueError(f"an ACL xattr of {len(raw)} bytes is not a header and whole entries")
    (version,) = _HEADER.unpack_from(raw)
    if version != _VERSION:
        raise ValueError(f"ACL xattr version {version}, expected {_VERSION}")
    return tuple(Entry(*_ENTRY.unpack_from(raw, off)) for off in range(_HEADER.size, len(raw), _ENTRY.size))


def read(path: str | os.PathLike[str]) -> tuple[Entry, ...]:
    """The extended entries of `path`'s access ACL; () when it has none (ENODATA) or its filesystem
    keeps none (EOPNOTSUPP), where the mode bits are the whole answer. Follows symlinks, as the
    permission check on a path does."""
    try:
        raw = os.getxattr(path, XATTR)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return ()
        raise
    return parse(raw)


def permits(st: os.stat_result, entries: Iterable[Entry], uid: int, gids: Iterable[int], want: int) -> bool:
    """Whether an fsuid `uid` in groups `gids` gets every bit of `want` (READ|WRITE|EXECUTE) on the
    inode `st` with access ACL `entries`, capabilities aside. With no entries, the mode bits."""
    acl = tuple(entries)
    groups = frozenset(gids)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == uid:  # ACL_USER_OBJ is the owner's mode bits (posix_acl_chmod keeps them equal)
        return (mode >> 6) & want == want
    if not acl:
        if st.st_gid in groups:
            return (mode >> 3) & want == want
        return mode & want == want
    mask = next((e.perm for e in acl if e.tag == MASK), 7)
    named = next((e for e in acl if e.tag == USER and e.id == uid), None)
    if named is not None:
        return named.perm & mask & want == want
    matching = [e for e in acl
                if (e.tag == GROUP_OBJ and st.st_gid in groups) or (e.tag == GROUP and e.id in groups)]
    if matching:
        # Any one matching group entry that grants all of `want` (under the mask) grants it; a group
        # that matches and grants less still denies: "other" is not consulted (acl(5), step 3).
        return any(e.perm & mask & want == want for e in matching)
    other = next((e.perm for e in acl if e.tag == OTHER), mode & 7)
    return other & want == want
