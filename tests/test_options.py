"""Each witness option is declared once (conformance/options.py, issue 30): `witness`, `run` and the
pytest plugin take what the table says, `run` hands every one it takes to the witness unchanged, and
the plugin's page lists them."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_conformance.commands import cli
from sandbox_conformance.conformance import options
from sandbox_conformance.runners.witness_args import WitnessOptions

REPO = Path(__file__).resolve().parent.parent

# A value each option can take (what it means is checked elsewhere: only that it travels).
SAMPLE = {"profile": "/p.toml", "adapter": "crun", "launcher": "env --", "launcher_env": "A=1",
          "layout_root": "/srv/l", "only": "mounts", "skip": "network", "as_user": "alice",
          "junitxml": "/r.xml", "json": "/r.json", "format": "lines", "log": "/l.txt",
          "expected_skips": "/s.txt", "launch_timeout": "7.5", "host_cannot_observe": "a remote engine"}


def _parser(command: str) -> argparse.ArgumentParser:
    return cli.build_parser([command])


def _flags(command: str) -> set[str]:
    sub = next(a for a in _parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


@pytest.mark.parametrize("command", [options.WITNESS, options.RUN])
def test_each_command_takes_the_options_the_table_gives_it(command: str) -> None:
    flags = _flags(command)
    for o in options.TABLE:
        assert (o.flag in flags) == (command in o.commands), o.flag


def test_the_record_run_forwards_has_one_field_per_option_run_takes() -> None:
    assert list(WitnessOptions._fields) == [o.dest for o in options.FORWARDED] + ["pytest_args"]


def test_every_option_run_takes_reaches_the_witness_with_its_value() -> None:
    words: list[str] = []
    for o in options.FORWARDED:
        if o.action == "store_true":
            words.append(o.flag)
        elif o.crosses is not options.Crossing.stays:
            words += [o.flag, SAMPLE[o.dest]]
    run_args = _parser("run").parse_args(["run", *words, "--", "-k", "x"])
    forwarded = WitnessOptions.from_args(run_args).argv()
    seen = _parser("witness").parse_args(["witness", *forwarded])
    for o in options.FORWARDED:
        want = getattr(run_args, o.dest)
        assert getattr(seen, o.dest) == want, (o.flag, forwarded)
    assert seen.pytest_args[-2:] == ["-k", "x"]


def test_what_crosses_to_a_container_is_mapped_by_its_kind() -> None:
    given = WitnessOptions(profile="/p.toml", expected_skips="/s.txt", json="/r.json", junitxml="/r.xml",
                           log="/l.txt", as_user="alice", layout_root="/srv/l", launch_timeout=7.5)
    moved = given.relocated(lambda p, key: f"/in/{key}", lambda p, key: f"/out/{key}")
    assert moved == given._replace(profile="/in/profile", expected_skips="/in/expected-skips",
                                   json="/out/report", junitxml="/out/junit", log="/out/log", as_user=None)


def test_the_older_spelling_of_the_launch_timeout_still_works_and_says_so() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys\n"
                           "from sandbox_conformance.commands import cli\n"
                           "a = cli.build_parser(['witness']).parse_args(['witness', '--timeout', '5'])\n"
                           "print(a.launch_timeout)"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.stdout.strip() == "5.0"
    assert "--launch-timeout" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    run_sub = next(a for a in _parser("run")._actions if isinstance(a, argparse._SubParsersAction))
    assert "--timeout" not in {s for a in run_sub.choices["run"]._actions for s in a.option_strings
                               if a.dest == "launch_timeout"}


def test_the_plugin_takes_its_options_and_its_page_lists_them() -> None:
    page = (REPO / "docs" / "pytest-plugin.md").read_text()
    helped = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:randomly"],
                            capture_output=True, text=True, timeout=120, cwd="/")
    for o in options.TABLE:
        if options.PLUGIN not in o.commands:
            assert o.pytest_flag not in helped.stdout, o.pytest_flag
        elif not o.hidden:
            assert o.pytest_flag in helped.stdout and f"`{o.pytest_flag}" in page, o.pytest_flag
