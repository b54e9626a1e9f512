#!/usr/bin/env python3
"""The three figures of issue 15, measured in one run and printed side by side, each PASS or MISS
against its target:

  (a) `probe --json` / (venv python start-up + one full-unshare bwrap launch)     target <= 2.5
  (b) `run --mode native` / (pytest import + one full-unshare launch per task)    target <= 2.0
  (c) per witness assertion, start-up excluded, beside bubblewrap's tests/test-run.sh per TAP result
                                                                                 target < 2 ms

    .venv/bin/python bench/ratios.py [--reps N] [--check] [--json] [--bwrap-tests DIR]

Each is measured by its own bench (probe_bench.py, run_bench.py, witness_bench.py: their docstrings say
exactly what each side is), its two sides interleaved. --check exits 1 when any figure misses its
target; 75 when the venv or bwrap is missing. A figure that cannot be measured here (run refusing
native mode) is printed as such and counts as neither."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# bench/ is not a package: run as a script, its helpers beside it.
import probe_bench
import run_bench
import witness_bench
from _common import EXIT_UNAVAILABLE, Missing, Ratio, load, need_venv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, metavar="N", help="repetitions of each side (default 5)")
    p.add_argument("--check", action="store_true", help="exit 1 when any figure misses its target")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--bwrap-tests", metavar="DIR",
                   help="a bubblewrap checkout's tests/ for (c) (default: the installed package's source)")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    try:
        need_venv()
    except Missing as e:
        print(f"ratios: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    ratios: list[Ratio] = []
    unmeasured: list[str] = []
    steps = (("a", lambda: probe_bench.measure(args.reps)[0]),
             ("b", lambda: run_bench.measure(args.reps)[0]),
             ("c", lambda: witness_bench.measure(args.reps, bwrap_tests_dir=args.bwrap_tests)[0]))
    for key, step in steps:
        try:
            ratios.append(step())
        except Missing as e:
            unmeasured.append(f"({key}) not measured: {e}")
    if not ratios:
        print("ratios: nothing could be measured: " + "; ".join(unmeasured), file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps({"reps": args.reps, "load": load(), "ratios": [r.to_json() for r in ratios],
                          "unmeasured": unmeasured}, indent=2))
    else:
        print(f"medians of {args.reps} interleaved runs, {load()}")
        for r in ratios:
            print(r.line())
        for line in unmeasured:
            print(line)
        for r in ratios:
            print(f"({r.key}) against: {r.floor_what}")
            for note in r.notes:
                print(f"    {note}")
    return 1 if args.check and not all(r.ok for r in ratios) else 0


if __name__ == "__main__":
    sys.exit(main())
