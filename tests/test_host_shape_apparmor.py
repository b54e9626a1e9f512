"""Issue 12's AppArmor shape on a real kernel: the caller confined by a profile without `userns,`.

One boot (tests/host_shape_lab/apparmor_host.py as the command under stage 2): Debian's 6.12 kernel
from bookworm-security, whose AppArmor (its default LSM) mediates user-namespace creation (upstream
6.7+), with two profiles compiled and loaded in the GUEST by trixie's apparmor_parser 4.1 (bookworm's
3.0.8 predates the `userns,` rule). Both come from scripts/apparmor-lab-deps, cached; without them
every test here skips with that script's one-line reason (and fails under SANDBOX_CONFORMANCE_REQUIRE=1
unless tests/expected-skips.txt lists it).

What is asserted, per identity (root, root's `--as-user` ladder, the user starting the CLI): the
probe's verdict and cause on every rung, `run --print-mode`'s refusal with 75 naming AppArmor and the
way on, bwrap's own words under the profile, the label each command really ran under, the kernel's
audit record of each refusal; and the positive control: the same profile WITH `userns,` lets the
ladder pass and `run` choose native. Then that nothing was left behind: no qemu, no workdir, no mount
of the parser's chroot in the guest or on the host.

The rule this boot proved is pinned by fast fake-host tests in tests/test_ladder_classify.py
("apparmor profile without userns" and its negatives).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sandbox_conformance.processes import owner
from sandbox_conformance.runners.vm import image as vm_image
from sandbox_conformance.runners.vm import qemu as vm
from sandbox_conformance.runners.vm.qemu import VmResult, run_in_vm

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "host_shape_lab/apparmor_host.py"
CLI = REPO / ".venv/bin/sandbox-conformance"
DEPS = REPO / "scripts/apparmor-lab-deps"
LADDER = ("bwrap", "userns", "userns.map", "netns", "pidns.proc", "disable_userns")
RUNGS = LADDER[1:]
DENY, ALLOW = "sbxc-lab-deny", "sbxc-lab-allow"

# bwrap 0.8.0's own words under the profile without `userns,` (Debian 6.12, AppArmor 4.1 policy):
# clone(CLONE_NEWUSER) got EACCES from the LSM hook.
BWRAP_EACCES = "bwrap: Creating new namespace failed: Permission denied"
# The ladder under that profile, for root and for the user alike (AppArmor's profile rule has no
# capability exemption): our own unshare and every bwrap rung refused, the map rung never reached.
DENIED = {"bwrap": ("supported", None), "userns": ("denied", "apparmor"),
          "userns.map": ("unknown", "earlier_rung"), "netns": ("denied", "apparmor"),
          "pidns.proc": ("denied", "apparmor"), "disable_userns": ("denied", "apparmor")}
ALL_OK = dict.fromkeys(LADDER, ("supported", None))


@dataclasses.dataclass(frozen=True)
class Boot:
    result: VmResult
    doc: dict[str, Any]
    deps: Mapping[str, str]
    wall: float
    leftover_qemu: list[int]  # pids (runners/vm/qemu.py qemu_pids)
    leftover_workdir: bool
    host_mounts: list[str]  # host mount points under the parser tree or the workdir, after the boot


def _deps() -> dict[str, str]:
    """The 6.12 image and trixie's parser, from the cache (fetched once when missing)."""
    if os.geteuid() != 0:
        pytest.skip("the AppArmor lab runs as root (qemu's 9p passthrough, chroot, the cache in /var/cache)")
    if shutil.which(vm.QEMU) is None:
        pytest.skip(f"{vm.QEMU} not installed: run scripts/vm-deps")
    if not CLI.exists():
        pytest.skip(f"{CLI} not installed: run `make test` (pip install -e .)")
    try:
        done = subprocess.run([str(DEPS)], capture_output=True, text=True, timeout=1800,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{DEPS.name} timed out after 1800 s (fetching the 6.12 kernel or trixie's apparmor)")
    if done.returncode == 75:
        pytest.skip(f"no AppArmor lab: {done.stderr.strip()}")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))



def _mounts_under(*prefixes: str) -> list[str]:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if any(p == x or p.startswith(x.rstrip("/") + "/") for x in prefixes)]


