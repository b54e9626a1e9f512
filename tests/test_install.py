"""Installed as a user installs it (issue 30): the wheel holds one top-level name, and a project with
its own `conformance/`, `probes/`, `runners/` and `commands/` packages runs its pytest, ours as a
plugin, the console script and `python -m sandbox_conformance` without either shadowing the other."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER_PACKAGES = ("conformance", "probes", "runners", "commands")
TIMEOUT = 180
# Left out of the user's environment: CI's switches (SANDBOX_CONFORMANCE_REQUIRE) and this pytest's.
OURS_AND_PYTHONS = ("PYTEST_", "PYTHON", "SANDBOX_CONFORMANCE_")


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, a fresh venv with it and its dependencies installed): pip, as a user runs it."""
    top = tmp_path_factory.mktemp("install")
    # From a copy of what git tracks (symlinks kept): pip builds in the tree it is given, and its
    # build/ and *.egg-info must not land in the checkout.
    tracked = _run(["git", "-C", str(REPO), "ls-files", "-z"]).stdout.split("\0")
    src = top / "src"
    for rel in filter(None, tracked):
        dst = src / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / rel).is_symlink():
            dst.symlink_to(os.readlink(REPO / rel))
        elif (REPO / rel).is_file():
            shutil.copy2(REPO / rel, dst)
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(top / "dist"),
                  str(src)])
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (top / "dist").glob("sandbox_conformance-*.whl")
    venv = top / "venv"
    made = _run(["/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable, "-m", "venv",
                 str(venv)])
    assert made.returncode == 0, made.stderr[-2000:]
    pip = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)])
    if pip.returncode != 0:
        pytest.skip(f"the dependencies cannot be installed into a fresh venv here: {pip.stderr[-500:]}")
    return wheel, venv


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project whose own packages have our layers' names, and a test that imports one."""
    for name in USER_PACKAGES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'user-{name}'\n")
    (tmp_path / "test_mine.py").write_text(
        "import commands, conformance, probes, runners\n\n"
        "def test_my_packages_are_mine():\n"
        "    assert [m.WHO for m in (conformance, probes, runners, commands)] == "
        f"{[f'user-{n}' for n in ('conformance', 'probes', 'runners', 'commands')]!r}\n")
    return tmp_path


def test_the_wheel_installs_one_top_level_name(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
        entry_points = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
    assert tops == {"sandbox_conformance"}
    assert "sandbox_conformance.conformance.plugin" in entry_points
    assert "sandbox_conformance.commands.cli:main" in entry_points


def test_a_project_with_its_own_conformance_package_runs_its_pytest(installed: tuple[Path, Path],
                                                                      project: Path) -> None:
    """Our plugin loads (its options are there) and the project's own `conformance` is the one it
    imports: before issue 30, loading the plugin failed with `No module named 'conformance.plugin'`."""
    _, venv = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith(OURS_AND_PYTHONS)}
    done = _run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project,
                env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
    helped = _run([str(venv / "bin" / "python"), "-m", "pytest", "--help"], cwd=project, env=env)
    assert "--sbxc-launcher" in helped.stdout, helped.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_the_installed_command_runs_the_suite_beside_the_users_packages(installed: tuple[Path, Path],
                                                                        project: Path, how: str,
                                                                        bwrap_path: str) -> None:
    """The witness suite, run from inside that project (its cwd first on sys.path for `-m`), through
    the wheel's own files: the same verdict line as from the checkout."""
    _, venv = installed
    argv = ([str(venv / "bin" / "sandbox-conformance")] if how == "console script"
            else [str(venv / "bin" / "python"), "-m", "sandbox_conformance"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(OURS_AND_PYTHONS)}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    done = _run([*argv, "witness"], cwd=project, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("witness: ") and ": PASS [" in last, last
    assert "site-packages/sandbox_conformance" in _run(
        [str(venv / "bin" / "python"), "-c", "import sandbox_conformance.probes as p; print(p.__file__)"],
        cwd=project, env=env).stdout
