"""`run --mode vm`, host side: boot the VM once, run runners/vm/suite.py inside, bring the verdict,
the output and the reports back.

    code = run_vm(options, timeout=args.timeout, say=say, progress=progress)   # runners/modes.py

On a terminal (`progress`), the long steps are stages: the image build when it is not cached, the
boot, and in the guest the cgroup set-up, each leg with its verdict word, the controls
(runners/vm/qemu.py follows what runners/vm/suite.py announces).

Exit code: the guest's combined code (0 green, 1 red, 2 bad input, 75 nothing ran); 75 as well when the
guest never started the command, since nothing was tested; 1 when the suite started but the VM had to
be killed (a timeout is red, never a pass). A VM that cannot be used at all (no qemu, no image) raises
its Refusal (processes/exits.py; qemu.py VmUnusable is one) with the reason.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sandbox_conformance.processes import owner
from sandbox_conformance.processes.children import minimal_env
from sandbox_conformance.processes.exits import EXIT_FAIL, EXIT_UNAVAILABLE, Refusal
from sandbox_conformance.runners.progress import HEARTBEAT, Progress
from sandbox_conformance.runners.vm import image as vm_image
from sandbox_conformance.runners.vm import qemu as vm
from sandbox_conformance.runners.witness_args import WitnessOptions

REPO = Path(__file__).resolve().parents[2]
TEST_USER = "sbxc-test"
# Variables the guest's suite needs from ours; the cgroup root is the guest's own (cgroup_setup).
FORWARD_ENV_PREFIX = "SANDBOX_CONFORMANCE_"
DROPPED_ENV = ("SANDBOX_CONFORMANCE_CGROUP_ROOT", "SANDBOX_CONFORMANCE_MODE",
               "SANDBOX_CONFORMANCE_PRINT_MODE")
# Per task launch inside the guest: the witness command's --timeout (30 s by default, sized for a
# native host). Under TCG a launch (bwrap, a python -I -S task, the host-side observer) is 5x-60x
# slower, and four VM runs at once on 2 cores went red at 30 s (issue 19); under KVM the native
# bound holds.
LAUNCH_TIMEOUT: dict[vm.Accel, float] = {vm.Accel.kvm: 30.0, vm.Accel.tcg: 120.0}


def launch_timeout(accel: vm.Accel) -> float:
    return LAUNCH_TIMEOUT[accel]


def legs(options: WitnessOptions, passwd: Callable[[str], object] = pwd.getpwnam) -> list[str]:
    """root, plus the unprivileged user when it exists (the host's /etc/passwd is the guest's):
    container mode's two legs. An explicit --as-user is the one leg asked for."""
    if options.as_user:
        return [f"{options.as_user}:{options.as_user}"]
    try:
        passwd(TEST_USER)
    except KeyError:
        return ["root"]
    return ["root", f"{TEST_USER}:{TEST_USER}"]


def guest_env(environ: Mapping[str, str]) -> dict[str, str]:
    env = minimal_env()
    env.update({k: v for k, v in environ.items()
                if k.startswith(FORWARD_ENV_PREFIX) and k not in DROPPED_ENV})
    env["HOME"] = "/root"
    return env


def inside_options(options: WitnessOptions, workdir: Path) -> tuple[WitnessOptions, dict[str, str]]:
    """Input files copied into the shared workdir (any host path would do, but one under /run is
    hidden by the guest's own /run); reports written there as NAME-{label}.EXT and copied back.
    Returns (options for the guest, {guest report pattern: host report pattern})."""
    reports: dict[str, str] = {}

    def infile(path: str, key: str) -> str:
        dest = workdir / f"in-{key}-{Path(path).name}"
        shutil.copyfile(path, dest)
        return str(dest)

    def outfile(path: str, key: str) -> str:
        p = Path(path)
        inside = str(workdir / f"out-{key}-{{label}}{p.suffix}")
        reports[inside] = str(p.with_name(f"{p.stem}-{{label}}{p.suffix}"))
        return inside

    return options.relocated(infile, outfile), reports


def guest_argv(opts: WitnessOptions, *, leg_specs: list[str], summary: Path, timeout: float,
               python: str = sys.executable, controls: Sequence[str] = (),
               controls_json: Path | None = None, launch_timeout: float | None = None) -> list[str]:
    argv = [python, "-m", "sandbox_conformance.runners.vm.suite", "--summary", str(summary),
            "--timeout", str(timeout)]
    if launch_timeout is not None:
        argv += ["--launch-timeout", str(launch_timeout)]
    for leg in leg_specs:
        argv += ["--leg", leg]
    if controls:
        argv += ["--controls", ",".join(controls)]
        if controls_json is not None:
            argv += ["--controls-json", str(controls_json)]
    return [*argv, "--", *opts.argv()]


