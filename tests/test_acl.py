"""POSIX ACLs: the check in kernel/acl.py against the kernel's own (access(2) in a child holding the
ids and no capabilities), and the observer's reach judgements that rest on it."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sandbox_conformance.conformance import observer
from sandbox_conformance.kernel import acl, mountinfo

UNDEFINED = 0xFFFFFFFF  # ACL_UNDEFINED_ID


def _xattr(entries: Sequence[tuple[int, int, int]]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _set(path: Path, mode: int, extra: Sequence[tuple[int, int, int]], mask: int | None) -> None:
    """An access ACL equal to `mode` plus `extra` named entries (sorted by tag then id, as the kernel
    requires, posix_acl_valid) and a mask."""
    entries = [(acl.USER_OBJ, (mode >> 6) & 7, UNDEFINED)]
    entries += sorted(e for e in extra if e[0] == acl.USER)
    entries += [(acl.GROUP_OBJ, (mode >> 3) & 7, UNDEFINED)]
    entries += sorted(e for e in extra if e[0] == acl.GROUP)
    if mask is not None:
        entries += [(acl.MASK, mask, UNDEFINED)]
    entries += [(acl.OTHER, mode & 7, UNDEFINED)]
    os.setxattr(path, acl.XATTR, _xattr(entries))


def _kernel_says(path: Path, base: Path, uid: int, gid: int, groups: Sequence[int],
                 *wants: int) -> list[bool]:
    """access(2) of each of `wants` as `uid` with no capabilities (setresuid away from 0 clears the
    effective set, capabilities(7), "Effect of user ID changes on capabilities"), on `path` relative
    to `base`, entered as root: the directories above `base` are not asked."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.chdir(base)
            path = path.relative_to(base)
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            os.write(w, bytes(b"01"[os.access(path, want)] for want in wants))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert len(said) == len(wants), "the child could not ask"
    return [c == ord("1") for c in said]


