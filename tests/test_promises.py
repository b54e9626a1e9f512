"""Stable promise ids and remedies (issue 29): the catalogue (conformance/promises.py) against the witness
suite and the profile, `--only`/`--skip` as a user gives them (exit 2 before any work; a left-out
promise is `not selected`, never kept), the remedy table (conformance/remedies.py) against the catalogue,
and a real negative control whose BROKEN row carries its remedy in every form: text, JSON, JUnit."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

import pytest
from witness_cli import witness

from sandbox_conformance.conformance import adapters, profile, promises, remedies, render, witnesses
from sandbox_conformance.conformance import settings as settings_mod
from sandbox_conformance.conformance.launch import REFERENCE, external
from sandbox_conformance.conformance.profile import NetworkMode
from sandbox_conformance.conformance.settings import Settings
from sandbox_conformance.runners.witness_args import WitnessOptions

REPO = Path(__file__).resolve().parent.parent
WITNESS_DIR = REPO / "conformance" / "witnesses"
WITNESS_MODULES = [WITNESS_DIR / m for m in witnesses.MODULES]


def suite_families() -> dict[str, list[str]]:
    """family -> the witness tests marked with it, read from the modules' source (no pytest, no
    profile: an oracle independent of the plugin's collection)."""
    out: dict[str, list[str]] = {}
    for node in (n for m in WITNESS_MODULES for n in ast.walk(ast.parse(m.read_text()))):
        if not isinstance(node, ast.FunctionDef):
            continue
        for d in node.decorator_list:
            if (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "witness"
                    and d.args and isinstance(d.args[0], ast.Constant)):
                out.setdefault(str(d.args[0].value), []).append(node.name)
    return out


def every_promise_profile() -> profile.Profile:
    """The reference profile with what it leaves out added: a hidden path and a proxy, so that every
    family `promises()` knows is made."""
    ref = profile.load(None)
    return ref._replace(filesystem=ref.filesystem._replace(hidden=("{state}/hidden",)),
                        network=NetworkMode.proxy, network_allowed=("example.invalid",))


# ---- the catalogue ---------------------------------------------------------------------------------------


def test_every_witness_is_of_a_catalogued_promise_and_every_promise_has_witnesses() -> None:
    families = suite_families()
    assert families, "no @witness(...) found in the suite"
    assert sorted(set(families) - set(promises.IDS)) == [], "witness families with no catalogued id"
    assert sorted(set(promises.IDS) - set(families)) == [], "catalogued ids with no witness"


def test_the_catalogue_is_what_a_profile_can_promise_in_the_reports_order() -> None:
    assert every_promise_profile().promises() == promises.IDS


def test_the_default_promises_are_marked_default_and_made_by_every_profile() -> None:
    defaults = {p.id for p in promises.CATALOGUE if p.default}
    assert set(profile.DEFAULT_PROMISES) <= defaults
    # A profile that promises nothing of its own still makes every default one but write_surface's
    # opt-out (unshare's `write_surface = "any"`).
    bare = profile.parse({"profile": {"name": "bare"}}, "bare.toml")
    assert defaults <= set(bare.promises())


def test_each_id_says_in_one_line_what_it_means_and_what_makes_it() -> None:
    for p in promises.CATALOGUE:
        assert p.meaning and "\n" not in p.meaning and p.made_by, p
        assert p.id.isidentifier() and p.id == p.id.lower(), p


# ---- selecting promises ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("only", "skip", "error"), [
    (["bogus"], [], "--only bogus: no such promise id (known: masked, read_only,"),
    ([], ["secrets,nope"], "--skip nope: no such promise id"),
    (["secrets,"], [], "--only 'secrets,': expected promise ids separated by commas"),
    (["secrets,devices"], ["devices"], "--only and --skip both name devices: give each promise to one"),
])
def test_a_bad_selection_is_one_line_naming_the_option_and_the_id(only: list[str], skip: list[str],
                                                                  error: str) -> None:
    with pytest.raises(promises.UnknownPromise) as e:
        promises.select(only, skip)
    assert str(e.value).startswith(error) and "\n" not in str(e.value)


def test_only_and_skip_take_comma_lists_and_repeats() -> None:
    sel = promises.select(["secrets,devices", "pid"], ["ipc"])
    assert sel.only == {"secrets", "devices", "pid"} and sel.skip == {"ipc"}
    assert sel.left_out(["secrets", "pid", "ipc", "uts"]) == ("ipc", "uts")
    assert (sel.why("ipc"), sel.why("uts")) == ("left out by --skip", "not in --only")
    assert not promises.select() and promises.select([], ["pid"])
    assert sel.to_json() == {"only": ["pid", "secrets", "devices"], "skip": ["ipc"]}  # catalogue order


