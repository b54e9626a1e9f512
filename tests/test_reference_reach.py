"""The reference sandbox keeps the reach promises (issue 26), shown by a probe of our own rather than by
the witness program: the exact argv `reference_argv` builds (through `WitnessSession.argv`), the planted
secret in its environment, a small program on stdin that looks for the secret in every process it can
see, opens the host's kernel settings for writing and every device node for reading. As root (where
file modes let everything through, so only the sandbox stands in the way) and as the test user."""

from __future__ import annotations

import json
import subprocess

import pytest

from sandbox_conformance.conformance import profile
from sandbox_conformance.conformance.harness import WitnessSession
from sandbox_conformance.conformance.launch import SECRET_ENV
from sandbox_conformance.conformance.plan import DEVICES, KERNEL_INTERFACES

pytestmark = pytest.mark.integration

PROBE = r"""
import json, os, stat
secret = SECRET
found = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for what in ("environ", "cmdline"):
        try:
            with open("/proc/%s/%s" % (pid, what), "rb") as f:
                if secret in f.read():
                    found.append("/proc/%s/%s" % (pid, what))
        except OSError:
            pass
opened = []
for path in KERNEL:
    try:
        os.close(os.open(path, os.O_WRONLY))
        opened.append(path)
    except OSError:
        pass
devices = []
for name in sorted(os.listdir("/dev")):
    path = "/dev/" + name
    st = os.lstat(path)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        rdev = "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
        if ALLOWED.get(path) == rdev:
            continue
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY))
            devices.append(path)
        except OSError:
            pass
print(json.dumps({"secret": found, "kernel": opened, "devices": devices, "pids": len(os.listdir("/proc"))}))
"""


def _probe(as_user: str | None, perturbations: frozenset[str] = frozenset()) -> dict[str, object]:
    with WitnessSession(profile.load(None), as_user=as_user, perturbations=perturbations) as session:
        assert session.host is not None
        secret = session.host.secret_value
        program = (
            f"SECRET = {secret.encode()!r}\nKERNEL = {list(KERNEL_INTERFACES)!r}\nALLOWED = {DEVICES!r}\n"
            + PROBE
        )
        done = subprocess.run(
            session.argv(),
            input=program,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", SECRET_ENV: secret},
            check=False,
        )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("user", ["root", "test user"])
def test_the_reference_sandbox_keeps_the_secret_the_sysctls_and_the_devices_out_of_reach(
    user: str, root_only: None, bwrap_path: str, request: pytest.FixtureRequest
) -> None:
    as_user = request.getfixturevalue("test_user") if user == "test user" else None
    seen = _probe(as_user)
    # The probe saw bwrap's PID 1 and itself at least: the look at other processes was made.
    assert isinstance(seen["pids"], int) and seen["pids"] >= 2
    assert seen["secret"] == [], f"the launcher's secret is readable inside: {seen['secret']}"
    assert seen["kernel"] == [], f"host kernel settings open for writing: {seen['kernel']}"
    assert seen["devices"] == [], f"device nodes off the allowlist open: {seen['devices']}"


def test_the_probe_sees_the_leak_of_bwrap_started_with_the_launchers_environment(
    root_only: None, bwrap_path: str
) -> None:
    # The same probe, through the reference argv with its two fixes taken out: it must see what they
    # stop, or its green above means nothing.
    seen = _probe(None, frozenset({"secret_in_init", "proc_sys_writable"}))
    assert "/proc/1/environ" in seen["secret"]  # type: ignore[operator]
    assert "/proc/sys/kernel/core_pattern" in seen["kernel"]  # type: ignore[operator]
