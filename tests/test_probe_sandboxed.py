"""`sandboxed`: each structural signal firing alone on a fake host, none firing, the nested-userns
decision table, and the real shapes: root on this host (not sandboxed, despite the stray
/.dockerenv), the unprivileged test user, and inside `bwrap --unshare-user --disable-userns`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from sandbox_conformance.probes import sandboxed
from sandbox_conformance.probes.finding import Verdict
from sandbox_conformance.probes.host import Host
from sandbox_conformance.processes.children import Completed, run

REPO = Path(__file__).resolve().parent.parent
VENV_PYTHON = REPO / ".venv/bin/python"

CLEAN_STATUS = "Name:\tpython3\nNoNewPrivs:\t0\nSeccomp:\t0\nSeccomp_filters:\t0\n"


class FakeTrial:
    """Stands in for the child's unshare(CLONE_NEWUSER): answers with a given errno name."""

    def __init__(self, errno_name: str | None = None, *, timed_out: bool = False) -> None:
        self.errno_name, self.timed_out, self.calls = errno_name, timed_out, []

    def __call__(self, argv, *, timeout, input=None, env=None, cwd=None) -> Completed:
        self.calls.append(tuple(argv))
        if self.timed_out:
            return Completed(tuple(argv), None, "", "", timeout, timed_out=True)
        return Completed(tuple(argv), 0, json.dumps({"rc": -1 if self.errno_name else 0,
                                                     "errno": self.errno_name}) + "\n", "", 0.01)


def fake_host(tmp_path: Path, *, env=None, uid_map="         0          0 4294967295\n", status=CLEAN_STATUS,
              max_userns="15000\n", pid1="systemd", trial=None, euid=0) -> Host:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "1").mkdir()
    (proc / "sys/user").mkdir(parents=True)
    (proc / "self/uid_map").write_text(uid_map)
    (proc / "self/status").write_text(status)
    (proc / "sys/user/max_user_namespaces").write_text(max_userns)
    (proc / "1/comm").write_text(pid1 + "\n")
    (proc / "1/cmdline").write_text(f"/usr/bin/{pid1}\0--flag\0")
    return Host(root=tmp_path, proc=proc, sys=tmp_path / "sys", env=env or {}, runner=trial or FakeTrial(),
                euid=euid)


def test_no_signal_is_not_detected_and_the_trial_ran(tmp_path):
    trial = FakeTrial(None)
    (f,) = sandboxed.probe(fake_host(tmp_path, trial=trial))
    assert f.verdict is Verdict.not_detected
    assert f.facts["signals"] == []
    assert trial.calls and trial.calls[0][1:4] == ("-I", "-S", "-c")


def test_a_stray_dockerenv_alone_is_not_a_sandbox(tmp_path):
    (tmp_path / ".dockerenv").write_text("")
    (f,) = sandboxed.probe(fake_host(tmp_path))
    assert f.verdict is Verdict.not_detected


def _promise(tmp_path):
    return fake_host(tmp_path, env={sandboxed.PROMISE_ENV: "1"})


def _uid_map(tmp_path):
    return fake_host(tmp_path, uid_map="0 1000 1\n")


def _nnp(tmp_path):
    return fake_host(tmp_path, status=CLEAN_STATUS.replace("NoNewPrivs:\t0", "NoNewPrivs:\t1"))


def _seccomp(tmp_path):
    return fake_host(tmp_path, status=CLEAN_STATUS.replace("Seccomp:\t0", "Seccomp:\t2"))


def _nested(tmp_path):
    return fake_host(tmp_path, trial=FakeTrial("ENOSPC"))


def _flatpak(tmp_path):
    (tmp_path / ".flatpak-info").write_text("[Application]\nname=org.example\n")
    return fake_host(tmp_path)


def _pid1(tmp_path):
    return fake_host(tmp_path, pid1="bwrap")


