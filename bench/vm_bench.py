"""What the VM mode costs on this host: boot + halt, and how much slower work runs inside.

    .venv/bin/python bench/vm_bench.py [--reps N] [--json] [--accel kvm|tcg]

Prints the median guest boot time (kernel start to our stage 2), the median wall time of a whole
`run_in_vm(["/bin/true"])` (qemu start to qemu exit), and for three workloads the native time, the
in-VM time and their ratio: CPU (a python loop), fork+exec (200 x /bin/true from a shell) and one bare
bwrap launch with a user, pid and network namespace (`python3 -I -S -c pass` inside). The in-VM
figures come from one boot that times each workload itself, so boot time is not in them. Exit 75
when the VM cannot run here (no qemu, no image)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sandbox_conformance.processes.children import minimal_env, run  # noqa: E402
from sandbox_conformance.runners.vm import image as vm_image  # noqa: E402
from sandbox_conformance.runners.vm import qemu as vm  # noqa: E402

WORKLOADS = {
    "cpu": ["/usr/bin/python3", "-I", "-S", "-c", "sum(i * i for i in range(3_000_000))"],
    "fork+exec x200": ["/bin/sh", "-c", "i=0; while [ $i -lt 200 ]; do /bin/true; i=$((i+1)); done"],
    "bwrap launch": ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--die-with-parent",
                     "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                     "/usr/bin/python3", "-I", "-S", "-c", "pass"],
}

# Runs inside the guest: times each workload (median of 3) and prints {name: seconds}.
TIMER = """
import json, subprocess, sys, time, statistics
work = json.loads(sys.argv[1])
out = {}
for name, argv in work.items():
    times = []
    for _ in range(3):
        t = time.monotonic()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.monotonic() - t)
    out[name] = statistics.median(times)
print(json.dumps(out))
"""


def native() -> dict[str, float]:
    out = {}
    for name, argv in WORKLOADS.items():
        times = []
        for _ in range(3):
            started = time.monotonic()
            done = run(argv, timeout=300, env=minimal_env())
            if not done.ok:
                raise SystemExit(f"vm_bench: {name} failed natively: {done.stderr_tail()}")
            times.append(time.monotonic() - started)
        out[name] = statistics.median(times)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # --reps, as every bench here names its repetitions (--boots kept for old scripts).
    ap.add_argument("--reps", "--boots", dest="boots", type=int, default=3, metavar="N",
                    help="guest boots to time (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--accel", choices=[a.value for a in vm.Accel], default=None)
    args = ap.parse_args()
    if args.boots < 1:
        ap.error("--reps must be at least 1")
    try:
        image = vm_image.ensure_image()
        accel = vm.Accel(args.accel) if args.accel else vm.select_accel(image)
    except (vm_image.ImageNotBuilt, vm.VmUnusable) as e:
        print(f"vm_bench: cannot run the VM here: {e}", file=sys.stderr)
        return 75
    boots, walls = [], []
    with tempfile.TemporaryDirectory(prefix="sbxc-vmbench-") as tmp:
        for _ in range(args.boots):
            r = vm.run_in_vm(["/bin/true"], workdir=Path(tmp), timeout=60, image=image, accel=accel)
            if r.exit_code != 0 or r.boot_seconds is None:
                print(f"vm_bench: boot failed: {r.error}", file=sys.stderr)
                return 1
            boots.append(r.boot_seconds)
            walls.append(r.wall_seconds)
        r = vm.run_in_vm(["/usr/bin/python3", "-I", "-S", "-c", TIMER, json.dumps(WORKLOADS)],
                         workdir=Path(tmp), timeout=900, image=image, accel=accel)
        if r.exit_code != 0:
            print(f"vm_bench: in-VM timing failed: {r.error or r.stderr[-500:]}", file=sys.stderr)
            return 1
        inside = json.loads(r.stdout)
    here = native()
    if args.json:
        print(json.dumps({"reps": args.boots, "accel": str(accel),
                          "boot_median_s": round(statistics.median(boots), 3),
                          "run_in_vm_wall_median_s": round(statistics.median(walls), 3),
                          "workloads": {name: {"native_ms": round(here[name] * 1000, 2),
                                               "vm_ms": round(inside[name] * 1000, 2),
                                               "slowdown": round(inside[name] / here[name], 2)}
                                        for name in WORKLOADS}}, indent=2))
        return 0
    print(f"accel                 {accel}")
    print(f"guest boot            {statistics.median(boots):8.2f} s (median of {args.boots}; "
          "kernel -> stage 2)")
    print(f"run_in_vm(true) wall  {statistics.median(walls):8.2f} s (qemu start -> exit)")
    for name in WORKLOADS:
        print(f"{name:<21} {here[name] * 1000:8.1f} ms native {inside[name] * 1000:9.1f} ms in VM "
              f"x{inside[name] / here[name]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
