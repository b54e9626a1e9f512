"""`sandbox-conformance matrix` end to end, and each new adapter's end-to-end test read from it.

The matrix runs once per session (the `matrix` fixture: the same command docs/matrix.md names, every
sandbox as root and as the test user, about 40 s here), and every adapter test below reads its
column: one witness run per sandbox and user, not one per test. docs/matrix.md must have the same
table (rows, columns, cells) as that fresh run: a stale table fails."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sandbox_conformance.commands import matrix as mx
from sandbox_conformance.conformance.adapters import nspawn

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "matrix.md"
BEGIN, END = "<!-- matrix:table -->", "<!-- /matrix:table -->"
# The session's one matrix run (~40-70 s) is paid by whichever of its tests pytest-randomly runs first.
pytestmark = pytest.mark.timeout(900)


@dataclasses.dataclass(frozen=True)
class Run:
    code: int
    doc: Mapping[str, Any]
    stdout: str
    stderr: str
    residue: Mapping[str, list[str]]


def cgroup_dirs() -> set[str]:
    out = set()
    for top in Path("/sys/fs/cgroup").iterdir():
        if top.is_dir():
            out |= {str(p) for p in top.glob("*") if p.is_dir()}
    return out


def residue_now() -> dict[str, set[str]]:
    """What the new adapters could leave: workspaces, engine processes, nspawn's hierarchies."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    procs = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                comm = (p / "comm").read_text().strip()
                state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and comm in ("podman", "podman pause", "conmon", "runsc", "runsc-gofer",
                                         "runsc-sandbox", "systemd-nspawn", "firejail"):
                procs.add(f"{p.name} {comm}")
    # podman's and crun's default state, which the adapters move into their workspaces.
    defaults = {str(p) for p in (Path("/run/crun"), Path("/run/libpod"), Path("/run/containers"),
                                 Path("/var/lib/containers/storage"),
                                 Path("/home/sbxc-test/.local/share/containers")) if p.exists()}
    return {
        "defaults": defaults,
        "dirs": {p.name for p in tmp.glob("sbxc-pm-*")} | {p.name for p in tmp.glob("sbxc-oci-*")}
        | {p.name for p in tmp.glob("sbxc-nspawn-*")} | {p.name for p in tmp.glob("sbxc-matrix-*")},
        "processes": procs,
        "hierarchies": {ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if "sbxc" in ln},
        "cgroups": cgroup_dirs(),
    }


