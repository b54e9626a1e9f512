"""The ladder on the real shapes this machine gives: root, an unprivileged user through setpriv, and
nested inside `bwrap --unshare-user --disable-userns`. Each asserts the classification that shape must
get. Plus the CLI end to end."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from sandbox_conformance.probes import ladder
from sandbox_conformance.probes.classify import RUNGS
from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import run

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
CLI = REPO / ".venv/bin/sandbox-conformance"


def by_id(findings: list[Finding]) -> dict[str, Finding]:
    return {f.probe: f for f in findings}


def assert_all_supported(findings: list[Finding], user: str) -> None:
    assert [f.probe for f in findings] == [str(r) for r in RUNGS]
    bad = {f.probe: (str(f.verdict), f.reason) for f in findings if f.verdict is not Verdict.supported}
    assert not bad, bad
    assert {f.facts["user"] for f in findings} == {user}
    assert all(f.facts["cause"] is None for f in findings)


def test_as_root_one_combined_trial_answers_the_whole_ladder(root_only: None, bwrap_path: str) -> None:
    findings = ladder.probe(Host())
    assert_all_supported(findings, "root")
    assert {f.facts["observed_by"] for f in findings} == {"combined"}
    by = by_id(findings)
    # One launch: every rung's evidence is the same trial (same argv, same report).
    assert len({f.evidence["argv"] for f in findings}) == 1
    assert "--disable-userns" in by["userns"].evidence["argv"]
    # The trial really ran as root and really entered a new user namespace (its report says so).
    report = json.loads(by["userns"].evidence["report"])
    assert report["uid"] == 0
    assert report["userns"] != by["userns"].evidence["userns_outer"] == os.readlink("/proc/self/ns/user")
    assert report["uid_map_read"].split() == ["0", "0", "1"]
    assert report["lo_up"] is True and report["fresh_proc"] is True and report["nested_unshare"] == "ENOSPC"


def test_as_root_each_rung_also_holds_by_its_own_trial(root_only: None, bwrap_path: str) -> None:
    """The slow path on the real kernel: the rungs the combined trial answers, each tried alone."""
    findings = ladder.probe(Host(), fast=False)
    assert_all_supported(findings, "root")
    assert {f.facts["observed_by"] for f in findings} == {"rung"}
    report = json.loads(by_id(findings)["userns"].evidence["report"])
    assert report["uid"] == 0
    assert report["userns_after"] != report["userns_before"]


def test_as_the_test_user_through_setpriv(test_user: str, bwrap_path: str) -> None:
    uid = pwd.getpwnam(test_user).pw_uid
    for fast in (True, False):
        findings = ladder.probe(Host(as_user=test_user), fast=fast)
        assert_all_supported(findings, test_user)
        by = by_id(findings)
        assert by["userns"].facts["observed_by"] == ("combined" if fast else "rung")
        report = json.loads(by["userns"].evidence["report"])
        assert report["uid"] == uid, "the trial ran as the test user, not as root"
        assert report["status"]["CapEff"] == "0000000000000000"
        assert report["uid_map_read"].split() == [str(uid), str(uid), "1"]
        assert by["netns"].evidence["argv"].startswith(f"setpriv --reuid={test_user}")


INSIDE_PROBE = (
    "import json, sys\n"
    "from sandbox_conformance.probes import ladder\n"
    "from sandbox_conformance.probes.host import Host\n"
    "print(json.dumps([f.to_json() for f in ladder.probe(Host())]))\n"
)


def test_nested_inside_disable_userns_userns_is_denied_with_the_nesting_cause(
        root_only: None, bwrap_path: str) -> None:
    """Our code is visible inside through the read-only bind of /; the ladder then runs one level down,
    where the parent bwrap has set max_user_namespaces=1 for its own namespace."""
    done = run([bwrap_path, "--unshare-user", "--disable-userns", "--die-with-parent",
                "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--chdir", str(REPO),
                "--", sys.executable, "-c", INSIDE_PROBE],
               timeout=60, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)})
    assert done.ok, done.stderr
    by = {d["probe"]: Finding.from_json(d) for d in json.loads(done.stdout)}
    assert list(by) == [str(r) for r in RUNGS]
    userns = by["userns"]
    assert (userns.verdict, userns.facts["cause"]) == (Verdict.denied, "nested")
    assert userns.facts["errno"] == "ENOSPC"
    assert int(userns.evidence["user.max_user_namespaces"]) > 0, "ENOSPC while the local sysctl is non-zero"
    assert (by["userns.map"].verdict, by["userns.map"].facts["cause"]) == (Verdict.unknown, "earlier_rung")
    for rung in ("netns", "pidns.proc", "disable_userns"):
        assert (by[rung].verdict, by[rung].facts["cause"]) == (Verdict.denied, "nested"), by[rung].reason
    # The combined trial was tried, failed the same way, and the rungs were walked to name the cause
    # (userns.map is not tried once userns failed: no observation answers it).
    assert [f.facts["observed_by"] for f in by.values()] == ["rung", None, "rung", "rung", "rung"]
    assert by["netns"].evidence["combined trial"].startswith("exit 1: bwrap: ")


def _ladder_under(prefix: list[str], shell: str) -> dict[str, Finding]:
    """Run the ladder in a throwaway namespace shaped by `shell` (torn down when it exits)."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare not installed")
    script = f"{shell} && exec {shlex.quote(sys.executable)} -c {shlex.quote(INSIDE_PROBE)}"
    done = run([*prefix, "sh", "-c", script], timeout=60, cwd=str(REPO),
               env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)})
    assert done.ok, done.stderr
    return {d["probe"]: Finding.from_json(d) for d in json.loads(done.stdout)}


