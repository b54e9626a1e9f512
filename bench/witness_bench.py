#!/usr/bin/env python3
"""(c) What one witness assertion costs, amortised, against one TAP result of bubblewrap's own tests.

    .venv/bin/python bench/witness_bench.py [--reps N] [--check] [--json] [--as-user NAME]
                                            [--bwrap-tests DIR]

Per witness assertion: (the wall time of `sandbox-conformance witness`, the reference profile and
launcher, minus pytest's start-up) / the witness tests that ran (passed or failed; skips left out).
pytest's start-up is the interpreter and pytest running one empty test with this project's plugin
blocked (`-p no:sandbox_conformance`), so the plugin's imports, the guard probe, every launch and its
host-side observer (finding the task under /proc, reading its kernel state at the handshake, then the
scan for anything the launch left running) all count as the suite's. Target: under 2 ms.

Beside it, measured in the same run against the same bwrap: bubblewrap's tests/test-run.sh, its wall
time per TAP result that ran (bench/bwrap_tests.py says where it comes from; where it cannot be had,
a TAP script of the same shape, one bare bwrap per result, stands in and the line says so). And, as
before, the suite against its floor: pytest's start-up plus one bare full-unshare launch per task.

--check exits 1 when the per-assertion figure misses the target; 75 when the venv or bwrap is
missing."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# bench/ is not a package: run as a script, its helpers beside it.
import bwrap_tests
from _common import (
    CLI,
    EXIT_UNAVAILABLE,
    PYTHON,
    Missing,
    Ratio,
    bare_launch,
    figure,
    interleaved,
    load,
    need_venv,
    timed,
)

TARGET_MS = 2.0


def witness_assertions(report: dict) -> tuple[int, int]:
    """(tests that ran, tasks launched) from a witness --json report: each test id once, however many
    promises list it."""
    outcomes: dict[str, str] = {}
    for promise in report.get("promises", []):
        for test in promise.get("tests", []):
            outcomes[test["nodeid"]] = test["outcome"]
    ran = sum(outcome in ("passed", "failed") for outcome in outcomes.values())
    return ran, len(report.get("tasks", []))


def measure(reps: int, *, as_user: str | None = None, bwrap_tests_dir: str | None = None,
            allow_fetch: bool = True) -> tuple[Ratio, dict[str, float], dict[str, object]]:
    need_venv()
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise Missing("bwrap not found: the suite and bubblewrap's tests both need it")
    tests_dir, source = bwrap_tests.locate(bwrap_tests_dir, allow_fetch=allow_fetch)
    facts: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="sbxc-bench-") as tmp:
        (Path(tmp) / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
        report = Path(tmp) / "r.json"
        suite = [str(CLI), "witness", "--json", str(report), *(["--as-user", as_user] if as_user else [])]

        def tap() -> float:
            assert tests_dir is not None
            done = bwrap_tests.run_test_run_sh(tests_dir, bwrap)
            facts["tap_results"] = done.results
            return done.per_result

        def comparable() -> float:
            done = bwrap_tests.run_comparable(bwrap)
            facts["tap_results"] = done.results
            return done.per_result

        sides = {
            "witness": lambda: timed(suite, cwd=tmp)[0],
            "pytest_startup": lambda: timed([str(PYTHON), "-m", "pytest", "-q", "-p", "no:randomly",
                                             "-p", "no:cacheprovider", "-p", "no:sandbox_conformance",
                                             "test_nothing.py"], cwd=tmp)[0],
            "launch": lambda: timed(bare_launch(bwrap, as_user))[0],
            "tap_per_result": tap if tests_dir is not None else comparable,
        }
        if tests_dir is not None:
            try:
                bwrap_tests.run_test_run_sh(tests_dir, bwrap)
            except RuntimeError as e:  # it fails on this host: no yardstick, say so
                tests_dir, source = None, f"test-run.sh failed here: {e}"
                sides["tap_per_result"] = comparable
        m = interleaved(sides, reps)
        ran, launches = witness_assertions(json.loads(report.read_text()))
    if ran == 0:
        raise SystemExit("witness_bench: the witness report lists no test that ran")
    per_assertion = (m["witness"] - m["pytest_startup"]) / ran
    yardstick = (f"bubblewrap tests/test-run.sh per TAP result ({source})" if tests_dir is not None else
                 f"a TAP script, one bare bwrap per result (bubblewrap's test-run.sh not used: {source})")
    floor = m["pytest_startup"] + launches * m["launch"]
    ratio = Ratio("c", "per witness assertion", per_assertion, m["tap_per_result"], yardstick, TARGET_MS,
                  below=True, unit="ms",
                  notes=(f"{ran} witness tests ran, {launches} task launches; {facts.get('tap_results')} TAP "
                         f"results per run of the yardstick",
                         f"the suite against its floor (pytest start-up + {launches} x bare launch): "
                         f"{m['witness'] / floor:.2f} x"))
    return ratio, m, {"witness_tests_ran": ran, "launches": launches, **facts, "yardstick": yardstick}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, metavar="N", help="repetitions of each side (default 5)")
    p.add_argument("--check", action="store_true", help="exit 1 when the figure misses its target")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--as-user", metavar="NAME", help="(root only) launch the suite's tasks as this user")
    p.add_argument("--bwrap-tests", metavar="DIR",
                   help="a bubblewrap checkout's tests/ (default: the installed package's source, cached)")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    try:
        ratio, m, facts = measure(args.reps, as_user=args.as_user, bwrap_tests_dir=args.bwrap_tests)
    except Missing as e:
        print(f"witness_bench: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps({"reps": args.reps, "load": load(), "ratios": [ratio.to_json()], **facts,
                          "medians_ms": {k: round(v * 1000, 3) for k, v in m.items()}}, indent=2))
    else:
        print(figure("witness suite", m["witness"], f"median of {args.reps}, {load()}"))
        print(figure("pytest start-up", m["pytest_startup"], "an empty test, no plugin"))
        print(figure("full-unshare bwrap launch", m["launch"]))
        print(ratio.line())
        for note in ratio.notes:
            print(f"    {note}")
        print(f"    yardstick: {ratio.floor_what}")
    return 1 if args.check and not ratio.ok else 0


if __name__ == "__main__":
    sys.exit(main())