@pytest.fixture(scope="session")
def apparmor_boot(test_user: str) -> Boot:
    deps = _deps()
    image = vm_image.load_image(Path(deps["image"]))
    # Under /var/tmp (the host's /, seen by the guest), with the owner's stamp: a SIGKILLed session's
    # leftover is swept by the next run (processes/owner.py, prefix sbxc-vm.).
    work = Path(tempfile.mkdtemp(prefix=f"sbxc-vm.{owner.stamp()}.lab-apparmor.", dir="/var/tmp"))
    work.chmod(0o711)
    try:
        argv = ["/usr/bin/python3", "-I", "-S", str(SCRIPT), "--cli", str(CLI), "--repo", str(REPO),
                "--user", test_user, "--parser-tree", deps["parser_tree"]]
        started = time.monotonic()
        result = run_in_vm(argv, workdir=work, timeout=600, cwd=str(REPO), image=image)
        wall = time.monotonic() - started
        print(f"\nAppArmor lab boot ({deps['kernel_version']}, apparmor_parser {deps['parser_version']}): "
              f"exit {result.exit_code}, {result.accel}, boot {result.boot_seconds}s, wall {wall:.1f}s, "
              f"load {os.getloadavg()[0]:.1f}")
        try:
            doc = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            doc = {}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Boot(result, doc, deps, wall, vm.qemu_pids(str(work)), work.exists(),
                _mounts_under(deps["parser_tree"], str(work)))


def _ok(boot: Boot) -> dict[str, Any]:
    r = boot.result
    assert r.exit_code == 0 and boot.doc, (r.error, r.stderr[-3000:], r.console[-3000:])
    return boot.doc


def _run(boot: Boot, key: str) -> dict[str, Any]:
    runs = _ok(boot)["runs"]
    assert key in runs, sorted(runs)
    return dict(runs[key])


def _findings(boot: Boot, key: str) -> dict[str, dict[str, Any]]:
    done = _run(boot, key)
    assert done["rc"] == 0, (key, done["stderr"][-2000:])
    return {f["probe"]: f for f in json.loads(done["stdout"])["findings"]}


def _ladder(by: Mapping[str, Mapping[str, Any]], suffix: str = "") -> dict[str, tuple[str, str | None]]:
    probes = RUNGS if suffix else LADDER  # --as-user repeats the rungs, not the bwrap probe
    return {p: (by[p + suffix]["verdict"], by[p + suffix]["facts"].get("cause")) for p in probes}


def _expect(ladder: Mapping[str, tuple[str, str | None]], suffix: str) -> dict[str, tuple[str, str | None]]:
    return {p: v for p, v in ladder.items() if not suffix or p != "bwrap"}


# The three ways the confined CLI ran the ladder: root's own, root's `--as-user` (setpriv from the
# confined process keeps the profile), and the user starting the CLI (attached at their own exec).
def _who(test_user: str) -> dict[str, tuple[str, str]]:
    return {"root": ("probe", ""), "root --as-user": ("probe", f"@{test_user}"), "user": ("probe_user", "")}


