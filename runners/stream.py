"""A thin sibling of probes.run.run for the long-running children whose output the user must see
live (the witness suite, an image build): inherited stdout/stderr, still a new session, still a
timeout, still the whole process group killed however we leave."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from probes.run import kill_group, minimal_env


def stream(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
           cwd: str | None = None) -> int | None:
    """Run argv with our stdout/stderr; return its exit status, or None when it was killed on timeout.
    A child that cannot be executed at all is 127, like a shell."""
    argv = [str(a) for a in argv]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else minimal_env(),
                                cwd=cwd, start_new_session=True)
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return 127
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.wait()
        return None
    except BaseException:
        # Ctrl-C reaches only us (the child is in its own session): take its group down with us.
        kill_group(proc.pid)
        proc.wait()
        raise
    # The leader exited; anything it left in its group goes too.
    kill_group(proc.pid)
    return rc
