"""`cgroup` / `cgroup.delegation`: fake hosts for every layout and ownership branch, the proof's
clean-up on failure, and the real host (hybrid here: delegation must not be supported, nothing left)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox_conformance.kernel import cgroupfs, mountinfo
from sandbox_conformance.kernel.cgroupfs import CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC, PROMISE_ENV, CgroupFs
from sandbox_conformance.probes import cgroup
from sandbox_conformance.probes.cgroup import RootState, blockers, decide_layout, fs_path, resolve_root
from sandbox_conformance.probes.finding import Verdict
from sandbox_conformance.probes.host import Host

HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED_MOUNTINFO = """\
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
"""
PROC_CGROUPS_HYBRID = """\
#subsys_name\thierarchy\tnum_cgroups\tenabled
cpu\t1\t1\t1
memory\t4\t35\t1
hugetlb\t0\t1\t1
"""
PROC_CGROUPS_UNIFIED = """\
#subsys_name\thierarchy\tnum_cgroups\tenabled
cpu\t0\t80\t1
memory\t0\t80\t1
pids\t0\t80\t1
"""
TMPFS_MAGIC = 0x01021994  # include/uapi/linux/magic.h: /sys/fs/cgroup on a hybrid or v1 host
INIT_CGROUPNS = f"cgroup:[{cgroupfs.PROC_CGROUP_INIT_INO}]"
TOP, UNI = "/sys/fs/cgroup", "/sys/fs/cgroup/unified"
USER_SVC = "/user.slice/user-1000.slice/user@1000.service"


def fake_statfs(root: Path, magic: dict[str, int]):
    """statfs seam: host-absolute path -> magic; anything else is an ordinary directory (ext4)."""
    def statfs(path: Path) -> int | None:
        path = Path(os.path.realpath(path))  # statfs(2) follows symlinks
        rel = "/" + os.path.relpath(path, os.path.realpath(root)).lstrip(".")
        rel = os.path.normpath(rel)
        for prefix in sorted(magic, key=len, reverse=True):
            if rel == prefix or rel.startswith(prefix.rstrip("/") + "/"):
                return magic[prefix]
        return 0xEF53 if path.exists() else None
    return statfs


def make_host(tmp_path: Path, *, mountinfo: str, own: str, proc_cgroups: str,
              env: dict[str, str] | None = None, euid: int = 0, cgroupns: str = INIT_CGROUPNS) -> Host:
    proc = tmp_path / "proc"
    (proc / "self/ns").mkdir(parents=True)
    (proc / "self/mountinfo").write_text(mountinfo)
    (proc / "self/cgroup").write_text(f"4:memory:/\n0::{own}\n")
    (proc / "cgroups").write_text(proc_cgroups)
    os.symlink(cgroupns, proc / "self/ns/cgroup")
    return Host(root=tmp_path, proc=proc, sys=tmp_path / "sys", env=env or {}, euid=euid)


def cg_dir(path: Path, controllers: str = "", subtree: str = "", *, machine_root: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if not machine_root:
        (path / "cgroup.type").write_text("domain\n")  # every cgroup but the kernel's root has one
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(subtree + "\n")
    (path / "cgroup.procs").write_text("")
    return path


class PlainFs(CgroupFs):
    """A plain directory tree: no kernel populates a child, but rmdir removes one that holds files."""

    def rmdir(self, path: Path) -> None:
        shutil.rmtree(path)


class KernelLikeFs(PlainFs):
    """What cgroupfs does and a plain fs does not: mkdir populates memory.max (the parent enabled
    memory), rmdir removes a cgroup despite its interface files."""

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)
        (path / "cgroup.type").write_text("domain\n")
        (path / "memory.max").write_text("max\n")


# --- layout ---------------------------------------------------------------------------------------

def test_hybrid_layout_is_tmpfs_at_the_top_with_cgroup2_at_unified_and_v1_hierarchies():
    mounts = mountinfo.parse(HYBRID_MOUNTINFO)
    layout = decide_layout(mounts, {TOP: TMPFS_MAGIC, UNI: CGROUP2_SUPER_MAGIC})
    assert layout.name == "hybrid"
    assert layout.v2_mount is not None and layout.v2_mount.mount_point == "/sys/fs/cgroup/unified"
    assert layout.conflicts == ()


def test_unified_layout_is_cgroup2_at_sys_fs_cgroup():
    layout = decide_layout(mountinfo.parse(UNIFIED_MOUNTINFO), {"/sys/fs/cgroup": CGROUP2_SUPER_MAGIC})
    assert layout.name == "unified"
    assert layout.v2_mount.mount_point == "/sys/fs/cgroup"


def test_v1_only_layout_has_no_v2_mount():
    v1 = "\n".join(line for line in HYBRID_MOUNTINFO.splitlines() if "cgroup2" not in line)
    layout = decide_layout(mountinfo.parse(v1), {TOP: TMPFS_MAGIC, UNI: None})
    assert (layout.name, layout.v2_mount) == ("v1", None)


def test_no_cgroup_mounts_is_layout_none():
    assert decide_layout([], {"/sys/fs/cgroup": None}).name == "none"


def test_a_cgroup2_mount_statfs_contradicts_is_a_conflict_not_believed():
    layout = decide_layout(mountinfo.parse(HYBRID_MOUNTINFO),
                           {"/sys/fs/cgroup": TMPFS_MAGIC, "/sys/fs/cgroup/unified": TMPFS_MAGIC})
    assert layout.name == "v1"
    assert any("statfs says 0x1021994" in c for c in layout.conflicts)


def test_mountinfo_octal_escapes_are_decoded():
    (m,) = mountinfo.parse(r"41 31 0:38 / /mnt/my\040cgroup rw - cgroup2 cgroup2 rw")
    assert m.mount_point == "/mnt/my cgroup"


# --- own cgroup and the resolved root -------------------------------------------------------------

@pytest.mark.parametrize(("own", "root"), [
    ("/system.slice/agent.service/worker/leaf", "/system.slice/agent.service"),
    (f"{USER_SVC}/app.slice/run-u7.scope/inner", f"{USER_SVC}/app.slice/run-u7.scope"),
    (f"{USER_SVC}/app.slice", USER_SVC),
    ("/user.slice/user-1000.slice/session-3.scope", "/user.slice/user-1000.slice/session-3.scope"),
    ("/docker/0123abcd", "/docker/0123abcd"),
    ("/", "/"),
])
def test_the_root_is_truncated_at_the_innermost_service_or_scope(own, root):
    assert resolve_root(own) == root


def test_own_cgroup_comes_from_the_0_line_only():
    assert cgroupfs.own_cgroup("9:name=systemd:/x\n4:memory:/y\n0::/system.slice/a.service\n") == \
        "/system.slice/a.service"
    assert cgroupfs.own_cgroup("4:memory:/y\n") is None


def test_this_hosts_own_cgroup_line_is_read():
    text = Path("/proc/self/cgroup").read_text()
    has_v2_line = any(line.startswith("0::") for line in text.splitlines())
    assert (cgroupfs.own_cgroup(text) is not None) == has_v2_line


def test_a_bind_mounted_subtree_maps_only_the_cgroups_it_shows():
    (m,) = mountinfo.parse("30 23 0:26 /system.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw")
    assert fs_path(m, "/system.slice/a.service") == "/sys/fs/cgroup/a.service"
    assert fs_path(m, "/user.slice/x") is None


def test_service_truncation_on_a_fake_unified_host(tmp_path):
    host = make_host(tmp_path, mountinfo=UNIFIED_MOUNTINFO, own="/system.slice/agent.service/worker",
                     proc_cgroups=PROC_CGROUPS_UNIFIED)
    cg_dir(tmp_path / "sys/fs/cgroup", "cpu memory pids", "cpu memory pids", machine_root=True)
    cg_dir(tmp_path / "sys/fs/cgroup/system.slice/agent.service", "cpu memory pids", "memory")
    statfs = fake_statfs(tmp_path, {"/sys/fs/cgroup": CGROUP2_SUPER_MAGIC})
    cg, deleg = cgroup.probe(host, statfs=statfs)
    assert cg.verdict is Verdict.supported
    assert cg.facts["layout"] == "unified"
    assert cg.facts["own"] == "/system.slice/agent.service/worker"
    assert cg.facts["root"] == "/sys/fs/cgroup/system.slice/agent.service"
    assert cg.facts["controllers_available"] == ["cpu", "memory", "pids"]
    assert cg.facts["controllers_enabled"] == ["memory"]
    # root with no delegate mark: access() proves nothing for uid 0, so nothing is written.
    assert deleg.verdict is Verdict.unsupported
    assert "delegate" in deleg.reason
    assert not [p for p in (tmp_path / "sys").rglob("sbxc-proof-*")]


def test_scope_truncation_and_a_delegated_scope_passes_the_proof(tmp_path):
    own = f"{USER_SVC}/app.slice/run-u7.scope/inner"
    host = make_host(tmp_path, mountinfo=UNIFIED_MOUNTINFO, own=own, proc_cgroups=PROC_CGROUPS_UNIFIED,
                     euid=1000 if os.geteuid() != 0 else 0)
    scope = cg_dir(tmp_path / f"sys/fs/cgroup{USER_SVC}/app.slice/run-u7.scope", "memory pids", "memory")
    try:
        os.setxattr(scope, "user.delegate", b"1")
    except OSError as e:
        pytest.skip(f"tmp_path cannot hold a user.* xattr ({e.strerror}): the delegate mark cannot be faked")
    statfs = fake_statfs(tmp_path, {"/sys/fs/cgroup": CGROUP2_SUPER_MAGIC})
    cg, deleg = cgroup.probe(host, statfs=statfs, fs=KernelLikeFs())
    assert cg.facts["root"].endswith("/app.slice/run-u7.scope")
    assert deleg.verdict is Verdict.supported, deleg.reason
    assert deleg.facts["root"] == cg.facts["root"]
    assert deleg.facts["promised"] is False
    assert deleg.evidence["proof.memory.max"] == str(cgroupfs.PROOF_LIMIT)
    assert deleg.evidence["proof.cleanup"] == "removed"
    assert not list(scope.glob("sbxc-proof-*"))


# --- hybrid, like this host -----------------------------------------------------------------------

def hybrid_host(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[Host, object]:
    host = make_host(tmp_path, mountinfo=HYBRID_MOUNTINFO, own="/", proc_cgroups=PROC_CGROUPS_HYBRID, env=env)
    cg_dir(tmp_path / "sys/fs/cgroup/unified", "hugetlb", "", machine_root=True)
    (tmp_path / "sys/fs/cgroup/memory").mkdir(parents=True)
    statfs = fake_statfs(tmp_path, {TOP: TMPFS_MAGIC, UNI: CGROUP2_SUPER_MAGIC,
                                    "/sys/fs/cgroup/memory": CGROUP_SUPER_MAGIC})
    return host, statfs


def test_hybrid_host_has_cgroup2_but_no_delegation_and_says_memory_is_on_v1(tmp_path):
    host, statfs = hybrid_host(tmp_path)
    cg, deleg = cgroup.probe(host, statfs=statfs)
    assert (cg.verdict, cg.facts["layout"]) == (Verdict.supported, "hybrid")
    assert cg.facts["root"] == "/sys/fs/cgroup/unified"
    assert "memory" in cg.facts["v1_controllers"]
    assert deleg.verdict is Verdict.unsupported
    assert deleg.facts["root"] is None
    assert "machine's root cgroup" in deleg.reason
    assert "memory is bound to a cgroup v1 hierarchy" in deleg.reason
    assert sorted(p.name for p in (tmp_path / "sys/fs/cgroup/unified").iterdir()) == \
        ["cgroup.controllers", "cgroup.procs", "cgroup.subtree_control"]


def test_a_symlink_to_the_hierarchy_root_is_still_the_hierarchy_root(tmp_path):
    host, statfs = hybrid_host(tmp_path, env={PROMISE_ENV: "/srv/innocent"})
    (tmp_path / "srv").mkdir()
    os.symlink(tmp_path / "sys/fs/cgroup/unified", tmp_path / "srv/innocent")
    (tmp_path / "sys/fs/cgroup/unified/cgroup.controllers").write_text("memory\n")
    _, deleg = cgroup.probe(host, statfs=statfs, fs=KernelLikeFs())
    assert deleg.verdict is Verdict.denied
    assert "machine's root cgroup" in deleg.reason
    assert not list(tmp_path.rglob("sbxc-proof-*"))


# --- the promise ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("promised", "named"), [
    ("/srv/not-a-cgroup", "not on a cgroup2 filesystem"),
    ("/sys/fs/cgroup/memory", "a cgroup v1 hierarchy"),
    ("/sys/fs/cgroup/unified/missing", "does not exist"),
    ("/sys/fs/cgroup/unified", "the machine's root cgroup"),
    ("relative/path", "not an absolute path"),
])
def test_a_broken_promise_is_denied_naming_what_failed(tmp_path, promised, named):
    (tmp_path / "srv/not-a-cgroup").mkdir(parents=True)
    host, statfs = hybrid_host(tmp_path, env={PROMISE_ENV: promised})
    _, deleg = cgroup.probe(host, statfs=statfs)
    assert deleg.verdict is Verdict.denied
    assert deleg.facts["promised"] is True
    assert named in deleg.reason
    assert deleg.reason.startswith(PROMISE_ENV)
    assert not list(tmp_path.rglob("sbxc-proof-*"))


def test_a_promised_root_without_memory_is_denied_not_skipped(tmp_path):
    host, statfs = hybrid_host(tmp_path, env={PROMISE_ENV: "/sys/fs/cgroup/unified/sbxc"})
    cg_dir(tmp_path / "sys/fs/cgroup/unified/sbxc", "pids", "pids")
    _, deleg = cgroup.probe(host, statfs=statfs, fs=KernelLikeFs())
    assert deleg.verdict is Verdict.denied
    assert "no memory controller available" in deleg.reason


def test_a_kept_promise_is_proved_and_the_child_removed(tmp_path):
    host, statfs = hybrid_host(tmp_path, env={PROMISE_ENV: "/sys/fs/cgroup/unified/sbxc"})
    root = cg_dir(tmp_path / "sys/fs/cgroup/unified/sbxc", "memory pids", "memory")
    _, deleg = cgroup.probe(host, statfs=statfs, fs=KernelLikeFs())
    assert deleg.verdict is Verdict.supported, deleg.reason
    assert deleg.facts == {"root": "/sys/fs/cgroup/unified/sbxc", "promised": True,
                           "candidate": "/sys/fs/cgroup/unified/sbxc"}
    assert not list(root.glob("sbxc-proof-*"))


def test_the_proof_child_is_removed_even_when_the_write_fails(tmp_path):
    root = cg_dir(tmp_path / "cg", "memory", "memory")

    class BrokenFs(PlainFs):
        def mkdir(self, path: Path) -> None:
            os.mkdir(path)
            (path / "memory.max").mkdir()  # the write will fail with EISDIR

    proof = cgroupfs.prove(root, ["memory"], BrokenFs())
    assert not proof.ok
    assert "EISDIR" in proof.what
    assert proof.evidence["proof.cleanup"] == "removed" and proof.leftover is None
    assert not list(root.glob("sbxc-proof-*"))


def test_a_missing_memory_max_is_not_created_by_the_proof(tmp_path):
    # On a plain directory (no kernel to populate the child), the proof must fail rather than create
    # memory.max as an ordinary file and call that a pass.
    root = cg_dir(tmp_path / "cg", "memory", "memory")
    proof = cgroupfs.prove(root, ["memory"], PlainFs())
    assert not proof.ok and "ENOENT" in proof.what
    assert proof.evidence["proof.cleanup"] == "removed"


def test_a_child_the_proof_cannot_remove_is_reported_as_left_over(tmp_path):
    root = cg_dir(tmp_path / "cg", "memory", "memory")

    class StuckFs(KernelLikeFs):
        def rmdir(self, path: Path) -> None:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))

    proof = cgroupfs.prove(root, ["memory"], StuckFs())
    assert proof.ok  # the limit was proved; what is left is said, not hidden
    assert proof.leftover is not None and "EBUSY" in proof.leftover
    assert proof.evidence["proof.cleanup"].startswith("FAILED to remove")


def test_a_root_the_proof_could_not_clean_up_after_is_no_delegated_root(tmp_path):
    # The probe must not call a root `supported` that `run` then refuses (runners/cgroup_setup.py):
    # what the proof left there stays in the verdict, not only in the evidence.
    host, statfs = hybrid_host(tmp_path, env={PROMISE_ENV: "/sys/fs/cgroup/unified/sbxc"})
    cg_dir(tmp_path / "sys/fs/cgroup/unified/sbxc", "memory pids", "memory")

    class StuckFs(KernelLikeFs):
        def rmdir(self, path: Path) -> None:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))

    _, deleg = cgroup.probe(host, statfs=statfs, fs=StuckFs())
    assert deleg.verdict is Verdict.denied, deleg.reason
    assert deleg.facts["root"] is None
    assert "could not clean up" in deleg.reason and "EBUSY" in deleg.reason


def test_failing_to_enable_memory_for_children_creates_nothing(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.subtree_control").mkdir()  # open(O_WRONLY) -> EISDIR, like a refused write
    proof = cgroupfs.prove(root, [], KernelLikeFs())
    assert not proof.ok and proof.what.startswith("cannot enable memory for children")
    assert not list(root.glob("sbxc-proof-*"))


# --- ownership decisions (pure) -------------------------------------------------------------------

def state(**kw) -> RootState:
    base = dict(path="/sys/fs/cgroup/x.service", promised=False, exists=True, is_dir=True,
                magic=CGROUP2_SUPER_MAGIC, hierarchy_root=False, initial_cgroupns=True,
                writable={".": True, "cgroup.procs": True, "cgroup.subtree_control": True},
                machine_root=False, delegate_xattr=None, controllers=("memory",), subtree_control=())
    base.update(kw)
    return RootState(**base)


def test_root_needs_a_mark_because_access_proves_nothing_for_uid_0():
    assert any("trusted.delegate" in b for b in blockers(state(), 0, []))
    assert blockers(state(delegate_xattr="trusted.delegate=1"), 0, []) == []
    assert blockers(state(promised=True), 0, []) == []


def test_an_unprivileged_user_needs_write_access_to_procs_and_subtree_control():
    assert blockers(state(), 1000, []) == []
    procs_ro = {".": True, "cgroup.procs": False, "cgroup.subtree_control": True}
    found = blockers(state(writable=procs_ro), 1000, [])
    assert found == ["cgroup.procs of /sys/fs/cgroup/x.service not writable by uid 1000"]


def test_the_root_of_our_own_cgroup_namespace_is_ours_but_the_hosts_is_not():
    assert blockers(state(hierarchy_root=True, initial_cgroupns=False), 0, []) == []
    assert any("nobody delegates" in b for b in blockers(state(hierarchy_root=True, promised=True), 0, []))
    # Not even a private cgroup namespace makes the kernel's own root cgroup ours.
    machine = state(hierarchy_root=True, initial_cgroupns=False, machine_root=True, promised=True)
    assert any("machine's root cgroup" in b for b in blockers(machine, 0, []))


# --- the real host --------------------------------------------------------------------------------

def fstype(path: str) -> str:
    """Independent oracle: coreutils' stat, not our ctypes statfs."""
    done = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True, timeout=10)
    return done.stdout.strip() if done.returncode == 0 else "absent"