def cached_image() -> vm_image.VmImage | None:
    """The image ensure_image would return without building, or None when it would build (or fail):
    its own first step (runners/vm/image.py ensure_image: the kernel package apt names, then
    load_image of that version's directory), asked first only to know whether a build stage is due."""
    try:
        version = vm_image.kernel_version_of(vm_image.resolve_kernel_package())
        return vm_image.load_image(vm_image.default_cache_root() / version)
    except vm_image.ImageNotBuilt:
        return None


def prepare_image(progress: Progress) -> vm_image.VmImage:
    """The cached image, or one built now in a progress stage: a kernel download, its unpacking and
    an initramfs, a minute or more with nothing else on the screen. ImageNotBuilt when it cannot be had."""
    image = cached_image()
    if image is not None:
        return image
    with progress.stage("vm image build", heartbeat=HEARTBEAT) as st:
        image = vm_image.ensure_image()
        st.result = image.kernel_version
    return image


def run_vm(options: WitnessOptions, *, timeout: float, say: Callable[[str], None],
           environ: Mapping[str, str] | None = None, controls: Sequence[str] = (),
           controls_json: str | None = None, progress: Progress | None = None,
           leg_report: Callable[[str, str], None] | None = None) -> int:
    """`controls`: negative controls run in the same boot after the suite (runners/vm/suite.py), their
    JSON copied to `controls_json`; a misbehaving control makes the exit code red. `leg_report(label,
    path)`: told each leg's --json report once it is copied back (runners/modes.py Context)."""
    environ = os.environ if environ is None else environ
    progress = progress or Progress.off()
    try:
        image = prepare_image(progress)
    except vm_image.ImageNotBuilt as e:
        raise Refusal(f"VM image: {e} (scripts/vm-deps builds it)") from None
    leg_specs = legs(options)
    # /var/tmp: on the host's / (never a tmpfs the guest would not see through 9p), and outside /run.
    # The owner's stamp in the name: a run that is SIGKILLed leaves this behind (qemu dies with it),
    # and the next run sweeps it, here (processes/owner.py).
    owner.sweep_once()
    with tempfile.TemporaryDirectory(prefix=f"sbxc-vm.{owner.stamp()}.", dir="/var/tmp") as tmp:
        workdir = Path(tmp)
        opts, reports = inside_options(options, workdir)
        summary = workdir / "summary.json"
        guest_controls = workdir / "out-controls.json"
        # No qemu, a workdir the guest cannot share: VmUnusable, a Refusal, goes up to the run.
        accel = vm.select_accel(image)
        argv = guest_argv(opts, leg_specs=leg_specs, summary=summary, timeout=timeout, controls=controls,
                          controls_json=guest_controls, launch_timeout=launch_timeout(accel))
        labels = ", ".join(s.split(":")[0] for s in leg_specs)
        say(f"vm: booting {image.kernel_version} under {accel}, legs: {labels}")
        runs = len(leg_specs) + (1 if controls else 0)
        result = vm.run_in_vm(argv, workdir=workdir, timeout=timeout * runs, cwd=str(REPO),
                              env=guest_env(environ), image=image, accel=accel,
                              live=(sys.stdout, sys.stderr), progress=progress)
        for spec in leg_specs:
            label = spec.split(":")[0]
            for inside, host in reports.items():
                produced = Path(inside.replace("{label}", label))
                if produced.exists():
                    shutil.copyfile(produced, host.replace("{label}", label))
                    if leg_report is not None and inside == opts.json:
                        leg_report(label, host.replace("{label}", label))
        if controls_json and guest_controls.exists():
            shutil.copyfile(guest_controls, controls_json)
        boot = f"{result.boot_seconds:.1f}s" if result.boot_seconds is not None else "n/a"
        say(f"vm: {result.accel}, boot {boot}, wall {result.wall_seconds:.1f}s")
        if result.exit_code is None:
            say(f"vm: {result.error}")
            # The command never started: nothing was tested. It started and then hung: red.
            return EXIT_UNAVAILABLE if result.boot_seconds is None else EXIT_FAIL
        try:
            doc = json.loads(summary.read_text())
            for leg in doc.get("legs", []):
                say(f"vm: as {leg['label']}: exit {leg['returncode']} ({leg['seconds']}s)")
            if doc.get("controls"):
                c = doc["controls"]
                say(f"vm: controls {c['names']}: exit {c['returncode']} ({c['seconds']}s)")
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        return result.exit_code
