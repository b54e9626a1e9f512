#!/usr/bin/env python3
"""How much does `sandbox-conformance probe --json` cost over the bare operations it has to attempt?

Bare operations: one interpreter start-up (the venv python, `-c pass`) plus one throwaway bwrap per
ladder rung (`userns`, `userns.map`, `netns`, `pidns.proc`, `disable_userns`), each with the flags
that rung needs, running the smallest observer a rung can have: `python3 -I -S -c pass` (a rung that
ran nothing inside could not see whether lo is up or the nested unshare is refused; the witness
benchmark uses the same floor), one after another. Both sides run in the same process,
interleaved (probe, bare, probe, bare, ...) so a noisy neighbour hits both alike; the figure is the
ratio of the medians. Target: at most 2.0.

  .venv/bin/python bench/probe_bench.py [--reps N] [--json] [--check]

--check exits 1 when the ratio exceeds --target (default 2.0). The ratio against the same bare
operations run concurrently (as the probe itself runs them) is printed too, as a stricter figure, and
so is the CLI's own start-up (`probe --only platform`: interpreter, imports, no child), to show where the
time goes."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from probes.run import Completed, run  # noqa: E402  (after the path set-up, on purpose)

TIMEOUT = 60.0
# The flags each ladder rung needs (probes/ladder.py BWRAP_ARGS), minus the program it runs inside.
RUNG_ARGS: dict[str, tuple[str, ...]] = {
    "userns": ("--unshare-user", "--ro-bind", "/", "/"),
    "userns.map": ("--unshare-user", "--uid", "0", "--gid", "0", "--ro-bind", "/", "/"),
    "netns": ("--unshare-user", "--unshare-net", "--ro-bind", "/", "/"),
    "pidns.proc": ("--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc"),
    "disable_userns": ("--unshare-user", "--disable-userns", "--ro-bind", "/", "/"),
}


def timed(argv: list[str]) -> tuple[float, Completed]:
    started = time.perf_counter()
    done = run(argv, timeout=TIMEOUT, cwd="/")
    return time.perf_counter() - started, done


def must(done: Completed, what: str) -> None:
    if not done.ok:
        raise SystemExit(f"probe_bench: {what} failed (exit {done.returncode}): {done.stderr_tail()}")


def bare_argvs(python: str, bwrap: str) -> list[list[str]]:
    observer = ["/usr/bin/python3", "-I", "-S", "-c", "pass"]
    return [[python, "-c", "pass"]] + [[bwrap, *args, "--", *observer] for args in RUNG_ARGS.values()]


def bare_sequential(argvs: list[list[str]]) -> float:
    total = 0.0
    for argv in argvs:
        seconds, done = timed(argv)
        must(done, " ".join(argv))
        total += seconds
    return total


def bare_concurrent(argvs: list[list[str]]) -> float:
    # The interpreter has to start before anything else can happen; the rungs can overlap.
    started = time.perf_counter()
    must(run(argvs[0], timeout=TIMEOUT, cwd="/"), "interpreter start-up")
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(argvs)) as pool:
        for done in pool.map(lambda a: run(a, timeout=TIMEOUT, cwd="/"), argvs[1:]):
            must(done, " ".join(done.argv))
    return time.perf_counter() - started


def probe_once(cli: str) -> float:
    seconds, done = timed([cli, "probe", "--json"])
    must(done, "sandbox-conformance probe --json")
    doc = json.loads(done.stdout)
    if doc.get("schema") != 1 or not doc.get("findings"):
        raise SystemExit("probe_bench: probe --json did not print a schema-1 document with findings")
    return seconds


def cli_startup_once(cli: str) -> float:
    """`probe --json --only platform`: interpreter, the probe command's imports and the cheapest probe
    (files only, no child). Where the ratio goes. (`--help` would import every subcommand.)"""
    seconds, done = timed([cli, "probe", "--json", "--only", "platform"])
    must(done, "sandbox-conformance probe --only platform")
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7, help="repetitions of each side (default 7)")
    p.add_argument("--target", type=float, default=2.0, help="the ratio to meet (default 2.0)")
    p.add_argument("--check", action="store_true", help="exit 1 when the ratio exceeds --target")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    python = str(REPO / ".venv/bin/python")
    cli = str(REPO / ".venv/bin/sandbox-conformance")
    bwrap = shutil.which("bwrap")
    for path, what in ((python, "the venv python"), (cli, "the sandbox-conformance script")):
        if not os.access(path, os.X_OK):
            print(f"probe_bench: {what} is missing at {path}: run `make setup`", file=sys.stderr)
            return 75
    if bwrap is None:
        print("probe_bench: bwrap not found: the bare operations cannot be measured", file=sys.stderr)
        return 75
    argvs = bare_argvs(python, bwrap)
    # One warm-up of each side: page cache and dentries, not what we are measuring.
    probe_once(cli)
    bare_sequential(argvs)
    probe_t, seq_t, conc_t, start_t = [], [], [], []
    for _ in range(args.reps):
        probe_t.append(probe_once(cli))
        seq_t.append(bare_sequential(argvs))
        conc_t.append(bare_concurrent(argvs))
        start_t.append(cli_startup_once(cli))
    probe_m, seq_m, conc_m, start_m = (statistics.median(x) for x in (probe_t, seq_t, conc_t, start_t))
    ratio, strict = probe_m / seq_m, probe_m / conc_m
    result = {
        "reps": args.reps, "target": args.target,
        "probe_median_s": round(probe_m, 4), "bare_median_s": round(seq_m, 4),
        "bare_concurrent_median_s": round(conc_m, 4), "cli_startup_median_s": round(start_m, 4),
        "ratio": round(ratio, 3), "ratio_vs_concurrent_bare": round(strict, 3),
        "bare_operations": ["python -c pass", *(f"bwrap {r} python3 -I -S -c pass" for r in RUNG_ARGS)],
        "ok": ratio <= args.target,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"probe --json median        {probe_m * 1000:8.1f} ms  ({args.reps} reps)")
        print(f"  of which CLI start-up    {start_m * 1000:8.1f} ms  (`probe --only platform`: no child)")
        print(f"bare operations median     {seq_m * 1000:8.1f} ms  (python start-up + {len(RUNG_ARGS)} bwrap "
              f"rungs, one after another)")
        print(f"bare, rungs concurrent     {conc_m * 1000:8.1f} ms")
        print(f"ratio                      {ratio:8.2f}  (target <= {args.target})")
        print(f"ratio vs concurrent bare   {strict:8.2f}")
    return 1 if args.check and not result["ok"] else 0


if __name__ == "__main__":
    sys.exit(main())
