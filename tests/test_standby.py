"""`run`'s witness child started before the probes and told afterwards (runners/native.py Standby):
forked where this process has one thread, spawned otherwise; the same child either way (its own
session, parent-death SIGTERM, tracked, a timeout), and one that is never told to go makes nothing
and says nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox_conformance.conformance import handover
from sandbox_conformance.runners.witness_args import WitnessOptions

REPO = Path(__file__).resolve().parent.parent

# Each fork scenario runs in a process of its own: this pytest process may have threads (a plugin's, a
# test's leftovers), and a fork is only made from a process with one.
SCENARIO = textwrap.dedent("""
    import json, os, signal, sys, time
    from sandbox_conformance.conformance import handover
    from sandbox_conformance.processes import cancel
    from sandbox_conformance.probes.finding import Finding, Verdict
    from sandbox_conformance.runners import native
    from sandbox_conformance.runners.witness_args import WitnessOptions

    mode, out = sys.argv[1], sys.argv[2]
    cancel.install("scenario")
    cancel.begin()
    parent_pipe = cancel._state.pipe.fileno()

    def witness_main(values):
        fd = values["standby_fd"]
        try:
            os.fstat(parent_pipe)
            inherited = True
        except OSError:
            inherited = False
        said = handover.await_go(fd)
        sigterm_default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        cancel.install("copy")  # as the witness command does: no guardian of its own
        shares = cancel.guardian_pid() is None and cancel._state.pipe is not None
        key = next(cancel._state.keys)
        facts = {"shares_guardian": shares, "own_keys": key >= os.getpid() << 32,
                 "said": said, "session_leader": os.getsid(0) == os.getpid(), "pid": os.getpid(),
                 "sigterm_default": sigterm_default,
                 "parent_pipe_open": inherited, "env": os.environ.get("SANDBOX_CONFORMANCE_CGROUP_ROOT"),
                 "values": {k: v for k, v in values.items() if k != "standby_fd"},
                 "fd": fd}
        with open(out, "w") as f:
            json.dump(facts, f)
        if mode == "hang" and said is not None:
            time.sleep(60)
        return 3

    os.environ["SANDBOX_CONFORMANCE_CGROUP_ROOT"] = "/dropped"
    options = WitnessOptions(require=True, as_user="nobody" if mode == "other-user" else None)
    with native.Standby(options, timeout=2.0, witness_main=witness_main) as standby:
        forked = standby._forked is not None
        if mode == "discard":
            standby.discard()
            code = None
        else:
            finding = Finding("disable_userns", Verdict.supported, "tried", {})
            code = standby.go([finding])
    cancel.close()
    print(json.dumps({"forked": forked, "code": code}))
""")


def scenario(mode: str, tmp_path: Path) -> tuple[dict[str, object], dict[str, object] | None]:
    out = tmp_path / "child.json"
    done = subprocess.run([sys.executable, "-c", SCENARIO, mode, str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    child = json.loads(out.read_text()) if out.exists() else None
    return json.loads(done.stdout.strip().splitlines()[-1]), child


def test_go_hands_the_findings_to_a_forked_child_in_a_session_of_its_own(tmp_path: Path) -> None:
    parent, child = scenario("go", tmp_path)
    assert parent == {"forked": True, "code": 3}, "the forked witness's own exit code is the run's"
    assert child is not None
    assert child["said"], "the findings came down the pipe"
    doc = json.loads(str(child["said"]))
    assert [f["probe"] for f in doc["findings"]] == ["disable_userns"]
    assert doc["as_user"] is None and doc["environ"] == {"SANDBOX_CONFORMANCE_CGROUP_ROOT": "/dropped"}, \
        "made for root in the run's environment, which the child's differs from: it will re-probe"
    assert child["session_leader"], "a group of its own: a timeout kills all of it"
    assert child["parent_pipe_open"] is True, "the run's guardian pipe is kept in the copy"
    assert child["shares_guardian"], "the copy's install() starts no guardian: it writes to the run's"
    assert child["own_keys"], "the copy's registration keys are its own, never one its parent will use"
    assert child["sigterm_default"], "the parent's stop handlers are not the copy's until it installs its own"
    assert child["env"] is None, "native mode's environment: the inherited cgroup root is dropped"
    # Its options as data, not an argv to parse again: the record's fields, and the pipe.
    assert child["values"]["require"] is True and isinstance(child["fd"], int)
    assert set(child["values"]) == set(WitnessOptions._fields)


def test_a_discarded_child_is_told_nothing_and_reaped(tmp_path: Path) -> None:
    parent, child = scenario("discard", tmp_path)
    assert parent == {"forked": True, "code": None}
    assert child is not None and child["said"] is None, "the pipe ended without GO"


def test_a_child_past_its_timeout_is_killed_with_its_group(tmp_path: Path) -> None:
    parent, child = scenario("hang", tmp_path)
    assert parent == {"forked": True, "code": None}, "None: timed out, as run() says it"
    assert child is not None
    with pytest.raises(ProcessLookupError):
        os.kill(int(child["pid"]), 0)  # type: ignore[call-overload]


def test_with_a_thread_running_the_child_is_spawned_and_a_discarded_one_says_nothing(tmp_path: Path) -> None:
    """The fallback: `python -m sandbox_conformance witness --standby-fd N`, the real command, which exits 0
    without a line and without a layout when the run goes another way."""
    code = textwrap.dedent("""
        import threading
        from sandbox_conformance.runners import native
        from sandbox_conformance.runners.witness_args import WitnessOptions
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        try:
            with native.Standby(WitnessOptions(), timeout=60, witness_main=lambda argv: 99) as standby:
                assert standby._forked is None and standby._spawned is not None
        finally:
            stop.set()
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "", "a discarded witness says nothing"
    assert list(tmp_path.iterdir()) == [], "and makes nothing"


