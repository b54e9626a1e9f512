"""firejail end to end, through a launcher and a profile written from docs/launchers.md (issue 29).

firejail 0.9.72's `--read-only=/`, run as root, leaves a read-write rbind of / stacked on the task's
root directory and remounts the root mount beneath it read-only (fs_rdonly() binds "/" on "/", then
remounts "/", which names the task's root mount, not the bind on it: a path walk starts at fs->root
and crosses no mount stacked there, fs/namei.c path_init()). So:
- paths from "/" end in the read-only tree: the mask on {state}/db, {state} read-only, are KEPT;
  reading the mount table from the top of the stack at "/" called them BROKEN;
- but `..` arriving at the root directory crosses into the stack (follow_dotdot() + step_into()),
  so `/../{state}/db` shows the host's canary and `/../x` writes the host's /x: the aliases and
  write-surface witnesses are BROKEN, naming the mount at `/..`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from witness_cli import witness

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "tests" / "fixtures" / "firejail-launcher.sh"
PROFILE = REPO / "tests" / "fixtures" / "firejail.toml"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def firejail() -> str:
    path = shutil.which("firejail")
    if path is None:
        pytest.skip("no firejail on PATH (apt-get install firejail; scripts/test-tier-deps installs it)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    if "0.9.72" not in version.splitlines()[0]:
        pytest.skip(f"firejail {version.splitlines()[0]!r}: the stacked-root shape is pinned for 0.9.72")
    return path


def test_firejail_read_only_root_is_judged_from_the_tasks_own_root_mount(
    root_only: None, firejail: str, tmp_path: Path
) -> None:
    report = tmp_path / "r.json"
    done = witness(
        "--profile", str(PROFILE),
        "--launcher", f"{LAUNCHER} {{workdir}} {{user_tmp}} {{state}} --",
        "--json", str(report),
        timeout=180,
    )
    assert report.exists(), f"exit {done.returncode}: {done.stdout}{done.stderr[-2000:]}"
    promises = {p["promise"]: (p["verdict"], p["detail"]) for p in json.loads(report.read_text())["promises"]}
    # Judged from the task's own root (the read-only one): kept. Before, BROKEN from the stack on it.
    for kept in ("masked {state}/db", "read_only {state}", "read_only /usr", "writable {workdir}", "workdir"):
        assert promises[kept][0] == "kept", (kept, promises[kept], done.stdout)
    # And the stack on the root is no false alarm: `..` reaches it, with the host's canary and its /.
    verdict, detail = promises["aliases"]
    assert verdict == "BROKEN" and "/../" in detail and "canary" in detail, (verdict, detail)
    verdict, detail = promises["write_surface"]
    [host_root] = [ln.split(" - ")[1].split()[0] for ln in Path("/proc/1/mountinfo").read_text().splitlines()
                   if ln.split()[4] == "/"][-1:]
    assert verdict == "BROKEN" and f"'{host_root} " in detail and " at /..'" in detail, (verdict, detail)
    assert done.returncode == 1, done.stdout


# In a mount namespace of the test's own, a fresh host's shape: firejail's mounts (which an earlier
# root launch may have left in the host's table) unmounted there; then one launch through the
# adapter's prefix, and that namespace's mount points before and after.
FRESH_HOST_LAUNCH = r"""
awk '$5 ~ "^/run/firejail" {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "$m" || exit 3
done
cut -d' ' -f5 /proc/self/mountinfo | sort > "$1"
eval "$2 /bin/true" || exit 4
cut -d' ' -f5 /proc/self/mountinfo | sort > "$3"
"""


def test_a_root_launch_through_the_adapter_leaves_no_mount_behind(
    root_only: None, firejail: str, tmp_path: Path
) -> None:
    """firejail, run as root, leaves /run/firejail/dbus, firejail.ro.dir and firejail.ro.file mounted in
    its caller's namespace (issue 28): the adapter runs it in a private mount namespace of its own."""
    from sandbox_conformance.conformance.adapters import firejail as adapter

    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare (util-linux)")

    def place(m: re.Match[str]) -> str:
        d = tmp_path / "layout" / m[1]
        d.mkdir(parents=True, exist_ok=True)
        return str(d)

    prefix = re.sub(r"\{(\w+)\}", place, adapter.prefix())
    before, after = tmp_path / "before", tmp_path / "after"
    done = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "--",
         "sh", "-c", FRESH_HOST_LAUNCH, "sh", str(before), prefix, str(after)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    left = sorted(set(after.read_text().split()) - set(before.read_text().split()))
    assert left == [], f"mounts left in the launcher's namespace: {left}"
