"""`bwrap`: the resolved binary (never one from the current directory), its version, setuid bit and file
capabilities, and --disable-userns confirmed by a trial launch."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sandbox_conformance.probes import bwrap
from sandbox_conformance.probes.finding import Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Completed

# struct vfs_cap_data, revision 2, effective flag, permitted = {CAP_SYS_ADMIN}: what
# `setcap cap_sys_admin=ep FILE` writes (<linux/capability.h>).
SYS_ADMIN_EP = bytes.fromhex("01000002" "00002000" "00000000" "00000000" "00000000")


class Runner:
    def __init__(self, *answers: Completed) -> None:
        self.answers, self.calls = list(answers), []

    def __call__(self, argv: Sequence[str], *, timeout: float, input: str | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | None = None) -> Completed:
        assert timeout > 0
        self.calls.append(tuple(argv))
        return self.answers.pop(0)


def done(stdout: str = "", stderr: str = "", rc: int | None = 0, **kw: object) -> Completed:
    return Completed(("fake",), rc, stdout, stderr, 0.01, **kw)  # type: ignore[arg-type]


def host_with(tmp_path: Path, runner: Runner, *, mode: int = 0o755, path: str | None = None) -> Host:
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True, exist_ok=True)
    fake = bin_ / "bwrap"
    fake.write_text("#!/bin/false\n")
    fake.chmod(mode)
    return Host(root=tmp_path, proc=tmp_path / "proc", env={"PATH": path or str(bin_)}, runner=runner)


def only(host: Host):
    [f] = bwrap.probe(host)
    assert f.probe == "bwrap" and "\n" not in f.reason
    return f


def test_found_version_and_feature_in_one_launch(tmp_path: Path) -> None:
    runner = Runner(done("bubblewrap 0.8.0\n"))
    f = only(host_with(tmp_path, runner))
    assert f.verdict is Verdict.supported
    assert f.facts["path"] == str(tmp_path / "bin/bwrap")
    assert (f.facts["version"], f.facts["version_tuple"]) == ("0.8.0", [0, 8, 0])
    assert f.facts["features"] == {"disable_userns": True}
    assert (f.facts["setuid"], f.facts["caps"]) == (False, None)
    assert runner.calls == [(str(tmp_path / "bin/bwrap"), "--disable-userns", "--version")]


def test_an_old_bwrap_refuses_the_option_and_is_asked_its_version_alone(tmp_path: Path) -> None:
    runner = Runner(done("", "bwrap: Unknown option --disable-userns\n", 1), done("bubblewrap 0.4.1\n"))
    f = only(host_with(tmp_path, runner))
    assert f.verdict is Verdict.supported
    assert (f.facts["version"], f.facts["version_tuple"]) == ("0.4.1", [0, 4, 1])
    assert f.facts["features"] == {"disable_userns": False}
    assert runner.calls[1][1:] == ("--version",)


def test_setuid_bit_is_reported(tmp_path: Path) -> None:
    f = only(host_with(tmp_path, Runner(done("bubblewrap 0.8.0\n")), mode=0o4755))
    assert f.facts["setuid"] is True
    assert "setuid" in f.reason


def test_not_found_is_unsupported_without_a_launch(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    runner = Runner()
    host = Host(root=tmp_path, env={"PATH": str(tmp_path / "empty")}, runner=runner)
    [finding] = bwrap.probe(host)
    assert (finding.verdict, finding.facts["path"]) == (Verdict.unsupported, None)
    assert runner.calls == []


def test_an_installed_bwrap_that_is_not_executable_is_named_with_its_mode(tmp_path: Path) -> None:
    """Issue 12: shutil.which skips a file without X_OK, so this read "not found ... apt-get install
    bubblewrap" while bwrap sat at its path with a broken mode."""
    runner = Runner()
    host = host_with(tmp_path, runner, mode=0o644)
    f = only(host)
    where = str(tmp_path / "bin/bwrap")
    assert f.verdict is Verdict.denied
    assert f.reason.startswith(f"bwrap found at {where} but not executable (mode -rw-r--r-- 0644)")
    assert "apt-get install" not in f.reason
    assert (f.facts["path"], f.facts["executable"]) == (where, False)
    assert runner.calls == [], "nothing is launched that cannot be executed"


