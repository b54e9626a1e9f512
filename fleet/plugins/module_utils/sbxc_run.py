# Copyright: sandbox-conformance developers. MIT (see the checkout's pyproject.toml).
"""One subprocess call for the modules: a timeout always, the whole process group killed on it.

AnsibleModule.run_command has no timeout, and a probe or a witness run that hangs on a target would
hang the play for that host with it. Stdlib only: this runs on the target, under its python3."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess

# Where the role installs the tool (the Dockerfile's venv too), tried after PATH.
FALLBACKS = ("/opt/sandbox-conformance/bin/sandbox-conformance",)


class Outcome:
    def __init__(self, argv, returncode, stdout, stderr, timed_out):
        self.argv = argv
        self.returncode = returncode  # None: killed on timeout
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out

    def stderr_tail(self, lines=3):
        return " | ".join(self.stderr.strip().splitlines()[-lines:])


def resolve(cli):
    """The CLI to run: an absolute path as given, else PATH, else where the role installs it."""
    if os.path.isabs(cli):
        return cli if os.access(cli, os.X_OK) else None
    found = shutil.which(cli)
    if found:
        return found
    if cli == "sandbox-conformance":
        for path in FALLBACKS:
            if os.access(path, os.X_OK):
                return path
    return None


def run(argv, timeout, env=None):
    """Run argv in its own session; on timeout SIGKILL the group (the suite starts bwrap and pytest
    children that would outlive a kill of the leader alone) and reap it."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return Outcome(list(argv), None if timed_out else proc.returncode,
                   out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out)