def cgroup_tree_snapshot() -> set[str]:
    out = set()
    for top in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory", "/sys/fs/cgroup"):
        if os.path.isdir(top):
            for dirpath, dirnames, _ in os.walk(top):
                out.update(os.path.join(dirpath, d) for d in dirnames)
    return out


@pytest.mark.integration
def test_the_real_host_layout_matches_stat_and_delegation_is_not_supported_on_hybrid():
    top, unified = fstype("/sys/fs/cgroup"), fstype("/sys/fs/cgroup/unified")
    expected = "unified" if top == "cgroup2fs" else ("hybrid" if unified == "cgroup2fs" else "v1")
    before = cgroup_tree_snapshot()
    cg, deleg = cgroup.probe(Host(env={}))
    after = cgroup_tree_snapshot()
    assert cg.facts["layout"] == expected
    assert after == before, f"left behind: {sorted(after - before)}"
    if expected != "hybrid":
        pytest.skip(f"this host is {expected}; the hybrid assertions are for the hybrid machine")
    memory_on_v1 = "memory" in cgroupfs.v1_bound_controllers(Path("/proc/cgroups").read_text())
    assert memory_on_v1
    assert deleg.verdict is Verdict.unsupported
    assert "memory is bound to a cgroup v1 hierarchy" in deleg.reason


@pytest.mark.integration
@pytest.mark.parametrize("promised", ["/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory", "/nonexistent/cg"])
def test_the_real_host_denies_a_broken_promise_and_writes_nothing(promised):
    if fstype("/sys/fs/cgroup") == "cgroup2fs":
        pytest.skip("these promised paths describe the hybrid layout")
    before = cgroup_tree_snapshot()
    _, deleg = cgroup.probe(Host(env={PROMISE_ENV: promised}))
    assert cgroup_tree_snapshot() == before
    assert deleg.verdict is Verdict.denied
    assert promised in deleg.reason