@pytest.fixture
def searchable(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("setting ids for the kernel's check needs root")
    tmp_path.chmod(0o755)
    return tmp_path


@pytest.fixture
def inode(searchable: Path) -> Path:
    f = searchable / "f"
    f.write_text("x")
    os.chown(f, 0, 0)
    try:
        _set(f, 0o640, [(acl.USER, 4, 1000)], 4)
    except OSError as e:
        pytest.skip(f"{searchable} keeps no POSIX ACLs: {e.strerror}")
    return f


# (mode, named entries, mask): each row grants or refuses something the mode bits alone do not.
SHAPES = [
    (0o600, [], None),
    (0o600, [(acl.USER, 6, 1000)], 6),
    (0o600, [(acl.USER, 6, 1000)], 4),  # the mask cuts a named user down
    (0o640, [(acl.GROUP, 2, 2000)], 7),
    (0o604, [(acl.GROUP, 0, 2000)], 7),  # a matching group with nothing: "other" is not asked
    (0o660, [(acl.USER, 0, 1000)], 7),  # a named user with nothing, though in the owning group
    (0o701, [(acl.GROUP, 1, 2000), (acl.GROUP, 6, 3000)], 7),
    (0o700, [(acl.USER, 1, 1000), (acl.GROUP, 7, 2000)], 1),
]
WHO = [(1000, 1000, []), (1000, 0, [0]), (1001, 2000, [3000]), (1002, 2000, []), (1003, 3000, [2000])]


@pytest.mark.parametrize(("mode", "extra", "mask"), SHAPES)
def test_the_check_agrees_with_the_kernel(inode: Path, mode: int, extra: list[tuple[int, int, int]],
                                          mask: int | None) -> None:
    _set(inode, mode, extra, mask)
    st = os.stat(inode)
    entries = acl.read(inode)
    # A minimal ACL is folded into the mode bits and no xattr kept (fs/posix_acl.c posix_acl_equiv_mode).
    assert bool(entries) == bool(extra), "an extended ACL was set and must read back"
    # access(2) checks X_OK on a regular file only if some x bit is set: ask for it where one is.
    wants = [acl.READ, acl.WRITE, acl.READ | acl.WRITE] + ([acl.EXECUTE] if st.st_mode & 0o111 else [])
    for uid, gid, groups in WHO:
        said = _kernel_says(inode, inode.parent, uid, gid, groups, *wants)
        ours = [acl.permits(st, entries, uid, [gid, *groups], want) for want in wants]
        assert ours == said, (oct(mode), extra, mask, uid, gid, groups, wants)


def test_no_acl_is_the_mode_bits(tmp_path: Path) -> None:
    f = tmp_path / "plain"
    f.write_text("x")
    f.chmod(0o640)
    assert acl.read(f) == ()
    st = os.stat(f)
    assert acl.permits(st, (), st.st_uid, [], acl.READ | acl.WRITE)
    assert not acl.permits(st, (), st.st_uid + 1, [st.st_gid], acl.WRITE)
    assert acl.permits(st, (), st.st_uid + 1, [st.st_gid], acl.READ)


@pytest.mark.parametrize("raw", [b"", b"\x02\x00\x00", _xattr([]) + b"\x01", struct.pack("<I", 1)])
def test_a_malformed_xattr_is_an_error_not_an_empty_acl(raw: bytes) -> None:
    with pytest.raises(ValueError):
        acl.parse(raw)


def test_a_directory_the_mode_refuses_but_an_acl_lets_search_is_reachable(searchable: Path) -> None:
    tmp_path = searchable
    locked = tmp_path / "var" / "locked"
    (locked / "inner").mkdir(parents=True)
    os.chown(locked, 0, 0)
    locked.chmod(0o700)
    task = observer.Creds(fsuid=1000, fsgid=1000, groups=frozenset(), mapped=((1000, 1),))
    assert observer.unreachable(tmp_path, "/var/locked/inner", task)
    try:
        _set(locked, 0o700, [(acl.USER, 1, 1000)], 1)
    except OSError as e:
        pytest.skip(f"{tmp_path} keeps no POSIX ACLs: {e.strerror}")
    assert not observer.unreachable(tmp_path, "/var/locked/inner", task)
    assert _kernel_says(locked / "inner", tmp_path, 1000, 1000, [], os.X_OK) == [True]
    # Granted to a group the task is not in: still unreachable.
    _set(locked, 0o700, [(acl.GROUP, 1, 2000)], 1)
    assert observer.unreachable(tmp_path, "/var/locked/inner", task)
    assert observer.unreachable(tmp_path, "/var/locked/inner", task._replace(groups=frozenset({2001})))
    assert not observer.unreachable(tmp_path, "/var/locked/inner", task._replace(groups=frozenset({2000})))


@pytest.fixture
def open_to_all() -> Iterator[Path]:
    """A directory whose whole path every uid can search: the observer walks the path from the
    task's root, and pytest's tmp_path sits under a 0700 directory of root's."""
    if os.geteuid() != 0:
        pytest.skip("setting ids for the kernel's check needs root")
    d = Path(tempfile.mkdtemp(prefix="sbxc-acl-", dir="/tmp"))
    try:
        d.chmod(0o755)
        assert _kernel_says(d, Path("/"), 1000, 1000, [], os.X_OK) == [True], "/tmp must be open to all"
        yield d
    finally:
        shutil.rmtree(d)


def test_a_host_socket_the_mode_refuses_but_an_acl_lets_write_is_usable(open_to_all: Path) -> None:
    tmp_path = open_to_all
    path = tmp_path / "daemon.sock"
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(path))
        srv.listen()
        os.chown(path, 0, 0)
        path.chmod(0o600)
        mounts = mountinfo.parse(Path("/proc/self/mountinfo").read_text())
        task = observer.Creds(fsuid=1000, fsgid=1000, groups=frozenset(), mapped=((1000, 1),))

        def usable() -> bool:
            found = observer.exposed([str(path)], Path("/"), mounts, mounts, task)
            assert [e["path"] for e in found] == [str(path)]
            return bool(found[0]["usable"])

        assert not usable()
        try:
            _set(path, 0o600, [(acl.USER, 6, 1000)], 6)
        except OSError as e:
            pytest.skip(f"{tmp_path} keeps no POSIX ACLs: {e.strerror}")
        assert usable()
        # What the kernel does with that ACL: connect(2) as uid 1000 succeeds.
        assert _kernel_says(path, tmp_path, 1000, 1000, [], os.W_OK) == [True]
        _set(path, 0o600, [(acl.USER, 6, 1000)], 4)  # the mask takes the write away
        assert not usable()