@pytest.mark.integration
@pytest.mark.timeout(2400)
class TestAppArmorProfileWithoutUserns:
    def test_the_guest_runs_debians_6_12_with_apparmor_mediating_user_namespaces(self,
                                                                              apparmor_boot: Boot) -> None:
        doc = _ok(apparmor_boot)
        assert doc["kernel"].startswith("6.12.") and doc["kernel"].endswith("-amd64"), doc["kernel"]
        assert "apparmor" in doc["lsm"].split(","), doc["lsm"]
        assert doc["apparmor_enabled"] == "Y"
        assert "userns_create" in doc["namespaces_mask"].split(), doc["namespaces_mask"]
        # Not Ubuntu's global switch: Debian's kernel has no such sysctl, so only the profile refuses.
        assert doc["sysctls"]["apparmor_restrict_unprivileged_userns"] == "!FileNotFoundError"
        load = doc["load"]
        assert load["rc"] == 0, load
        assert f'Replacement succeeded for "{DENY}"' in load["stdout"], load
        assert set(doc["profiles"].splitlines()) == {f"{DENY} (enforce)", f"{ALLOW} (enforce)"}
        assert apparmor_boot.deps["parser_version"].startswith("4.")

    def test_each_command_ran_under_the_label_it_names(self, apparmor_boot: Boot) -> None:
        for kind, label in (("deny", f"{DENY} (enforce)"), ("allow", f"{ALLOW} (enforce)")):
            for who in ("root", "user"):
                done = _run(apparmor_boot, f"{kind}_label_{who}")
                assert (done["rc"], done["stdout"].strip()) == (0, label), (kind, who, done)
        assert _run(apparmor_boot, "unconfined_label")["stdout"].strip() == "unconfined"

    @pytest.mark.parametrize("who", ["root", "user"])
    def test_bwrap_says_permission_denied_under_the_profile_without_userns(self, apparmor_boot: Boot,
                                                                          who: str) -> None:
        done = _run(apparmor_boot, f"deny_bwrap_{who}")
        assert (done["rc"], done["stderr"].strip()) == (1, BWRAP_EACCES), done
        control = _run(apparmor_boot, f"allow_bwrap_{who}")
        assert (control["rc"], control["stderr"]) == (0, ""), control

    def test_the_same_bwrap_unconfined_works_so_the_guest_itself_allows_user_namespaces(
            self, apparmor_boot: Boot) -> None:
        done = _run(apparmor_boot, "unconfined_bwrap_user")
        assert (done["rc"], done["stderr"]) == (0, ""), done

    def test_the_kernel_logged_each_refusal_against_the_profile(self, apparmor_boot: Boot) -> None:
        audit = _ok(apparmor_boot)["audit"]
        denied = [line for line in audit if 'apparmor="DENIED"' in line]
        assert denied, audit
        for line in denied:
            assert 'operation="userns_create"' in line and f'profile="{DENY}"' in line, line
        # Both our own unshare (the python3 userns trial) and bwrap's clone were refused.
        assert {c for c in ('comm="bwrap"', 'comm="python3"') if any(c in line for line in denied)} == {
            'comm="bwrap"', 'comm="python3"'}, denied

    @pytest.mark.parametrize("who", ["root", "root --as-user", "user"])
    def test_the_probe_names_apparmor_on_every_rung(self, apparmor_boot: Boot, test_user: str,
                                                    who: str) -> None:
        """Was: userns denied (unclassified), every later rung unknown (earlier_rung)."""
        key, suffix = _who(test_user)[who]
        by = _findings(apparmor_boot, f"deny_{key}")
        assert _ladder(by, suffix) == _expect(DENIED, suffix), {p: by[p + suffix]["reason"] for p in RUNGS}
        userns = by["userns" + suffix]
        assert (userns["facts"]["step"], userns["facts"]["errno"]) == ("unshare", "EACCES"), userns
        assert f"label {DENY} (enforce)" in userns["reason"] and "`userns,`" in userns["reason"], userns
        assert userns["evidence"]["apparmor userns mediation"] == "True", userns["evidence"]
        for rung in ("netns", "pidns.proc", "disable_userns"):
            assert by[rung + suffix]["evidence"]["stderr"] == BWRAP_EACCES, by[rung + suffix]["evidence"]

    @pytest.mark.parametrize("who", ["root", "user"])
    def test_run_refuses_with_75_naming_apparmor_and_the_way_on(self, apparmor_boot: Boot, who: str) -> None:
        done = _run(apparmor_boot, f"deny_mode_{who}")
        out = done["stdout"]
        assert done["rc"] == 75, (out, done["stderr"][-2000:])
        assert "mode: refused (requested auto)" in out, out
        assert "userns: denied (apparmor)" in out and "unclassified" not in out, out
        assert f"label {DENY} (enforce)" in out, out
        ways = [line for line in out.splitlines() if line.strip().startswith("way on:")]
        assert any("`userns,`" in line for line in ways), out

    @pytest.mark.parametrize("who", ["root", "root --as-user"])
    def test_the_same_profile_with_userns_lets_the_ladder_pass(self, apparmor_boot: Boot, test_user: str,
                                                                who: str) -> None:
        key, suffix = _who(test_user)[who]
        by = _findings(apparmor_boot, f"allow_{key}")
        assert _ladder(by, suffix) == _expect(ALL_OK, suffix), {p: by[p + suffix]["reason"] for p in RUNGS}

    def test_run_goes_native_for_the_user_under_the_profile_with_userns(self, apparmor_boot: Boot) -> None:
        done = _run(apparmor_boot, "allow_mode_user")
        assert done["rc"] == 0 and "mode: native" in done["stdout"], (done["stdout"], done["stderr"][-2000:])

    def test_nothing_was_left_behind(self, apparmor_boot: Boot) -> None:
        doc = _ok(apparmor_boot)
        assert apparmor_boot.leftover_qemu == [] and not apparmor_boot.leftover_workdir
        # The chroot's binds lived in one `unshare --mount` in the guest: gone when it exited.
        assert doc["tree_mounts_after_load"] == [] and doc["tree_mounts_at_end"] == [], doc
        assert apparmor_boot.host_mounts == []
        # The parser tree in the cache is as the deps script left it: the guest's writes (the mount
        # points it made) went to its tmpfs upper layer, never to the host's cache.
        tree = Path(apparmor_boot.deps["parser_tree"])
        assert not (tree / "sys/kernel/security").exists() and not (tree / "proc").exists()
