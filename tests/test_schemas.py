"""Every JSON document a user consumes has a schema in the package (conformance/schemas/), and the
real outputs validate against it: the witness report, the controls report, mr-check's JSON and the
task spec an external launcher reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from witness_cli import witness

from sandbox_conformance.conformance import render

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration


def schema(name: str) -> dict:
    schemas = resources.files("sandbox_conformance.conformance") / "schemas"
    text = (schemas / f"{name}.schema.json").read_text()
    doc = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(doc)
    return doc


def test_the_witness_report_validates(tmp_path: Path, root_only: None) -> None:
    done = witness("--json", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    jsonschema.validate(json.loads((tmp_path / "r.json").read_text()), schema("witness-report"))


def test_a_red_report_validates_too(tmp_path: Path, root_only: None) -> None:
    done = witness("--perturb", "ipc_shared", "--json", str(tmp_path / "r.json"))
    assert done.returncode == 1, done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, schema("witness-report"))
    assert any(p["verdict"] == "BROKEN" for p in report["promises"])
    # What a person reads last, as data: the summary line verbatim (no colour in a pipe), and no
    # problem printed after the table that the report does not list.
    printed = done.stdout.strip().splitlines()
    assert report["summary"]["line"] == printed[-1]
    assert all(problem in printed for problem in report["problems"])


def test_a_reports_problems_are_the_lines_printed_after_the_table(tmp_path: Path) -> None:
    done = witness("--launcher", "false", "--json", str(tmp_path / "r.json"))
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, schema("witness-report"))
    printed = done.stdout.strip().splitlines()
    # One launcher failure: said once after the table, and in each row's detail in the report.
    [problem] = report["problems"]
    assert problem.startswith("harness error: launcher 'false': exited 1") and problem in printed[:-1]
    assert {p["detail"] for p in report["promises"]} == {problem}
    assert report["summary"]["line"] == printed[-1]


def test_the_task_spec_an_external_launcher_reads_validates(tmp_path: Path, root_only: None) -> None:
    copy = tmp_path / "spec.json"
    launcher = tmp_path / "copy-spec"
    launcher.write_text(f'#!/bin/sh\ncp "$SANDBOX_CONFORMANCE_TASK_SPEC" {copy}\nexec "$@"\n')
    launcher.chmod(0o755)
    witness("--launcher", str(launcher), "--launcher-spec", "--junitxml", str(tmp_path / "j.xml"))
    jsonschema.validate(json.loads(copy.read_text()), schema("task-spec"))


def test_the_controls_report_validates(root_only: None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "controls", "--only", "ipc_shared", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    jsonschema.validate(json.loads(done.stdout), schema("controls-report"))


def test_the_mr_check_report_validates(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=30)

    git("init", "-q", "-b", "main")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    (repo / "pyproject.toml").write_text(
        '[[tool.sandbox-conformance.tiers]]\nname = "seccomp"\nglobs = ["seccomp/**"]\n'
        'run = { kind = "command", argv = ["true"] }\n'
    )
    (repo / "seccomp").mkdir()
    (repo / "seccomp" / "policy.json").write_text("{}\n")
    git("add", ".")
    git("commit", "-q", "-m", "base")
    git("checkout", "-q", "-b", "change")
    (repo / "seccomp" / "policy.json").write_text('{"default": "deny"}\n')
    git("commit", "-q", "-am", "tighten")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox_conformance",
            "mr-check",
            "-C",
            str(repo),
            "--base",
            "main",
            "--format",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert done.returncode in (0, 75), done.stdout + done.stderr
    report = json.loads(done.stdout)
    jsonschema.validate(report, schema("mr-check-report"))
    assert report["touched"] is True and report["tiers"][0]["name"] == "seccomp"


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
         stdout: list[str] | None = None) -> tuple[int, dict, str]:
    """`sandbox-conformance run --verdict-json FILE ARGS`: (exit, the document, stderr); its stdout's
    lines appended to `stdout`."""
    doc = tmp_path / "verdict.json"
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "run", "--verdict-json", str(doc), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), **(env or {})},
    )
    assert doc.is_file(), f"no verdict document (exit {done.returncode}): {done.stderr[-2000:]}"
    report = json.loads(doc.read_text())
    jsonschema.validate(report, schema("run-verdict"))
    if stdout is not None:
        stdout += done.stdout.splitlines()
    return done.returncode, report, done.stderr


def test_a_refused_runs_verdict_document_has_the_reason_and_the_ways_on(tmp_path: Path) -> None:
    """A deployment signature whose config path exists: auto refuses here, whatever else this host is."""
    present = tmp_path / "agentd.toml"
    present.write_text("x = 1\n")
    signature = tmp_path / "deployment.toml"
    signature.write_text(f'[deployment]\nconfig_paths = ["{present}"]\n')
    code, doc, stderr = _run(tmp_path, env={"SANDBOX_CONFORMANCE_DEPLOYMENT_CONFIG": str(signature)})
    assert code == doc["exit"] == 75 and doc["verdict"] == "REFUSED", stderr[-2000:]
    # The same as the lines a person reads, as data: the verdict line verbatim, each way on.
    assert doc["line"] == stderr.strip().splitlines()[-1]
    assert doc["reason"] and f"refused: {doc['reason']}" in stderr
    assert doc["ways_on"] and all(f"way on: {w}" in stderr for w in doc["ways_on"])
    assert (doc["mode"], doc["requested_mode"]) == ("auto", "auto")


def test_a_usage_errors_verdict_document_names_it(tmp_path: Path) -> None:
    code, doc, stderr = _run(tmp_path, "--timeout", "0")
    assert code == doc["exit"] == 2 and doc["verdict"] == "ERROR"
    assert doc["reason"] == "--timeout 0: expected a positive number of seconds, at most 86400"
    assert doc["reason"] in stderr


def test_a_passing_runs_verdict_document(tmp_path: Path, root_only: None) -> None:
    code, doc, stderr = _run(tmp_path, "--mode", "native", "--", "-k", "loopback")
    if code == 75:
        pytest.skip(f"native mode refused here: {doc['reason']}")
    assert code == doc["exit"] == 0 and doc["verdict"] == "PASS", stderr[-2000:]
    assert doc["mode"] == "native" and doc["reason"] is None and doc["ways_on"] == []
    assert doc["line"] == stderr.strip().splitlines()[-1]


def _native_or_skip(code: int, doc: dict) -> None:
    if code == 75:
        pytest.skip(f"native mode refused here: {doc['reason']}")


def test_a_red_runs_verdict_document_carries_its_witness_rows_and_summary(tmp_path: Path) -> None:
    """`--launcher env` sandboxes nothing: the reference promises break. The run was asked for no
    witness report, so it gave its witness a scratch one, read it into `legs`, and removed it."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    printed: list[str] = []
    code, doc, stderr = _run(tmp_path, "--mode", "native", "--launcher", "env",
                             env={"TMPDIR": str(scratch)}, stdout=printed)
    _native_or_skip(code, doc)
    assert code == doc["exit"] == 1, stderr[-2000:]
    [leg] = doc["legs"]
    assert (leg["label"], leg["exit"], leg["summary"]) == ("native", 1, printed[-1])
    rows = [(p["promise"], p["verdict"], p["detail"]) for p in leg["promises"]]
    assert render.grouped(rows) == render.parse_lines_text("\n".join(printed))  # the rows printed, as data
    assert any(v == "BROKEN" for _, v, _ in rows)
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("sbxc-run-report.")]


def test_a_runs_legs_come_from_the_report_json_asks_for(tmp_path: Path) -> None:
    report = tmp_path / "mine.json"
    code, doc, stderr = _run(tmp_path, "--mode", "native", "--launcher", "false", "--json", str(report))
    _native_or_skip(code, doc)
    assert code == 1, stderr[-2000:]
    mine = json.loads(report.read_text())
    [leg] = doc["legs"]
    assert (leg["summary"], leg["problems"]) == (mine["summary"]["line"], mine["problems"])
    # A later run whose witness writes no report (pytest refuses its arguments: exit 2) does not
    # pass the previous run's report off as its own.
    code, doc, stderr = _run(tmp_path, "--mode", "native", "--launcher", "false", "--json", str(report),
                             "--", "--no-such-pytest-option")
    assert code == 2 and doc["legs"] == [], stderr[-2000:]