def test_the_ladder_says_bwrap_could_not_be_run_not_that_it_is_missing(tmp_path: Path) -> None:
    from sandbox_conformance.probes import ladder

    host = host_with(tmp_path, Runner(done(json.dumps({"unshare": None}) + "\n")), mode=0o644)
    by = {f.probe: f for f in ladder.probe(host)}
    assert by["netns"].facts["cause"] == "no_bwrap"
    assert "not executable (mode -rw-r--r-- 0644)" in by["netns"].reason


def test_a_bwrap_in_the_current_directory_is_never_used(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH entries that are relative ("." or empty) would make whatever sits in the cwd the sandbox."""
    (tmp_path / "empty").mkdir()
    host = host_with(tmp_path, Runner(), path=f".::bin:{tmp_path / 'empty'}")
    monkeypatch.chdir(tmp_path)  # ./bin/bwrap exists relative to here
    assert Path("bin/bwrap").exists()
    [f] = bwrap.probe(host)
    assert (f.verdict, f.facts["path"]) == (Verdict.unsupported, None)


def test_timeout_is_unknown_and_unrunnable_is_denied(tmp_path: Path) -> None:
    f = only(host_with(tmp_path / "slow", Runner(done("", "", None, timed_out=True))))
    assert f.verdict is Verdict.unknown
    refused = Runner(done("", "bwrap: Permission denied", 127, not_found=True))
    g = only(host_with(tmp_path / "noexec", refused))
    assert g.verdict is Verdict.denied


def test_as_user_runs_the_trial_through_setpriv(tmp_path: Path) -> None:
    runner = Runner(done("bubblewrap 0.8.0\n"))
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "bwrap").write_text("")
    (bin_ / "bwrap").chmod(0o755)
    only(Host(root=tmp_path, env={"PATH": str(bin_)}, runner=runner, as_user="bob"))
    assert runner.calls[0][:2] == ("setpriv", "--reuid=bob")


@pytest.mark.parametrize(("raw", "text"), [
    (SYS_ADMIN_EP, "cap_sys_admin=ep"),
    # revision 3 (namespaced file caps) carries a rootid after the two words of each set.
    (bytes.fromhex("00000003" "00300000" "00000000" "00000000" "00000000" "e8030000"),
     "cap_net_admin,cap_net_raw=p"),
    (bytes.fromhex("0100"), "malformed (0100)"),
])
def test_decode_file_capabilities(raw: bytes, text: str) -> None:
    assert bwrap.decode_caps(raw) == text


def test_a_real_security_capability_xattr_matches_getcap(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fake = bin_ / "bwrap"
    fake.write_text("")
    fake.chmod(0o755)
    try:
        os.setxattr(fake, "security.capability", SYS_ADMIN_EP)
    except OSError as e:
        if e.errno in (errno.EPERM, errno.ENOTSUP):
            pytest.skip(f"cannot set security.capability here: {errno.errorcode[e.errno]}")
        raise
    f = only(Host(root=tmp_path, env={"PATH": str(bin_)}, runner=Runner(done("bubblewrap 0.8.0\n"))))
    assert f.facts["caps"] == "cap_sys_admin=ep"
    getcap = shutil.which("getcap") or shutil.which("getcap", path="/usr/sbin:/sbin")
    if getcap:  # the independent oracle, when libcap2-bin is installed
        out = subprocess.run([getcap, str(fake)], capture_output=True, text=True, timeout=10).stdout
        assert out.split()[-1] == f.facts["caps"]


@pytest.mark.integration
def test_the_real_bwrap(bwrap_path: str) -> None:
    f = only(Host())
    real = os.path.realpath(bwrap_path)
    oracle = subprocess.run([real, "--version"], capture_output=True, text=True, timeout=10).stdout
    oracle = oracle.split()[-1]
    assert f.verdict is Verdict.supported
    assert (f.facts["path"], f.facts["version"]) == (real, oracle)
    assert f.facts["setuid"] is bool(os.stat(real).st_mode & stat.S_ISUID)
    assert f.facts["features"]["disable_userns"] is (tuple(f.facts["version_tuple"]) >= (0, 8))