@pytest.mark.parametrize(("signal", "make"), [
    ("promise", _promise), ("uid_map", _uid_map), ("no_new_privs", _nnp), ("seccomp", _seccomp),
    ("nested_userns_refused", _nested), ("flatpak_info", _flatpak), ("pid1_bwrap", _pid1),
])
def test_each_signal_alone_is_detected_and_named(tmp_path, signal, make):
    (f,) = sandboxed.probe(make(tmp_path))
    assert f.verdict is Verdict.detected
    assert f.facts["signals"] == [signal]
    assert signal in f.reason


@pytest.mark.parametrize("value", ["", "0", "false", "no"])
def test_a_promise_of_no_is_not_a_signal(tmp_path, value):
    (f,) = sandboxed.probe(fake_host(tmp_path, env={sandboxed.PROMISE_ENV: value}))
    assert f.verdict is Verdict.not_detected


@pytest.mark.parametrize(("err", "euid", "max_userns", "unpriv", "refused"), [
    (None, 0, "100", None, False),
    ("ENOSPC", 1000, "100", None, True),  # an ancestor's limit: bwrap --disable-userns
    ("ENOSPC", 1000, "0", None, False),  # our own sysctl is 0: host policy
    ("EUSERS", 0, "100", None, True),  # 32 levels deep
    ("EPERM", 0, "100", None, True),  # root, sysctls open: something around us forbids it
    ("EPERM", 1000, "100", "0", False),  # Debian's unprivileged_userns_clone=0: host policy
    ("EPERM", 1000, "100", "1", True),
    ("EINVAL", 0, "100", None, False),  # no CONFIG_USER_NS
])
def test_nested_refusal_counts_only_when_the_local_sysctls_allow_it(err, euid, max_userns, unpriv, refused):
    assert sandboxed.nested_refused(err, euid=euid, max_userns=max_userns, unpriv_clone=unpriv) is refused


def test_enospc_in_the_initial_user_namespace_is_our_own_count_not_a_parent_sandbox(tmp_path):
    # A user holding max_user_namespaces namespaces already (browsers, flatpak) on the host itself.
    assert not sandboxed.nested_refused("ENOSPC", euid=1000, max_userns="10", unpriv_clone=None, initial=True)
    host = fake_host(tmp_path, max_userns="10\n", trial=FakeTrial("ENOSPC"), euid=1000)
    (host.proc / "self/ns").mkdir()
    (host.proc / "self/ns/user").symlink_to(f"user:[{sandboxed.USER_INIT_INO}]")
    (f,) = sandboxed.probe(host)
    assert f.verdict is Verdict.not_detected, f.reason
    assert f.evidence["/proc/self/ns/user"] == "user:[4026531837]"
    # In another user namespace, the same ENOSPC is an ancestor's limit.
    (host.proc / "self/ns/user").unlink()
    (host.proc / "self/ns/user").symlink_to("user:[4026532500]")
    (f,) = sandboxed.probe(host)
    assert f.verdict is Verdict.detected and f.facts["signals"] == ["nested_userns_refused"]


@pytest.mark.parametrize("missing", ["self/uid_map", "self/status", "sys/user/max_user_namespaces"])
def test_a_signal_that_could_not_be_read_is_unknown_not_a_clean_host(tmp_path, missing):
    # No /proc (bwrap without --proc, a chroot): nothing fired because nothing could be read. The
    # nested trial's ENOSPC means nothing without the local limit beside it.
    host = fake_host(tmp_path, trial=FakeTrial("ENOSPC" if "max_user" in missing else None))
    (host.proc / missing).unlink()
    (host.proc / "self/ns").mkdir()
    (host.proc / "self/ns/user").symlink_to("user:[4026532500]")  # a kernel with user namespaces
    (f,) = sandboxed.probe(host)
    assert f.verdict is Verdict.unknown, f.reason
    assert f"/proc/{missing}" in f.reason


def test_a_trial_that_did_not_run_is_unknown_when_nothing_else_fired(tmp_path):
    (f,) = sandboxed.probe(fake_host(tmp_path, trial=FakeTrial(timed_out=True)))
    assert f.verdict is Verdict.unknown
    assert "timed out" in f.reason


