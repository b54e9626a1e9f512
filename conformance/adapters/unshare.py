"""util-linux unshare(1) as a sandbox: new user (root mapped to the caller), network, pid, ipc and
uts namespaces, and a fresh /proc for the new pid namespace (--mount-proc implies --mount).

What it does NOT do, so the profile (unshare.toml) does not claim it: no filesystem view of its own
(every host path stays visible and as writable as its file modes allow), no capability drop (the
task is root with a full capability set inside its user namespace, user_namespaces(7)), no
environment scrubbing, no seccomp (a nested user namespace is allowed)."""

from __future__ import annotations

import shlex
import shutil

from sandbox_conformance.conformance.adapters._unavailable import Unavailable

# --kill-child: the forked child gets SIGKILL when unshare dies (PR_SET_PDEATHSIG, unshare(1)), and with
# --pid that empties the whole pid namespace: the task dies with its launcher.
FLAGS = (
    "--user", "--map-root-user", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"
)


def prefix() -> str:
    exe = shutil.which("unshare")
    if exe is None:
        raise Unavailable("unshare not installed (apt-get install util-linux)")
    return shlex.join([exe, *FLAGS])
