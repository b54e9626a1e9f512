"""The probes in real containers (issue 2): a plain container must name seccomp / missing CAP_SYS_ADMIN
as why user namespaces fail; a privileged one offers the whole ladder. Uses the Docker tier's image;
the probe runs with the image's python3 from the checkout bound read-only at /src (PYTHONPATH=/src)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox_conformance.runners.container import security_flags

if TYPE_CHECKING:
    from docker_tier import DockerTier

# The Docker tier's session fixture; imported as a plugin only (an import here would stop pytest
# rewriting its asserts). Any test using it may be the one that pays for the tier's set-up.
pytest_plugins = ["docker_tier"]
SETUP_TIMEOUT = 1500
pytestmark = [pytest.mark.integration, pytest.mark.timeout(SETUP_TIMEOUT)]

REPO = Path(__file__).resolve().parent.parent
LADDER = ("userns", "userns.map", "netns", "pidns.proc", "disable_userns")
USERS = ("root", "sbxc")  # sbxc: the Dockerfile's unprivileged user

# capability(7) numbers -> Docker's names, for the caps this kernel knows (cap_last_cap).
CAPS = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE",
    "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
    "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)


def privileged_flags() -> list[str]:
    """`--privileged`, or as close as this host allows.

    runc gives a privileged container every capability and fails ("unable to apply caps") when our
    own bounding set lacks one (this machine's has no CAP_SYS_RESOURCE). Then: every capability we
    do have, no seccomp filter, no masked /proc or /sys, which is what --privileged means for the
    ladder."""
    bounding = int(next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                        if line.startswith("CapBnd:")), 16)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    missing = [CAPS[i] for i in range(min(last + 1, len(CAPS))) if not bounding >> i & 1]
    if not missing:
        return ["--privileged"]
    return ["--cap-add", "ALL", *(f for cap in missing for f in ("--cap-drop", cap)),
            "--security-opt", "seccomp=unconfined", "--security-opt", "systempaths=unconfined"]


def probe_in(tier: DockerTier, flags: list[str], user: str) -> dict[str, dict[str, Any]]:
    c = tier.docker_cmd("run", "--rm", "--user", user, *flags,
                        "--volume", f"{REPO}:/src:ro", "--env", "PYTHONPATH=/src",
                        "--env", "PYTHONDONTWRITEBYTECODE=1", "--workdir", "/tmp",
                        tier.image, "python3", "-m", "sandbox_conformance", "probe", "--json",
                        "--only", ",".join((*LADDER, "sandboxed")), timeout=180)
    assert c.ok, f"the probe did not run in the container: {c.stderr_tail(5)}"
    return {f["probe"]: f for f in json.loads(c.stdout)["findings"]}


@pytest.mark.parametrize("user", USERS)
def test_a_plain_container_names_seccomp_or_missing_cap_sys_admin(docker_tier: DockerTier, user: str) -> None:
    found = probe_in(docker_tier, [], user)
    userns = found["userns"]
    assert userns["verdict"] == "denied", userns
    assert userns["facts"]["cause"] in ("seccomp", "no_cap_sys_admin"), userns
    assert "seccomp" in userns["reason"] or "CAP_SYS_ADMIN" in userns["reason"]
    assert userns["facts"]["user"] == user


@pytest.mark.parametrize("user", USERS)
def test_a_privileged_container_offers_the_whole_ladder(docker_tier: DockerTier, user: str) -> None:
    found = probe_in(docker_tier, privileged_flags(), user)
    for rung in LADDER:
        assert found[rung]["verdict"] == "supported", found[rung]


@pytest.mark.parametrize("user", USERS)
def test_the_runners_container_flags_offer_the_whole_ladder(docker_tier: DockerTier, user: str) -> None:
    """Container mode runs with these flags and no more: they must be enough, as root and as a user."""
    found = probe_in(docker_tier, security_flags("docker"), user)
    for rung in LADDER:
        assert found[rung]["verdict"] == "supported", found[rung]
    assert found["sandboxed"]["verdict"] == "not_detected", found["sandboxed"]


def test_without_systempaths_unconfined_the_masked_proc_refuses_a_new_procfs(docker_tier: DockerTier) -> None:
    """Why container mode needs systempaths=unconfined: drop only that, and the pid rung fails on the
    masked /proc (the kernel refuses a fresh procfs while /proc has overmounted entries)."""
    flags = security_flags("docker")
    at = flags.index("systempaths=unconfined")
    without = flags[:at - 1] + flags[at + 1:]
    found = probe_in(docker_tier, without, "sbxc")
    assert found["netns"]["verdict"] == "supported", found["netns"]
    assert found["pidns.proc"]["verdict"] == "denied", found["pidns.proc"]
    assert found["pidns.proc"]["facts"]["cause"] == "masked_proc", found["pidns.proc"]