@pytest.fixture(scope="session")
def matrix(root_only: None, test_user: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("matrix")
    before = residue_now()
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "matrix", "--as-user", test_user,
         "--json", str(out / "matrix.json"), "--reports", str(out / "reports")],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert (out / "matrix.json").exists(), (
        f"exit {done.returncode}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    after = residue_now()
    left = {k: sorted(after[k] - before[k]) for k in after}
    return Run(done.returncode, json.loads((out / "matrix.json").read_text()), done.stdout, done.stderr, left)


def column(run: Run, sandbox: str, user: str | None) -> tuple[Mapping[str, Any], dict[str, dict[str, str]]]:
    cid = sandbox if user is None else f"{sandbox}@{user}"
    [col] = [c for c in run.doc["columns"] if c["id"] == cid]
    return col, {r["promise"]: r["cells"][cid] for r in run.doc["rows"]}


def ran(run: Run, sandbox: str, user: str | None) -> tuple[Mapping[str, Any], dict[str, dict[str, str]]]:
    """The column, or a skip with its reason where the tool is not on this host."""
    col, cells = column(run, sandbox, user)
    if col["summary"] is None:
        pytest.skip(f"{col['id']}: did not run: {col['reason']}")
    return col, cells


def report(col: Mapping[str, Any]) -> dict[str, Any]:
    return dict(json.loads(Path(col["report"]).read_text()))


def claimed(cells: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    return {p: c["verdict"] for p, c in cells.items() if c["verdict"] != mx.NOT_CLAIMED}


def every_claim_kept(col: Mapping[str, Any], cells: Mapping[str, Mapping[str, str]]) -> None:
    bad = {p: c for p, c in cells.items() if c["verdict"] in (mx.BROKEN, mx.NOT_TESTED, mx.DID_NOT_RUN)
           and not c["detail"].startswith("no cgroup leaf")}
    assert not bad, f"{col['id']}: {bad}"
    assert col["exit"] == 0, col


# ---- the matrix itself ---------------------------------------------------------------------------


def table_block(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[lines.index(BEGIN) + 1 : lines.index(END)]


@pytest.mark.integration
def test_docs_matrix_is_the_table_of_a_fresh_run(matrix: Run) -> None:
    fresh = table_block(mx.render_markdown(matrix.doc))
    shipped = table_block(DOC.read_text())
    if fresh != shipped:
        changed = [f"-{a}\n+{b}" for a, b in zip(shipped, fresh, strict=False) if a != b][:5]
        pytest.fail(
            "docs/matrix.md is stale (regenerate it as root: .venv/bin/sandbox-conformance matrix "
            "--as-user sbxc-test --markdown docs/matrix.md):\n" + "\n".join(changed)
            + ("" if len(fresh) == len(shipped) else f"\n({len(shipped)} rows shipped, {len(fresh)} now)")
        )


@pytest.mark.integration
def test_no_sandbox_breaks_what_its_shipped_profile_claims_so_the_matrix_exits_0(matrix: Run) -> None:
    assert matrix.code == 0 == matrix.doc["exit"], matrix.stdout[-3000:]
    assert matrix.stdout.rstrip().endswith(": PASS"), matrix.stdout[-500:]
    broken = [(r["promise"], cid) for r in matrix.doc["rows"] for cid, c in r["cells"].items()
              if c["verdict"] == mx.BROKEN]
    assert not broken, broken


@pytest.mark.integration
def test_the_matrix_leaves_nothing_behind(matrix: Run) -> None:
    # Workspaces, podman's pause process and conmon, runsc's sandbox and gofer, nspawn's private
    # cgroup hierarchies, and no new cgroup anywhere in the host's trees.
    assert not any(matrix.residue.values()), matrix.residue


@pytest.mark.integration
def test_the_matrix_document_validates_against_its_schema(matrix: Run) -> None:
    import jsonschema

    text = (REPO / "conformance" / "schemas" / "matrix-report.schema.json").read_text()
    jsonschema.Draft202012Validator(json.loads(text)).validate(matrix.doc)


@pytest.mark.integration
def test_each_column_keeps_its_witness_report_one_step_away(matrix: Run) -> None:
    for col in matrix.doc["columns"]:
        if col["summary"] is None:
            assert col["report"] is None and col["reason"], col
            continue
        rep = report(col)
        assert rep["summary"] == col["summary"], col["id"]
        assert Path(col["junit"]).exists(), col


# ---- the new adapters, end to end, read from their columns --------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("user", [None, "sbxc-test"], ids=["root", "unprivileged"])
def test_podman_keeps_every_promise_of_its_profile_rootful_and_rootless(
    matrix: Run, user: str | None
) -> None:
    col, cells = ran(matrix, "podman", user)
    every_claim_kept(col, cells)
    # Rootless podman's pause process is the launch's own helper: the adapter stops it, so nothing
    # outlives the launcher, and the lifecycle launch's guardian removes the container.
    assert cells["leftovers"]["verdict"] == cells["lifecycle"]["verdict"] == mx.KEPT
    # Its default seccomp profile lets CLONE_NEWUSER through (measured): not claimed, with no reason
    # needed in not_claimed (a profile that does not promise it).
    assert cells["nested_userns"]["verdict"] == mx.NOT_CLAIMED
    [task] = report(col)["tasks"]
    assert task["observations"]["hostname"] == "sbxc-task"


@pytest.mark.integration
@pytest.mark.parametrize("user", [None, "sbxc-test"], ids=["root", "unprivileged"])
def test_firejail_keeps_every_promise_of_its_profile(matrix: Run, user: str | None) -> None:
    col, cells = ran(matrix, "firejail", user)
    every_claim_kept(col, cells)
    assert cells["hidden {state}/db"]["verdict"] == mx.KEPT
    for why in ("terminal", "secrets", "host_sockets"):
        # Disclaimed with what the task did, in the profile's [promises] not_claimed.
        assert cells[why]["verdict"] == mx.NOT_CLAIMED and cells[why]["detail"] != mx.UNSAID, cells[why]


@pytest.mark.integration
@pytest.mark.parametrize("user", [None, "sbxc-test"], ids=["root", "unprivileged"])
def test_runsc_is_judged_from_the_tasks_view_where_the_host_cannot_see_it(
    matrix: Run, user: str | None
) -> None:
    col, cells = ran(matrix, "runsc", user)
    assert col["exit"] == 0 and col["summary"]["broken"] == 0, col
    # The adapter sets --host-cannot-observe: what only the host can judge is not tested, with why.
    for promise in ("capabilities", "write_surface", "kernel_view"):
        assert cells[promise]["verdict"] == mx.NOT_TESTED, (promise, cells[promise])
        assert "the host cannot observe this task (gVisor" in cells[promise]["detail"]
    # What the task shows by its own behaviour is judged: writes refused, the network, the binds, and
    # from its view alone the secret, the host's processes, its shared memory, what the task opened.
    assert cells["read_only /usr"]["verdict"] == cells["pid"]["verdict"] == "kept, partly"
    for promise in ("secrets", "environment", "ipc", "uts", "devices", "host_sockets"):
        assert cells[promise]["verdict"] == mx.TASK_VIEW, (promise, cells[promise])
    for promise in ("writable {workdir}", "control", "absent {other_user}", "nested_userns"):
        assert cells[promise]["verdict"] == mx.KEPT, (promise, cells[promise])
    [task] = report(col)["tasks"]
    assert task["observations"]["hostname"] == "sbxc-task"


@pytest.mark.integration
def test_nspawn_keeps_every_promise_of_its_profile_as_root(matrix: Run) -> None:
    col, cells = ran(matrix, "nspawn", None)
    every_claim_kept(col, cells)
    assert cells["masked {state}/db"]["verdict"] == cells["lifecycle"]["verdict"] == mx.KEPT


@pytest.mark.integration
def test_nspawn_as_a_user_did_not_run_and_says_why_once(matrix: Run) -> None:
    col, cells = column(matrix, "nspawn", "sbxc-test")
    if "not installed" in col["reason"]:
        pytest.skip(col["reason"])
    # The launcher exits 75 (docs/launchers.md): the witness run says "did not run" once, exit 75.
    assert col["exit"] == 75 and col["summary"] is None, col
    assert nspawn.NEED_ROOT in col["reason"], col["reason"]
    assert {c["verdict"] for c in cells.values()} == {mx.DID_NOT_RUN}


@pytest.mark.integration
@pytest.mark.parametrize("user", [None, "sbxc-test"], ids=["root", "unprivileged"])
def test_bubblewrap_0_12_runs_the_reference_sandbox_and_keeps_it(matrix: Run, user: str | None) -> None:
    col, cells = ran(matrix, "bwrap-0.12", user)
    assert col["version"] == "bubblewrap 0.12.0", col
    every_claim_kept(col, cells)
    _ref, ref_cells = column(matrix, "reference", user)
    # The same witness set, promise for promise, as the host's bubblewrap.
    assert {p: c["verdict"] for p, c in cells.items()} == {p: c["verdict"] for p, c in ref_cells.items()}


@pytest.mark.integration
def test_runsc_under_the_oci_profile_breaks_the_mask_runc_keeps_and_the_matrix_exits_1(
    root_only: None, tmp_path: Path
) -> None:
    """One --profile for every column: gVisor 20221219 ignores the bundle's maskedPaths on a bound
    path, which crun keeps (measured): runsc.toml does not claim it, oci.toml does."""
    out = tmp_path / "m.json"
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "matrix", "--sandboxes", "crun,runsc",
         "--profile", str(REPO / "conformance" / "adapters" / "oci.toml"), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    run = Run(done.returncode, json.loads(out.read_text()), done.stdout, done.stderr, {})
    _, cells = ran(run, "runsc", None)
    _, crun_cells = ran(run, "crun", None)
    assert done.returncode == 1 == run.doc["exit"], done.stdout[-2000:]
    mask = cells["masked {state}/db"]
    assert mask["verdict"] == mx.BROKEN and "canary" in mask["detail"], mask
    assert crun_cells["masked {state}/db"]["verdict"] == mx.KEPT
    assert "BROKEN in ['runsc']" in done.stdout


# ---- the adapters' choices, without sandboxes ---------------------------------------------------


def test_the_podman_flags_copy_nothing_into_its_masks_and_touch_no_cgroup(tmp_path: Path) -> None:
    from sandbox_conformance.conformance.adapters import podman

    flags = podman.run_flags(tmp_path)
    mounts = [f for f in flags if f.startswith("type=tmpfs,")]
    assert mounts and all(",ro,notmpcopyup" in m for m in mounts), mounts
    assert "--cgroups=disabled" in flags and flags[-2:] == ["--rootfs", str(tmp_path / "rootfs")]
    engine = podman.engine_argv(tmp_path)
    for opt in ("--root", "--runroot", "--tmpdir"):
        assert engine[engine.index(opt) + 1].startswith(str(tmp_path)), (opt, engine)
    assert Path(engine[engine.index("--runtime") + 1]).name == "crun"  # podman checks it by name


def test_the_firejail_adapter_never_stacks_a_read_only_root() -> None:
    from sandbox_conformance.conformance.adapters import firejail

    assert "--read-only=/" not in firejail.FLAGS and "--private-dev" in firejail.FLAGS


def test_a_sandbox_whose_version_hangs_is_unavailable_with_why_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--version` was run with subprocess.run: a hang raised TimeoutExpired through `witness --adapter`'s
    # input check, and killed the leader only.
    from sandbox_conformance.conformance.adapters import _unavailable, bwrap_versions, firejail

    for name in ("firejail", "bwrap"):
        (tmp_path / name).write_text("#!/bin/sh\nsleep 60\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(firejail, "VERSION_TIMEOUT", 0.5)
    monkeypatch.setattr(bwrap_versions, "VERSION_TIMEOUT", 0.5)
    with pytest.raises(_unavailable.Unavailable, match=r"--version gave no version \(within 0.5 s\)"):
        firejail.prefix()
    assert bwrap_versions.version(tmp_path / "bwrap") is None


def test_the_runsc_adapter_says_why_the_host_cannot_observe_its_tasks() -> None:
    from sandbox_conformance.conformance import adapters
    from sandbox_conformance.conformance.adapters import oci

    argv = oci.runtime_argv("runsc", Path("/state"), "run")
    assert {"--ignore-cgroups", "--network=none", "--oci-seccomp"} <= set(argv), argv
    r = adapters.Resolved("runsc", Path("x.toml"), "L", adapters.GVISOR_UNSEEN)
    args = r.witness_args()
    assert args[args.index("--host-cannot-observe") + 1] == adapters.GVISOR_UNSEEN
    assert "--host-cannot-observe" not in adapters.Resolved("crun", Path("x.toml"), "L").witness_args()


def test_the_nspawn_adapter_refuses_a_user_with_75s_reason() -> None:
    if shutil.which("systemd-nspawn") is None:
        pytest.skip("systemd-nspawn not installed (apt-get install systemd-container)")
    assert nspawn.unavailable(euid=1001) == nspawn.NEED_ROOT


# ---- the command's contract, without sandboxes ----------------------------------------------------


def outcome(promises: list[tuple[str, str, str]], code: int = 0) -> mx.Outcome:
    return mx.Outcome(code, {"promises": [{"promise": p, "verdict": v, "detail": d} for p, v, d in promises],
                             "summary": {"kept": 0, "broken": 0, "not_tested": 0}})


@pytest.mark.parametrize(
    ("outcomes", "code"),
    [
        ([outcome([("pid", "kept", "")])], 0),
        ([outcome([("pid", "BROKEN", "x")], 1), outcome([("pid", "kept", "")])], 1),
        ([mx.Outcome(None, None, "no tool"), mx.Outcome(75, None, "needs root")], 75),
        ([mx.Outcome(None, None, "no tool"), outcome([("pid", "kept", "")])], 0),
        ([mx.Outcome(1, None, "exit 1, no report")], 1),  # a run without a verdict is a failure
    ],
    ids=["kept", "broken", "nothing-ran", "some-did-not-run", "no-report"],
)
def test_the_exit_code_follows_what_the_columns_did(outcomes: list[mx.Outcome], code: int) -> None:
    assert mx.exit_code(outcomes) == code


def test_a_cell_is_each_of_the_five_verdicts() -> None:
    o = outcome([("pid", "kept", ""), ("ipc", "BROKEN", "shared"), ("uts", "not tested", "skip"),
                 ("network", "kept", "partly: the host cannot observe this task")])
    assert mx.cell("pid", o, {}) == ("kept", "")
    assert mx.cell("ipc", o, {}) == ("BROKEN", "shared")
    assert mx.cell("uts", o, {}) == ("not tested", "skip")
    assert mx.cell("network", o, {})[0] == "kept, partly"
    assert mx.cell("secrets", o, {"secrets": "passes env"}) == ("not claimed", "passes env")
    assert mx.cell("secrets", o, {}) == ("not claimed", mx.UNSAID)
    assert mx.cell("pid", mx.Outcome(75, None, "needs root"), {}) == ("did not run", "needs root")
    assert mx.cell("pid", mx.Outcome(1, None, "exit 1"), {})[0] == "not tested"


def test_every_format_carries_the_same_table() -> None:
    cols = [mx.Column("a", None, version="a 1"), mx.Column("b", "u", version="b 2")]
    outs = [outcome([("pid", "kept", ""), ("ipc", "BROKEN", "shared ipc")], 1),
            mx.Outcome(75, None, "b needs root")]
    doc = mx.document(cols, outs, None)
    assert [c["id"] for c in doc["columns"]] == ["a", "b@u"]
    assert mx.table(doc) == [["promise", "a", "b (u)"], ["pid", "kept", "did not run"],
                             ["ipc", "BROKEN", "did not run"]]
    md = mx.render_markdown(doc)
    assert table_block(md) == ["| promise | a | b (u) |", "|---|---|---|", "| pid | kept | did not run |",
                               "| ipc | BROKEN | did not run |"]
    assert "- **a**, `ipc`: BROKEN: shared ipc" in md and "b needs root" in md
    text = mx.render_text(doc)
    assert "a: ipc: BROKEN: shared ipc" in text and text.rstrip().endswith(": FAIL")
    import xml.etree.ElementTree as ET

    suites = ET.fromstring(mx.junit(doc))
    a = suites.find("testsuite[@name='a']")
    assert a is not None and a.get("failures") == "1" and a.get("tests") == "2"
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.parametrize(
    "argv",
    [["--sandboxes", "no-such"], ["--jobs", "3"], ["--timeout", "0"], ["--profile", "/nonexistent.toml"],
     ["--json", "/nonexistent-dir/m.json"]],
    ids=["unknown-sandbox", "too-many-jobs", "no-timeout", "no-profile", "no-directory"],
)
def test_bad_input_is_exit_2_in_one_line(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "sandbox_conformance", "matrix", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_nothing_that_could_run_is_exit_75() -> None:
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd is PID 1 here: the systemd-run adapter can run")
    done = subprocess.run([sys.executable, "-m", "sandbox_conformance", "matrix", "--sandboxes",
                           "systemd-run"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 75, done.stdout + done.stderr
    assert "did not run: systemd is not PID 1" in done.stdout and "DID NOT RUN" in done.stdout
