#!/usr/bin/env python3
"""(b) What `sandbox-conformance run` costs end to end in native mode over the work it must do.

    .venv/bin/python bench/run_bench.py [--reps N] [--check] [--json]

`run --mode native --json FILE` (the decision's probes, the witness suite, its report) against its
floor: importing pytest (`python -c "import pytest"`, the venv's interpreter) plus one full-unshare
bwrap launch (bench/_common.py bare_launch) per launch the run's report lists (`launches`: the main
task's, and the lifecycle and terminal promises' own). Both interleaved, ratio of
the medians. Target: at most 2.0. Whatever `run` does today is what is measured: a run that probes
twice pays for it here.

--check exits 1 when the ratio misses the target; 75 when the venv or bwrap is missing, or `run`
refuses native mode on this host (nothing to measure)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# bench/ is not a package: run as a script, its helpers beside it.
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

TARGET = 2.0


def measure(reps: int) -> tuple[Ratio, dict[str, float], dict[str, object]]:
    need_venv()
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise Missing("bwrap not found: neither the run nor its floor can be measured")
    launch = bare_launch(bwrap)
    with tempfile.TemporaryDirectory(prefix="sbxc-bench-") as tmp:
        report = Path(tmp) / "run.json"
        argv = [str(CLI), "run", "--mode", "native", "--json", str(report)]
        _, done = timed(argv, cwd=tmp, ok=(0, 75))
        if done.returncode == 75:
            raise Missing(f"run refuses native mode here: {done.stderr_tail()}")
        doc = json.loads(report.read_text())
        tasks = len(doc.get("tasks", []))
        # Every launch the run made: the main task's, and the lifecycle and terminal promises' own (each
        # needs a task of its own: its launcher SIGKILLed, a terminal as its stdio). A report from before
        # it counted them has the main tasks only.
        launches = int(doc.get("launches") or tasks)
        m = interleaved({
            "run": lambda: timed(argv, cwd=tmp)[0],
            "pytest_import": lambda: timed([str(PYTHON), "-c", "import pytest"])[0],
            "launch": lambda: timed(launch)[0],
        }, reps)
    floor = m["pytest_import"] + launches * m["launch"]
    ratio = Ratio("b", "run --mode native", m["run"], floor,
                  f"pytest import + {launches} x one full-unshare bwrap launch", TARGET,
                  notes=(f"{launches} launch{'es' if launches != 1 else ''} in the run's report, "
                         f"{tasks} of them main task{'s' if tasks != 1 else ''}",))
    return ratio, m, {"tasks": tasks, "launches": launches}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, metavar="N", help="repetitions of each side (default 5)")
    p.add_argument("--check", action="store_true", help="exit 1 when the ratio misses its target")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    try:
        ratio, m, facts = measure(args.reps)
    except Missing as e:
        print(f"run_bench: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps({"reps": args.reps, "load": load(), "ratios": [ratio.to_json()], **facts,
                          "medians_ms": {k: round(v * 1000, 2) for k, v in m.items()}}, indent=2))
    else:
        print(figure("run --mode native", m["run"], f"median of {args.reps}, {load()}"))
        print(figure("python -c 'import pytest'", m["pytest_import"]))
        print(figure("full-unshare bwrap launch", m["launch"]))
        print(ratio.line())
        for note in ratio.notes:
            print(f"    {note}")
    return 1 if args.check and not ratio.ok else 0


if __name__ == "__main__":
    sys.exit(main())
