#!/usr/bin/env python3
"""(a) What `sandbox-conformance probe --json` costs over the work it cannot avoid.

    .venv/bin/python bench/probe_bench.py [--reps N] [--check] [--json]

The floor is what any probe of this host must pay: one interpreter start-up, as the console script
starts it (the venv's python with its site-packages, `-c pass`), plus one full-unshare bwrap running
the smallest observer (`python3 -I -S -c pass`; bench/_common.py bare_launch), since on a healthy host
one launch answers every ladder rung. Both sides interleaved, ratio of the medians. Target: at most
2.5. Also printed, to show where the time goes: the CLI's own start-up (`probe --json --only
platform`: interpreter, the probe command's imports, no child) and the stricter ratio against the bare
interpreter (`python3 -I -S -c pass`) in place of the venv's.

--check exits 1 when the ratio misses the target; 75 when the venv or bwrap is missing."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# bench/ is not a package: run as a script, its helpers beside it.
from _common import (
    CLI,
    EXIT_UNAVAILABLE,
    PYTHON,
    SYSTEM_PYTHON,
    Missing,
    Ratio,
    bare_launch,
    figure,
    interleaved,
    load,
    need_venv,
    timed,
)

TARGET = 2.5


def probe_once() -> float:
    seconds, done = timed([str(CLI), "probe", "--json"])
    doc = json.loads(done.stdout)
    if doc.get("schema") != 1 or not doc.get("findings"):
        raise SystemExit("probe_bench: probe --json did not print a schema-1 document with findings")
    return seconds


def measure(reps: int) -> tuple[Ratio, dict[str, float]]:
    """(the ratio, every median in seconds)."""
    need_venv()
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise Missing("bwrap not found: the floor (one bwrap launch) cannot be measured")
    launch = bare_launch(bwrap)
    m = interleaved({
        "probe": probe_once,
        "python": lambda: timed([str(PYTHON), "-c", "pass"])[0],
        "bare_python": lambda: timed([SYSTEM_PYTHON, "-I", "-S", "-c", "pass"])[0],
        "launch": lambda: timed(launch)[0],
        "cli_startup": lambda: timed([str(CLI), "probe", "--json", "--only", "platform"])[0],
    }, reps)
    floor = m["python"] + m["launch"]
    strict = m["probe"] / (m["bare_python"] + m["launch"])
    ratio = Ratio("a", "probe --json", m["probe"], floor,
                  "venv python start-up + one full-unshare bwrap running python3 -I -S -c pass", TARGET,
                  notes=(f"CLI start-up alone (probe --only platform) {m['cli_startup'] * 1000:.1f} ms",
                         f"against python3 -I -S start-up instead of the venv's: {strict:.2f} x"))
    return ratio, m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7, metavar="N", help="repetitions of each side (default 7)")
    p.add_argument("--check", action="store_true", help="exit 1 when the ratio misses its target")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    try:
        ratio, m = measure(args.reps)
    except Missing as e:
        print(f"probe_bench: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps({"reps": args.reps, "load": load(), "ratios": [ratio.to_json()],
                          "medians_ms": {k: round(v * 1000, 2) for k, v in m.items()}}, indent=2))
    else:
        print(figure("probe --json", m["probe"], f"median of {args.reps}, {load()}"))
        print(figure("  CLI start-up, no child", m["cli_startup"], "probe --json --only platform"))
        print(figure("venv python -c pass", m["python"]))
        print(figure("python3 -I -S -c pass", m["bare_python"]))
        print(figure("full-unshare bwrap launch", m["launch"], "python3 -I -S -c pass inside"))
        print(ratio.line())
        for note in ratio.notes:
            print(f"    {note}")
    return 1 if args.check and not ratio.ok else 0


if __name__ == "__main__":
    sys.exit(main())
