#!/usr/bin/env python3
"""(a) What `sandbox-conformance probe --json` costs over the work it cannot avoid.

    .venv/bin/python bench/probe_bench.py [--reps N] [--check] [--json]

The floor is what any probe of this host must pay: one interpreter start-up, as the console script
starts it (the venv's python with its site-packages, `-c pass`), plus one full-unshare bwrap running
the smallest observer (`python3 -I -S -c pass`; bench/_common.py bare_launch), since on a healthy host
one launch answers every ladder rung. Where the probe found a container engine CLI (podman, docker),
asking it is work it cannot avoid either, and runs beside the ladder: the floor is then the start-up
plus the longer of the launch and that CLI's own `info --format '{{json .}}'` (the probe's question;
`podman info` alone is ~0.2 s as root, more than every other probe together: bench/README.md, session
12). Both sides interleaved, ratio of the medians. Target: at most 2.5. Also printed, to show where
the time goes: the CLI's own start-up (`probe --json --only platform`: interpreter, the probe
command's imports, no child) and the stricter ratio against the bare interpreter (`python3 -I -S -c
pass`) in place of the venv's.

--check exits 1 when the ratio misses the target; 75 when the venv or bwrap is missing."""

from __future__ import annotations

import argparse
import json
import os
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
    return _probe()[0]


def _probe() -> tuple[float, dict[str, object]]:
    seconds, done = timed([str(CLI), "probe", "--json"])
    doc = json.loads(done.stdout)
    if doc.get("schema") != 1 or not doc.get("findings"):
        raise SystemExit("probe_bench: probe --json did not print a schema-1 document with findings")
    return seconds, doc


def engine_query(doc: dict[str, object]) -> list[str] | None:
    """The engine CLI's `info`, as the container_engine probe asks it (probes/container_engine.py
    attempt), when the probe found one answering; None where it found none."""
    for f in doc.get("findings") or ():  # type: ignore[attr-defined]
        if isinstance(f, dict) and f.get("probe") == "container_engine" and f.get("verdict") == "supported":
            cli = (f.get("facts") or {}).get("cli")
            path = shutil.which(str(cli)) if cli else None
            if path:
                # As root, podman in a mount namespace of its own, as the probe runs it (its overlay
                # driver's self-bind must not outlive the question).
                unshare = shutil.which("unshare") if cli == "podman" and os.geteuid() == 0 else None
                return [*([unshare, "--mount", "--propagation", "private"] if unshare else []),
                        path, "info", "--format", "{{json .}}"]
    return None


def measure(reps: int) -> tuple[Ratio, dict[str, float]]:
    """(the ratio, every median in seconds)."""
    need_venv()
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise Missing("bwrap not found: the floor (one bwrap launch) cannot be measured")
    launch = bare_launch(bwrap)
    engine = engine_query(_probe()[1])
    sides = {
        "probe": probe_once,
        "python": lambda: timed([str(PYTHON), "-c", "pass"])[0],
        "bare_python": lambda: timed([SYSTEM_PYTHON, "-I", "-S", "-c", "pass"])[0],
        "launch": lambda: timed(launch)[0],
        "cli_startup": lambda: timed([str(CLI), "probe", "--json", "--only", "platform"])[0],
    }
    if engine is not None:
        sides["engine"] = lambda: timed(engine)[0]
    m = interleaved(sides, reps)
    beside = max(m["launch"], m.get("engine", 0.0))
    floor = m["python"] + beside
    strict = m["probe"] / (m["bare_python"] + beside)
    against = "venv python start-up + one full-unshare bwrap running python3 -I -S -c pass"
    notes = [f"CLI start-up alone (probe --only platform) {m['cli_startup'] * 1000:.1f} ms",
             f"against python3 -I -S start-up instead of the venv's: {strict:.2f} x"]
    if engine is not None:
        name = Path(engine[engine.index("info") - 1]).name
        against += f", or beside it `{name} info` where longer"
        notes.append(f"`{name} info` alone {m['engine'] * 1000:.1f} ms "
                     f"(without it in the floor: {m['probe'] / (m['python'] + m['launch']):.2f} x)")
    ratio = Ratio("a", "probe --json", m["probe"], floor, against, TARGET, notes=tuple(notes))
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