def test_a_trial_that_did_not_run_does_not_hide_other_signals(tmp_path):
    (f,) = sandboxed.probe(fake_host(tmp_path, uid_map="0 1000 1\n", trial=FakeTrial(timed_out=True)))
    assert f.verdict is Verdict.detected
    assert f.facts["signals"] == ["uid_map"]


# --- the real host shapes -------------------------------------------------------------------------

SNIPPET = ("import json; from sandbox_conformance.probes import sandboxed; "
           "from sandbox_conformance.probes.host import Host; "
           "f = sandboxed.probe(Host())[0]; print(json.dumps(f.to_json()))")


def run_snippet(prefix: list[str], timeout: float = 60) -> dict:
    # processes.children: on a timeout the whole process group goes, bwrap's children included.
    done = run([*prefix, str(VENV_PYTHON), "-c", SNIPPET], timeout=timeout, cwd=str(REPO),
               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.integration
def test_root_on_this_host_is_not_sandboxed_despite_a_stray_dockerenv(root_only):
    status = Path("/proc/self/status").read_text()
    if "NoNewPrivs:\t1" in status or "Seccomp:\t2" in status:
        pytest.skip("this test process itself runs under NoNewPrivs/seccomp: the host is a sandbox")
    (f,) = sandboxed.probe(Host(env={k: v for k, v in os.environ.items() if k != sandboxed.PROMISE_ENV}))
    assert f.verdict is Verdict.not_detected, f.reason
    assert f.evidence["nested unshare(CLONE_NEWUSER)"] == "ok"


@pytest.mark.integration
def test_the_unprivileged_user_outside_any_sandbox_is_not_sandboxed(test_user):
    if not VENV_PYTHON.exists():
        pytest.skip("no .venv: run make setup")
    doc = run_snippet(["setpriv", f"--reuid={test_user}", f"--regid={test_user}", "--init-groups", "--"])
    assert doc["verdict"] == "not_detected", doc


@pytest.mark.integration
def test_inside_bwrap_disable_userns_is_detected_naming_the_signals(bwrap_path, root_only):
    if not VENV_PYTHON.exists():
        pytest.skip("no .venv: run make setup")
    doc = run_snippet([bwrap_path, "--unshare-user", "--disable-userns", "--ro-bind", "/", "/",
                       "--dev", "/dev", "--proc", "/proc", "--chdir", str(REPO), "--"])
    assert doc["verdict"] == "detected", doc
    # bwrap always sets NoNewPrivs; its map is `0 0 1`, not the identity; --disable-userns makes a
    # nested unshare(CLONE_NEWUSER) fail with ENOSPC.
    assert {"uid_map", "no_new_privs", "nested_userns_refused"} <= set(doc["facts"]["signals"]), doc
    assert doc["evidence"]["nested unshare(CLONE_NEWUSER)"] == "ENOSPC"


@pytest.mark.integration
def test_the_trial_child_reports_an_errno_name_under_isolated_python():
    python = sandboxed.CHILD_PYTHON if os.path.exists(sandboxed.CHILD_PYTHON) else sys.executable
    done = run([python, "-I", "-S", "-c", sandboxed.TRIAL], timeout=30)
    doc = json.loads(done.stdout)
    assert set(doc) == {"rc", "errno"}
    assert (doc["rc"] == 0) == (doc["errno"] is None)


def test_a_kernel_without_user_namespaces_has_no_map_to_read_which_is_no_gap(tmp_path):
    # CONFIG_USER_NS=n: neither /proc/self/uid_map nor /proc/self/ns/user exists (fs/proc/base.c);
    # auto must still go to a container engine there, not refuse for a signal that cannot exist.
    host = fake_host(tmp_path, trial=FakeTrial("EINVAL"))
    (host.proc / "self/uid_map").unlink()
    (f,) = sandboxed.probe(host)
    assert f.verdict is Verdict.not_detected, f.reason
    assert "no user namespaces in this kernel" in f.evidence["/proc/self/uid_map"]
    # With the namespace link there, a missing map is a gap.
    (host.proc / "self/ns").mkdir()
    (host.proc / "self/ns/user").symlink_to("user:[4026531837]")
    assert sandboxed.probe(host)[0].verdict is Verdict.unknown