def test_the_settings_carry_the_selection_into_the_profile() -> None:
    s = settings_mod.build(profile=None, launcher=None, skip=["lifecycle,terminal"], environ={})
    assert {"lifecycle", "terminal"} == s.profile.unselected
    assert "lifecycle" not in s.profile.promises() and "secrets" in s.profile.promises()
    s = settings_mod.build(profile=None, launcher=None, only=["secrets"], environ={})
    assert s.profile.promises() == ("secrets",)


def test_a_selection_that_leaves_nothing_to_test_is_a_usage_error() -> None:
    everything = ",".join(profile.load(None).promises())
    with pytest.raises(settings_mod.InvalidSettings, match=r"^--skip: leaves none of the promises profile "
                       r"reference makes to test"):
        settings_mod.build(profile=None, launcher=None, skip=[everything], environ={})
    # hidden is catalogued, but the reference profile does not make it: nothing is left to test.
    with pytest.raises(settings_mod.InvalidSettings, match=r"^--only: leaves none"):
        settings_mod.build(profile=None, launcher=None, only=["hidden"], environ={})


def test_run_forwards_only_and_skip_to_the_witness() -> None:
    opts = WitnessOptions(only=("secrets,devices",), skip=("pid",))
    argv = opts.argv()
    assert argv[argv.index("--only") + 1] == "secrets,devices"
    assert argv[argv.index("--skip") + 1] == "pid"
    assert opts.relocated(lambda p, k: p, lambda p, k: p).only == ("secrets,devices",)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandbox_conformance", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"})