def test_a_masked_proc_refuses_only_the_procfs_rung(root_only: None, bwrap_path: str) -> None:
    """Docker's masked paths, reproduced: a read-only tmpfs over /proc/acpi in a private mount
    namespace. Copied into bwrap's new user namespace the overmount is locked, so the kernel refuses a
    fresh procfs (mount_too_revealing); every other rung still works."""
    target = next((p for p in ("/proc/acpi", "/proc/scsi", "/proc/irq") if os.path.isdir(p)), None)
    if target is None:
        pytest.skip("no directory under /proc to mask")
    by = _ladder_under(["unshare", "--mount", "--propagation", "private"],
                       f"mount -t tmpfs -o ro tmpfs {target}")
    got = {k: (f.verdict, f.facts["cause"]) for k, f in by.items()}
    assert got == {"userns": (Verdict.supported, None), "userns.map": (Verdict.supported, None),
                   "netns": (Verdict.supported, None), "pidns.proc": (Verdict.denied, "masked_proc"),
                   "disable_userns": (Verdict.supported, None)}
    assert target in by["pidns.proc"].reason
    assert {f.facts["observed_by"] for f in by.values()} == {"rung"}
    assert "Can't mount proc" in by["pidns.proc"].evidence["combined trial"]


def test_max_user_namespaces_zero_in_a_throwaway_user_namespace(root_only: None, bwrap_path: str) -> None:
    """The sysctl is per user namespace: set to 0 in a throwaway one (the host's stays untouched), every
    rung is refused with ENOSPC and the cause is the sysctl, not nesting."""
    by = _ladder_under(["unshare", "--user", "--map-root-user"],
                       "echo 0 > /proc/sys/user/max_user_namespaces")
    assert (by["userns"].verdict, by["userns"].facts["cause"]) == (Verdict.denied, "max_user_namespaces")
    assert by["userns"].facts["errno"] == "ENOSPC"
    assert (by["userns.map"].verdict, by["userns.map"].facts["cause"]) == (Verdict.unknown, "earlier_rung")
    for rung in ("netns", "pidns.proc", "disable_userns"):
        assert (by[rung].verdict, by[rung].facts["cause"]) == (Verdict.denied, "max_user_namespaces")


def _cli(*args: str) -> dict:
    done = run([str(CLI), "probe", "--json", *args], timeout=60, cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cli_json_for_two_rungs(root_only: None, bwrap_path: str) -> None:
    if not CLI.exists():
        pytest.skip(f"{CLI} not installed: run `make test` (pip install -e .)")
    doc = _cli("--only", "userns,netns")
    assert doc["schema"] == 1
    assert [f["probe"] for f in doc["findings"]] == ["userns", "netns"]
    assert all(f["verdict"] == "supported" for f in doc["findings"])
    assert doc["context"]["euid"] == 0


def test_cli_as_user_adds_their_ladder(test_user: str, bwrap_path: str) -> None:
    if not CLI.exists():
        pytest.skip(f"{CLI} not installed: run `make test` (pip install -e .)")
    doc = _cli("--only", "userns,disable_userns", "--as-user", test_user)
    probes = {f["probe"]: f for f in doc["findings"]}
    assert set(probes) == {"userns", "disable_userns", f"userns@{test_user}", f"disable_userns@{test_user}"}
    assert probes[f"userns@{test_user}"]["facts"]["user"] == test_user
    assert all(f["verdict"] == "supported" for f in doc["findings"])
