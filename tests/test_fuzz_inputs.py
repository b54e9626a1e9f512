"""Generated bad input (wrong types, empty strings, NUL, braces, huge values, non-UTF-8, special files)
for profiles, options, fleet-report directories and mr-check configs: each is exit 2 with exactly one
line on stderr, no traceback, and no input file changed (issue 28). Seeded, in-process, a few seconds."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path

import pytest
from test_bad_input import REFERENCE, run_cli

from sandbox_conformance.conformance import options

SEED = 28
VALUES: list[object] = ["", "\x00", "{", "}", "{nope}", "a" * 70_000, 0, -1, 1e308, True, [], {}, ["\x00"],
                        [""], ["{x"], "EROFS\n", "/usr}", "\n"]
PROFILE_KEYS = [
    ("profile", "name"), ("filesystem", "read_only"), ("filesystem", "masked"), ("filesystem", "writable"),
    ("filesystem", "refuse"), ("task", "control"), ("task", "control_files"), ("task", "workdir"),
    ("network", "mode"), ("userns", "errno"), ("namespaces", "hostname"), ("process", "capabilities"),
    ("environment", "allow"), ("limits", "memory_max"), ("limits", "pids_max"),
]


def _toml_value(v: object) -> str:
    # JSON's string escapes are TOML's basic-string escapes for these values; bools and lists alike.
    return json.dumps(v)


def _profiles(tmp: Path) -> list[Path]:
    rnd = random.Random(SEED)
    out = []
    for i in range(60):
        section, key = rnd.choice(PROFILE_KEYS)
        value = rnd.choice(VALUES)
        if isinstance(value, dict):
            value = []  # an inline table where a scalar goes is covered by []; keep TOML simple
        head = '[profile]\nname = "fuzz"\n[network]\nmode = "none"\n'
        body = f"{head}[{section}]\n{key} = {_toml_value(value)}\n"
        if section == "profile":
            body = f"[profile]\n{key} = {_toml_value(value)}\n"
        if section == "network":
            body = f'[profile]\nname = "fuzz"\n[network]\n{key} = {_toml_value(value)}\n'
        p = tmp / f"p{i}.toml"
        p.write_text(body)
        out.append(p)
    (tmp / "latin1.toml").write_bytes(b'[profile]\nname = "caf\xe9"\n')
    (tmp / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    out += [tmp / "latin1.toml", tmp / "deep.toml"]
    return out


def _bad_profile(p: Path) -> bool:
    from sandbox_conformance.conformance import profile

    try:
        profile.load(p)
    except profile.InvalidProfile:
        return True
    return False


def test_generated_bad_profiles_are_one_line_each(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = [p for p in _profiles(tmp_path) if _bad_profile(p)]
    assert len(bad) > 40  # the generator makes mostly bad ones: most must be caught by the loader
    for p in bad:
        before = p.read_bytes()
        code, out, err = run_cli(monkeypatch, "witness", "--profile", str(p), "--json", str(p))
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (p.read_text()[:200], err)
        assert "PASS" not in out and p.read_bytes() == before


OPTIONS = ["--profile", "--expected-skips", "--layout-root", "--as-user", "--launcher", "--launch-timeout",
           "--json", "--junitxml", "--log", "--adapter", "--format", "--launcher-env",
           # an older spelling, whose rename notice is a line of its own when the value is good
           *(alias for o in options.TABLE if options.WITNESS in o.commands for alias, _ in o.aliases)]
OUTPUTS = ("--json", "--junitxml", "--log")
BAD_OUTPUTS = ("", "/dev/zero", "/proc/version", "/dev/full", "a" * 5000, "/nonexistent/x")
BAD_OPTION_VALUES = ["", "nan", "inf", "-1", "/dev/zero", "/proc/version", "/dev/full", "-", "{", "a" * 5000,
                     "/nonexistent/x", "caf\udce9"]


def test_generated_bad_options_are_one_line_each(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tried = 0
    monkeypatch.chdir(tmp_path)  # a value that slipped through writes here, not in the checkout
    # Every pair, not a random draw of them: 80 draws never gave `--timeout nan`, the one pair that was
    # two lines (the old spelling's notice, then the new option's error).
    for flag, value in itertools.product(OPTIONS, BAD_OPTION_VALUES):
        if (flag in OUTPUTS and value not in BAD_OUTPUTS) or (flag == "--launcher" and value == "{"):
            continue  # a name that is a fine file name (`-1`, `{`), or a launcher word known only at launch
        code, out, err = run_cli(monkeypatch, "witness", flag, value)
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (flag, value, err)
        assert "PASS" not in out
        tried += 1
    assert tried > 100


def test_generated_bad_mr_check_configs_are_one_line_each(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rnd = random.Random(SEED)
    keys = ["name", "globs", "timeout", "prepare", "run"]
    for i in range(30):
        # The first two are the ones a `<= 0` check let through; the rest are drawn.
        key, value = (("timeout", [float("inf"), float("nan")][i]) if i < 2
                      else (rnd.choice(keys), rnd.choice([*VALUES, float("inf"), float("nan")])))
        tier = {"name": "t", "globs": ["x/**"], "run": {"kind": "command", "argv": ["true"]}, key: value}
        lines = ["[[tool.sandbox-conformance.tiers]]"]
        for k, v in tier.items():
            if isinstance(v, dict):
                inline = ", ".join(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
                lines.append(f"{k} = {{ {inline} }}")
            elif isinstance(v, float) and v != v:
                lines.append(f"{k} = nan")
            elif v == float("inf"):
                lines.append(f"{k} = inf")
            else:
                lines.append(f"{k} = {_toml_value(v)}")
        cfg = tmp_path / f"c{i}.toml"
        cfg.write_text("\n".join(lines) + "\n")
        code, _, err = run_cli(monkeypatch, "mr-check", "--config", str(cfg))
        if i < 2:
            assert code == 2 and "timeout" in err, err
        if code == 2:
            assert len(err.splitlines()) == 1 and "Traceback" not in err, (cfg.read_text(), err)
        else:  # a value that happens to be valid (a name of "{"): it ran, and said no traceback
            assert "Traceback" not in err, err


def test_generated_bad_fleet_report_directories_are_never_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host = tmp_path / "fleet" / "h1"
    host.mkdir(parents=True)
    for name, data in [("run.json", b"\xff\xfe not utf-8"), ("probe.json", b"[" * 100_000),
                       ("witness.json", b'{"promises": 7}')]:
        (host / name).write_bytes(data)
    os.mkfifo(host / "witness-root.json")
    code, _, err = run_cli(monkeypatch, "fleet-report", str(tmp_path / "fleet"))
    assert "Traceback" not in err and code in (0, 1, 2), err
    code, _, err = run_cli(monkeypatch, "fleet-report", str(tmp_path / "fleet"), "--output",
                           str(host / "run.json"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert (host / "run.json").read_bytes() == b"\xff\xfe not utf-8"


def test_the_reference_profile_itself_still_loads() -> None:
    assert not _bad_profile(REFERENCE)
