"""The reference task layout the suite creates on the host before a launch, and removes after.

    ROOT/                                  fresh mkdtemp, 0755 so an --as-user task can traverse it
      spec.json                            the task spec an external launcher may read
      state/                               the platform's state directory ({state})
        config.toml                        readable app state (a read-only witness reads it)
        db/canary.sqlite                   masked: must be invisible inside
        users/alice/tasks/<task>/control/  {control}: seeded files, read-only, only this task's
        users/alice/tasks/<task>/work/     {workdir}: writable
        users/alice/tasks/<other>/control/ {neighbour_control}: a canary, must be absent
        users/alice/tmp/                   {user_tmp}: writable sibling of the task tree
        users/bob/...                      {other_user}: a canary, must be absent

Every canary carries a per-run nonce, so a witness that sees it knows it is this run's host content.
When the task runs as an unprivileged user, the state tree is chowned to it (on a real platform the
service user that runs tasks owns its state): a read-only promise must then be kept by the MOUNT,
not by file modes (an append to a root-owned 0644 file fails with EACCES whatever the sandbox does)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sandbox_conformance.conformance.profile import LayoutNames
from sandbox_conformance.processes import owner

TEMP_PREFIX = "sbxc-witness-"
USER = "alice"
OTHER_USER = "bob"
CANARY_MARK = "SBXC-CANARY"


class Layout(NamedTuple):
    """One task's layout on the host (drawn in the module doc): where it is, the nonce its canaries carry,
    and who owns its state tree. The properties name its paths; `values` gives each placeholder its path."""

    root: Path
    nonce: str
    task_id: str
    neighbour_task_id: str
    user: str
    owner_uid: int  # who owns the user's trees (the --as-user uid, or ours)
    owner_gid: int
    other_user_name: str = OTHER_USER
    named: bool = False  # the root's name is the profile's ([layout] root), labelled beside it

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def user_dir(self) -> Path:
        return self.state / "users" / self.user

    @property
    def control(self) -> Path:
        return self.user_dir / "tasks" / self.task_id / "control"

    @property
    def workdir(self) -> Path:
        return self.user_dir / "tasks" / self.task_id / "work"

    @property
    def user_tmp(self) -> Path:
        return self.user_dir / "tmp"

    @property
    def neighbour_control(self) -> Path:
        return self.user_dir / "tasks" / self.neighbour_task_id / "control"

    @property
    def other_user(self) -> Path:
        return self.state / "users" / self.other_user_name

    @property
    def spec_file(self) -> Path:
        return self.root / "spec.json"

    def values(self) -> dict[str, str]:
        """Placeholder -> value, for profile paths and launcher prefixes."""
        return {
            "state": str(self.state),
            "user": self.user,
            "task_id": self.task_id,
            "control": str(self.control),
            "workdir": str(self.workdir),
            "user_tmp": str(self.user_tmp),
            "neighbour_control": str(self.neighbour_control),
            "other_user": str(self.other_user),
        }

    def canary(self, what: str) -> str:
        return f"{CANARY_MARK} {what} {self.nonce}\n"


def _owner(as_user: str | None) -> tuple[int, int]:
    if as_user is None:
        return os.geteuid(), os.getegid()
    pw = pwd.getpwnam(as_user)
    return pw.pw_uid, pw.pw_gid


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o644)


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    if (uid, gid) == (os.geteuid(), os.getegid()):
        return
    os.chown(top, uid, gid)
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            os.chown(os.path.join(dirpath, n), uid, gid)


def create(
    *,
    control_files: tuple[str, ...] = ("system_prompt.txt",),
    as_user: str | None = None,
    temp_root: str | None = None,
    names: LayoutNames | None = None,
) -> Layout:
    """Create a fresh layout. The caller removes it with `remove` (see `layout()` for the guard)."""
    # The owner's stamp in the name: a run that is SIGKILLed leaves this behind, and the next run's
    # sweep, here, removes it once that owner is gone (processes/owner.py). A root named by the profile
    # carries it on a label beside it instead (owner.make_named_dir), so a launcher sees only names a
    # platform would use.
    names = names or LayoutNames()
    owner.sweep_once()
    if names.root is None:
        root = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{owner.stamp()}-", dir=temp_root))
    else:
        root = Path(owner.make_named_dir(temp_root or tempfile.gettempdir(), names.root))
    try:
        root.chmod(0o755)  # mkdtemp makes 0700; an --as-user task must traverse it
        uid, gid = _owner(as_user)
        lay = Layout(
            root=root,
            nonce=secrets.token_hex(8),
            task_id=f"{names.task_prefix}{secrets.token_hex(4)}",
            neighbour_task_id=f"{names.task_prefix}{secrets.token_hex(4)}",
            user=names.user,
            owner_uid=uid,
            owner_gid=gid,
            other_user_name=names.other_user,
            named=names.root is not None,
        )
        _write(lay.state / "config.toml", f"# {lay.canary('config').strip()}\n")
        _write(lay.state / "db" / "canary.sqlite", lay.canary("db"))
        for name in control_files:
            _write(lay.control / name, lay.canary(f"control {name}"))
            _write(lay.neighbour_control / name, lay.canary(f"neighbour {name}"))
        lay.control.mkdir(parents=True, exist_ok=True)
        lay.workdir.mkdir(parents=True, exist_ok=True)
        lay.user_tmp.mkdir(parents=True, exist_ok=True)
        other_task = lay.other_user / "tasks" / f"{names.task_prefix}{secrets.token_hex(4)}"
        _write(other_task / "control" / "system_prompt.txt", lay.canary("other-user"))
        for d in [lay.state, *lay.state.rglob("*")]:
            if d.is_dir():
                d.chmod(0o755)
        _chown_tree(lay.state, uid, gid)
        return lay
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        if names.root is not None:
            owner.unlabel(str(root))
        raise


def write_spec(lay: Layout, spec: Mapping[str, Any]) -> Path:
    lay.spec_file.write_text(json.dumps(spec, indent=2, sort_keys=True))
    lay.spec_file.chmod(0o644)
    return lay.spec_file


def remove(lay: Layout) -> None:
    # A task may have left read-only directories in its writable trees; we are their owner or root,
    # so restoring write permission on the parent and retrying is enough.
    def retry(func: Any, path: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o755)
            func(path)

    shutil.rmtree(lay.root, onerror=retry)  # onerror: Python 3.11 (onexc is 3.12+)
    if lay.root.exists():
        shutil.rmtree(lay.root, ignore_errors=True)
    if lay.named and not lay.root.exists():
        owner.unlabel(str(lay.root))


@contextlib.contextmanager
def layout(**kwargs: Any) -> Iterator[Layout]:
    lay = create(**kwargs)
    try:
        yield lay
    finally:
        remove(lay)