@pytest.mark.parametrize(("args", "line"), [
    (("witness", "--only", "bogus"), "sandbox-conformance witness: --only bogus: no such promise id"),
    (("witness", "--only", "secrets", "--skip", "secrets"),
     "sandbox-conformance witness: --only and --skip both name secrets"),
    (("witness", "--only", "hidden"), "sandbox-conformance witness: --only: leaves none of the promises"),
    (("run", "--skip", "bogus"), "sandbox-conformance run: --skip bogus: no such promise id"),
    (("run", "--only", "hidden"), "sandbox-conformance run: --only: leaves none of the promises profile"),
])
def test_a_bad_selection_is_exit_2_before_any_work(args: tuple[str, ...], line: str) -> None:
    done = _cli(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[0].startswith(line), done.stderr
    assert done.stdout == "" or args[0] == "run", done.stdout  # nothing launched, no table
    assert "witness:" not in done.stdout


# ---- remedies ----------------------------------------------------------------------------------------------


def test_every_promise_has_a_generic_remedy_and_every_entry_a_known_id_and_kind() -> None:
    assert sorted(set(promises.IDS) - set(remedies.TABLE)) == []
    assert sorted(set(remedies.TABLE) - set(promises.IDS)) == []
    for pid, entries in remedies.TABLE.items():
        assert remedies.GENERIC in entries, pid
        assert set(entries) <= set(remedies.KINDS), (pid, set(entries) - set(remedies.KINDS))
        for kind, (cause, fix) in entries.items():
            assert cause and fix and "\n" not in cause + fix, (pid, kind)
            assert not cause.endswith(".") and not fix.endswith("."), (pid, kind)


@pytest.mark.parametrize(("adapter", "kind"), [
    (None, "generic"), ("runc", "oci"), ("crun", "oci"), ("unshare", "unshare"), ("docker", "docker"),
    ("systemd-run", "systemd-run"), ("srt", "srt"), ("codex", "codex"), ("podman", "podman"),
    ("podman-rootless", "podman"), ("firejail", "firejail"), ("runsc", "runsc"), ("gvisor", "runsc"),
    ("nspawn", "nspawn"), ("systemd-nspawn", "nspawn"), ("bwrap-trixie", "bwrap"), ("mine", "generic"),
])
def test_the_sandbox_kind_is_the_adapters_tool(adapter: str | None, kind: str) -> None:
    assert remedies.kind_of(adapter) == kind


def test_every_adapter_we_ship_has_a_kind_of_its_own() -> None:
    assert {a: remedies.kind_of(a) for a in adapters.ADAPTERS if remedies.kind_of(a) == "generic"} == {}


def test_a_kind_without_an_entry_gets_the_generic_remedy_and_an_unknown_id_none() -> None:
    r = remedies.remedy("terminal", "bwrap")
    assert r is not None and r.sandbox == "bwrap" and r.fix == "--new-session"
    g = remedies.remedy("cgroup", "bwrap")
    assert g is not None and g.sandbox == "generic"
    assert remedies.remedy("a_witness_of_your_own", "bwrap") is None
    assert r.line() == f"usually: {r.cause}; keep it with: {r.fix}"


def test_the_settings_name_the_sandbox_kind() -> None:
    assert Settings(profile.load(None), REFERENCE).sandbox_kind == "bwrap"
    assert Settings(profile.load(None), external("/bin/true --")).sandbox_kind == "generic"
    assert Settings(profile.load(None), external("/bin/true --"), adapter="crun").sandbox_kind == "oci"


# ---- rendering ---------------------------------------------------------------------------------------------

ROWS: list[render.Row] = [
    ("masked {state}/db", "BROKEN", "readable: canary"),
    ("masked {state}/x", "BROKEN", "readable: canary too"),
    ("secrets", "kept", ""),
    ("terminal", "not selected", "left out by --skip"),
]
LINE = "usually: no --tmpfs over the path; keep it with: --tmpfs PATH"


@pytest.mark.parametrize("width", [0, 80])
def test_a_remedy_is_printed_once_under_its_promises_last_broken_row(width: int) -> None:
    lines = render.lines_text(ROWS, remedies={"masked": LINE})
    assert lines[2] == "  " + LINE and sum(LINE in ln for ln in lines) == 1
    assert render.parse_lines_text("\n".join(lines)) == ROWS  # the contract: rows read back unchanged
    table = render.table_text(ROWS, width=width, remedies={"masked": LINE})
    assert render.parse_table_text("\n".join(table)) == ROWS
    assert render.remedies_text("\n".join(table)) == [LINE]
    md = "\n".join(render.witness_markdown(ROWS, word="FAIL", summary="s", remedies={"masked": LINE}))
    assert render.parse_table_markdown(md) == ROWS
    assert f"- `masked`: {render.md_text(LINE)}" in md


def test_no_remedy_without_a_broken_row() -> None:
    assert render.lines_text(ROWS[2:], remedies={"secrets": LINE}) == render.lines_text(ROWS[2:])


# ---- end to end: a real negative control carries its remedy ------------------------------------------------


def schema() -> dict:
    schemas = resources.files("sandbox_conformance.conformance") / "schemas"
    return json.loads((schemas / "witness-report.schema.json").read_text())


@pytest.mark.integration
def test_secret_in_init_is_broken_with_bwraps_remedy_in_text_json_and_junit(
    tmp_path: Path, root_only: None, bwrap_path: str
) -> None:
    import jsonschema

    report, junit = tmp_path / "r.json", tmp_path / "j.xml"
    # The control `secret_in_init` (conformance/controls.py): bwrap started with the launcher's
    # environment, --clearenv alone. Only its promise is selected: one launch, no lifecycle or terminal.
    done = witness("--perturb", "secret_in_init", "--only", "secrets", "--json", str(report),
                   "--junitxml", str(junit))
    assert done.returncode == 1, done.stdout + done.stderr[-1500:]
    lines = done.stdout.splitlines()
    broken = lines.index(next(ln for ln in lines if ln.startswith("secrets: BROKEN: ")))
    assert lines[broken + 1].startswith("  usually: bwrap itself, the sandbox's PID 1, keeps the environment")
    assert "keep it with: start bwrap through env -i" in lines[broken + 1]
    assert "descriptors: not selected: not in --only" in lines
    assert "kept" not in {v for _, v, _ in render.parse_lines_text(done.stdout)}
    others = len(profile.load(None).promises()) - 1
    assert lines[-1].startswith(f"witness: 0 kept, 1 BROKEN, 0 not tested, {others} not selected (profile")

    doc = json.loads(report.read_text())
    jsonschema.validate(doc, schema())
    assert doc["sandbox"] == "bwrap" and doc["selection"] == {"only": ["secrets"], "skip": []}
    assert doc["summary"]["not_selected"] == others and doc["summary"]["kept"] == 0
    [secrets] = [p for p in doc["promises"] if p["id"] == "secrets"]
    assert secrets["verdict"] == "BROKEN" and secrets["remedy"]["sandbox"] == "bwrap"
    assert "env -i" in secrets["remedy"]["fix"]
    assert all(p["remedy"] is None for p in doc["promises"] if p["verdict"] != "BROKEN")
    assert {p["id"] for p in doc["promises"] if p["verdict"] == "not selected"} == \
        set(profile.load(None).promises()) - {"secrets"}

    [case] = ET.parse(junit).getroot().iter("testcase")
    failure = case.find("failure")
    assert failure is not None and failure.get("message", "").startswith("AssertionError: ")
    assert "usually: bwrap itself" in failure.get("message", "")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["sbxc_remedy"] == lines[broken + 1].strip()


@pytest.mark.integration
def test_no_new_session_through_a_launcher_of_our_own_gets_the_generic_remedy(
    tmp_path: Path, root_only: None, bwrap_path: str
) -> None:
    from sandbox_conformance.conformance import controls

    if Path("/proc/sys/dev/tty/legacy_tiocsti").read_text().strip() == "0":
        pytest.skip("dev.tty.legacy_tiocsti = 0: this kernel refuses TIOCSTI to every task")
    control = controls.by_name()["no_new_session"]
    prefix = controls.launcher_prefix(control, disable_userns=False)
    assert prefix is not None
    report = tmp_path / "r.json"
    done = witness("--launcher", prefix, "--only", "terminal", "--harness-leaf", "--json", str(report),
                   "--format", "markdown")
    assert done.returncode == 1, done.stdout + done.stderr[-1500:]
    [terminal] = [p for p in json.loads(report.read_text())["promises"] if p["id"] == "terminal"]
    assert terminal["verdict"] == "BROKEN", terminal
    # An external launcher is a sandbox this project cannot see into: the generic remedy.
    assert terminal["remedy"]["sandbox"] == "generic" and "setsid(2)" in terminal["remedy"]["fix"]
    assert "How to keep what broke:" in done.stdout and "- `terminal`: usually: " in done.stdout


@pytest.mark.integration
def test_the_pytest_plugin_takes_only_and_puts_the_remedy_in_junit(
    tmp_path: Path, root_only: None, bwrap_path: str
) -> None:
    junit = tmp_path / "j.xml"
    base = [sys.executable, "-m", "pytest", *map(str, WITNESS_MODULES), "-c", os.devnull, "--rootdir",
            str(WITNESS_DIR.parent), "-p", "no:cacheprovider", "-p", "no:randomly", "-q"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    done = subprocess.run([*base, "--sbxc-only", "secrets", "--sbxc-perturb", "secret_in_init",
                           "--junitxml", str(junit)], cwd=tmp_path, text=True, capture_output=True,
                          timeout=120, env=env)
    assert done.returncode == 1, done.stdout[-2000:]
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert [c.get("name") for c in cases] == ["test_the_launchers_secret_is_readable_nowhere_in_the_task"]
    failure = cases[0].find("failure")
    assert failure is not None and "keep it with: start bwrap through env -i" in failure.get("message", "")
    bad = subprocess.run([*base, "--sbxc-only", "bogus"], cwd=tmp_path, text=True, capture_output=True,
                         timeout=60, env=env)
    assert bad.returncode == 4 and "--sbxc-only bogus: no such promise id" in bad.stderr, bad.stderr


def test_the_reports_schema_lists_exactly_the_catalogued_ids_and_kinds() -> None:
    defs = schema()["$defs"]
    assert defs["promise_id"]["enum"] == list(promises.IDS)
    assert defs["sandbox"]["enum"] == list(remedies.KINDS)


def test_the_readmes_promise_table_is_the_catalogue() -> None:
    text = (REPO / "README.md").read_text()
    begin, end = text.index("<!-- promises:begin"), text.index("<!-- promises:end -->")
    assert text[begin:end + len("<!-- promises:end -->")].splitlines() == promises.table_markdown(), \
        "README's promise table is stale: paste `python -m sandbox_conformance.conformance.promises` over it"


@pytest.mark.integration
def test_a_listed_skip_of_a_promise_left_out_is_no_problem(tmp_path: Path, root_only: None,
                                                           bwrap_path: str) -> None:
    # Whether the memory witness skips here or runs (a host with a delegated root), --only secrets
    # leaves it out: its expected skip is neither new nor stale.
    listed = tmp_path / "skips.txt"
    listed.write_text("test_an_allocation_past_memory_max_is_oom_killed | no cgroup leaf\n")
    done = witness("--only", "secrets", "--expected-skips", str(listed))
    assert done.returncode == 0, done.stdout + done.stderr[-1000:]
    assert "expected skips" not in done.stdout
