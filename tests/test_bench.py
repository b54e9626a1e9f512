"""The benches run and print their ratio lines (one repetition each: this checks the plumbing, never
a time: benchmarks are not timed asserts), and their pure pieces do what they say."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
PYTHON = REPO / ".venv/bin/python"
sys.path.insert(0, str(BENCH))

import bwrap_tests  # noqa: E402  (bench/ is not a package)
import witness_bench  # noqa: E402
from _common import Ratio  # noqa: E402

RATIO_LINE = re.compile(r"^\((?P<key>[abc])\) .+ ms vs .+ ms .+ target (<=|<) [\d.]+ (x|ms)  (PASS|MISS)$")


# ---------------------------------------------------------------- pure pieces

def test_a_ratio_passes_at_its_target_and_misses_above_it() -> None:
    at = Ratio("a", "probe --json", 0.250, 0.100, "floor", 2.5)
    above = Ratio("a", "probe --json", 0.251, 0.100, "floor", 2.5)
    assert at.ok and not above.ok
    assert at.line().endswith("PASS") and above.line().endswith("MISS")
    assert RATIO_LINE.match(at.line())


def test_an_absolute_target_is_strictly_below_and_in_ms() -> None:
    edge = Ratio("c", "per witness assertion", 0.002, 0.005, "yardstick", 2.0, below=True, unit="ms")
    under = Ratio("c", "per witness assertion", 0.0019, 0.005, "yardstick", 2.0, below=True, unit="ms")
    assert not edge.ok and under.ok
    assert "target < 2 ms" in under.line() and RATIO_LINE.match(under.line())
    assert under.to_json()["value"] == 1.9


def test_witness_assertions_count_each_test_once_and_leave_skips_out() -> None:
    report = {"promises": [
        {"tests": [{"nodeid": "t::a", "outcome": "passed"}, {"nodeid": "t::b", "outcome": "skipped"}]},
        {"tests": [{"nodeid": "t::a", "outcome": "passed"}, {"nodeid": "t::c", "outcome": "failed"}]},
    ], "tasks": [{}, {}]}
    assert witness_bench.witness_assertions(report) == (2, 2)


def test_deb_src_entries_mirror_the_hosts_deb_entries(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# old style\ndeb [arch=amd64] http://mirror.example/debian bookworm main\n")
    (tmp_path / "sources.list.d/debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://off.example/\nSuites: x\nComponents: main\nEnabled: no\n")
    (tmp_path / "sources.list.d/other.sources.disabled").write_text("Types: deb\nURIs: http://no/\n")
    got = bwrap_tests._deb_src_sources(tmp_path).splitlines()
    assert got == [
        "deb-src [arch=amd64] http://mirror.example/debian bookworm main",
        "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian "
        "bookworm main",
        "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian "
        "bookworm-updates main",
    ]


def test_tap_results_that_ran_are_counted_skips_left_out(tmp_path: Path) -> None:
    script = tmp_path / "test-run.sh"
    script.write_text("echo 1..4\necho 'ok - one'\necho 'ok # SKIP no FUSE support'\necho 'ok 3 - two'\n"
                      "echo '# a comment'\necho 'ok - three'\n")
    done = bwrap_tests.run_test_run_sh(tmp_path, "/bin/false")
    assert (done.results, done.failed) == (3, 0)
    script.write_text("echo 1..1\necho 'not ok - broken'\nexit 1\n")
    with pytest.raises(RuntimeError, match="exited 1"):
        bwrap_tests.run_test_run_sh(tmp_path, "/bin/false")


def test_a_given_directory_without_test_run_sh_is_said_plainly(tmp_path: Path) -> None:
    path, why = bwrap_tests.locate(str(tmp_path))
    assert path is None and "no test-run.sh" in why


# ---------------------------------------------------------------- the scripts, end to end

def _needs_the_host() -> None:
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} missing: run `make setup`")
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap not installed (apt-get install bubblewrap)")


def _tiny_bwrap_tests(tmp_path: Path) -> Path:
    """A stand-in tests/ directory with a three-result test-run.sh that really runs $BWRAP, so (c)'s
    plumbing is checked without fetching bubblewrap's sources or spending seconds on them."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test-run.sh").write_text(
        'echo 1..3\nfor i in 1 2 3; do "$BWRAP" --bind / / --tmpfs /tmp true; echo "ok $i - ran"; done\n')
    return tests


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_ratios_prints_the_three_lines_side_by_side(tmp_path: Path) -> None:
    _needs_the_host()
    done = subprocess.run([str(PYTHON), str(BENCH / "ratios.py"), "--reps", "1",
                           "--bwrap-tests", str(_tiny_bwrap_tests(tmp_path))],
                          capture_output=True, text=True, timeout=280, cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if RATIO_LINE.match(line)]
    keys = [RATIO_LINE.match(line).group("key") for line in lines]  # type: ignore[union-attr]
    unmeasured = [line for line in done.stdout.splitlines() if "not measured" in line]
    assert sorted(keys + [line[1] for line in unmeasured]) == ["a", "b", "c"], done.stdout
    assert "tests/test-run.sh per TAP result" in done.stdout


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_probe_bench_json_names_its_floor_and_target() -> None:
    _needs_the_host()
    done = subprocess.run([str(PYTHON), str(BENCH / "probe_bench.py"), "--reps", "1", "--json"],
                          capture_output=True, text=True, timeout=110, cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    [ratio] = doc["ratios"]
    assert (ratio["key"], ratio["target"], ratio["comparison"]) == ("a", 2.5, "<=")
    assert ratio["value"] > 0 and "full-unshare bwrap" in ratio["floor"]
    # `engine`: where the probe found a container engine CLI, its own `info` beside the launch.
    medians = set(doc["medians_ms"])
    assert medians - {"engine"} == {"probe", "python", "bare_python", "launch", "cli_startup"}
    assert ("engine" in medians) == ("`" in ratio["floor"]), "the floor says when it counts the engine"


@pytest.mark.parametrize("script", ["probe_bench.py", "run_bench.py", "witness_bench.py", "ratios.py",
                                    "vm_bench.py"])
def test_every_bench_takes_the_same_repetition_flag(script: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True,
                          timeout=60, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert "--reps N" in done.stdout and "--json" in done.stdout
    # --check wherever there is a target to check (the VM bench only reports).
    assert ("--check" in done.stdout) is (script != "vm_bench.py")