def test_the_pipe_says_go_with_the_record_or_nothing() -> None:
    for written, said in ((handover.GO + b'{"as_user": null}', '{"as_user": null}'), (handover.GO, ""),
                          (b"", None), (b"gone\n", None)):
        r, w = os.pipe()
        os.write(w, written)
        os.close(w)
        assert handover.await_go(r) == said


def test_a_standby_descriptor_that_is_not_open_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "sandbox_conformance", "witness", handover.STANDBY_FLAG,
                           "987"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"sandbox-conformance witness: {handover.STANDBY_FLAG} 987: not an open descriptor"]


@pytest.mark.parametrize("told", ["go", "nothing"])
def test_a_bad_option_found_while_standing_by_is_said_only_once_told_to_go(tmp_path: Path, told: str) -> None:
    """The standing-by witness checks its options while `run` probes; what it finds is said after the
    word to go, as a usage error (exit 2, one line), and never by a witness the run discarded."""
    r, w = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "sandbox_conformance", "witness", handover.STANDBY_FLAG, str(r),
             "--profile", str(tmp_path / "missing.toml")],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=(r,),
            env={**os.environ, "TMPDIR": str(tmp_path)})
    finally:
        os.close(r)
    os.write(w, handover.GO if told == "go" else b"")
    os.close(w)
    out, err = child.communicate(timeout=60)
    if told == "go":
        assert child.returncode == 2, err
        [line] = err.strip().splitlines()
        assert line.startswith("sandbox-conformance witness: ") and "missing.toml" in line
    else:
        assert (child.returncode, out, err) == (0, "", ""), "a discarded witness says nothing"
    assert [p.name for p in tmp_path.iterdir()] == [], "and makes nothing"


def test_go_hands_no_findings_made_for_root_to_a_run_as_another_user(tmp_path: Path) -> None:
    parent, child = scenario("other-user", tmp_path)
    assert parent == {"forked": True, "code": 3}
    assert child is not None and child["said"] == "", "GO, and no record: the child probes for that user"


def test_run_probes_once_and_its_forked_witness_launches_with_those_findings(tmp_path: Path) -> None:
    """Every bwrap `run` and its witness start goes through a logging wrapper: the ladder's trial runs
    once (the run's probe), the witness takes the findings from the pipe instead of trying again,
    and the suite still launches its task."""
    real = shutil.which("bwrap")
    if real is None:
        pytest.skip("no bwrap on PATH")
    bindir, log = tmp_path / "bin", tmp_path / "bwrap.log"
    bindir.mkdir()
    wrapper = bindir / "bwrap"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    env.pop("SANDBOX_CONFORMANCE_MODE", None)
    done = subprocess.run([sys.executable, "-m", "sandbox_conformance", "run", "--mode", "native", "--json",
                           str(tmp_path / "r.json")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode in (0, 1), done.stderr
    calls = log.read_text().splitlines()
    trials = [c for c in calls if "ladder trial" in c]
    tasks = [c for c in calls if "--hostname sbxc-task" in c]
    assert len(trials) == 1, calls
    # One bwrap per reported task, and the lifecycle and terminal promises' own launches.
    assert len(tasks) == len(json.loads((tmp_path / "r.json").read_text())["tasks"]) + 2 >= 3, calls
