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

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration


def schema(name: str) -> dict:
    text = (resources.files("conformance") / "schemas" / f"{name}.schema.json").read_text()
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


def test_the_task_spec_an_external_launcher_reads_validates(tmp_path: Path, root_only: None) -> None:
    copy = tmp_path / "spec.json"
    launcher = tmp_path / "copy-spec"
    launcher.write_text(f'#!/bin/sh\ncp "$SANDBOX_CONFORMANCE_TASK_SPEC" {copy}\nexec "$@"\n')
    launcher.chmod(0o755)
    witness("--launcher", str(launcher), "--junitxml", str(tmp_path / "j.xml"))
    jsonschema.validate(json.loads(copy.read_text()), schema("task-spec"))


def test_the_controls_report_validates(root_only: None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runners.cli", "controls", "--only", "ipc_shared", "--json"],
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
            "runners.cli",
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
