"""The report people read (issue 15): `run` and `witness` as a user runs them, through a pseudo-terminal
and through a pipe. The default output is the promise table and the verdict, never pytest's own
(session header, warnings, `configfile:`); progress and colour appear only on a terminal, and not
with NO_COLOR; `--format markdown` renders the same rows as the text table. Then the renderer, the
progress lines and the log policy on their own."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from sandbox_conformance.conformance import output, render
from sandbox_conformance.conformance.render import Format, Style
from sandbox_conformance.runners.progress import Progress, result_word

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# What pytest prints of itself; none of it belongs in the default output.
PYTEST_INTERNALS = (
    "test session starts", "PytestAssertRewriteWarning", "configfile:", "rootdir:", "Traceback",
)
VERDICT = re.compile(r"^sandbox-conformance: (PASS|FAIL|REFUSED|ERROR) mode=(\w+) exit=(\d+) time=\d+\.\d+s$")
LINE = re.compile(r"^(\S.*?): (kept|BROKEN|not tested)(?:: (.*))?$")  # the `lines` form
PROGRESS = "sandbox-conformance run: native run: "
COLUMNS = 110
TIMEOUT = 180.0


# ---- running a command as a user would -----------------------------------------------------------------


class Ran:
    def __init__(self, rc: int, stdout: str, stderr: str) -> None:
        self.rc, self.stdout, self.stderr = rc, stdout, stderr

    @property
    def both(self) -> str:
        return self.stdout + self.stderr


def _winsize(fd: int, columns: int) -> None:
    # struct winsize {rows, cols, xpixel, ypixel} (tty_ioctl(4) TIOCSWINSZ): a fresh pty is 0x0.
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))


def sbxc(*args: str, tty_out: bool, tty_err: bool, env: Mapping[str, str]) -> Ran:
    """`sandbox-conformance ARGS` with stdout and stderr each on its own pseudo-terminal or pipe,
    read to the end within TIMEOUT (the process group is killed after it)."""
    fds: dict[str, tuple[int, int | None]] = {}  # name -> (read end, write end given to the child)
    for name, on_tty in (("out", tty_out), ("err", tty_err)):
        if on_tty:
            master, slave = pty.openpty()
            _winsize(slave, COLUMNS)
            fds[name] = (master, slave)
        else:
            r, w = os.pipe()
            fds[name] = (r, w)
    proc = subprocess.Popen([sys.executable, "-m", "sandbox_conformance", *args], cwd=REPO, env=dict(env),
                            stdin=subprocess.DEVNULL, stdout=fds["out"][1], stderr=fds["err"][1],
                            start_new_session=True)
    for _, w in fds.values():
        os.close(w)  # our copies: the read ends see EOF (a pty master: EIO) once the child's are gone
    chunks: dict[int, list[bytes]] = {r: [] for r, _ in fds.values()}
    open_fds = set(chunks)
    deadline = time.monotonic() + TIMEOUT
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"sandbox-conformance {' '.join(args)}: still running after {TIMEOUT:.0f}s")
            ready, _, _ = select.select(list(open_fds), [], [], min(left, 1.0))
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the pty's last slave fd closed (pty(7))
                    data = b""
                if data:
                    chunks[fd].append(data)
                else:
                    open_fds.discard(fd)
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for r, _ in fds.values():
            os.close(r)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def text(name: str) -> str:
        # A terminal turns \n into \r\n (termios ONLCR): undo it, so both kinds compare alike.
        return b"".join(chunks[fds[name][0]]).decode(errors="replace").replace("\r\n", "\n")

    return Ran(rc, text("out"), text("err"))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A user's environment, with the state directory (pytest's logs) under tmp_path."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8", "TERM": "xterm-256color", "XDG_STATE_HOME": str(tmp_path / "state")}


@pytest.fixture
def native(bwrap_path: str, env: dict[str, str]) -> None:
    """`run --mode native` must run here: where it refuses, these tests skip with its reason."""
    done = subprocess.run([sys.executable, "-m", "sandbox_conformance", "run", "--mode", "native",
                           "--print-mode"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.skip(f"run --mode native refuses here: {done.stdout.strip()}")


def logs(env: Mapping[str, str]) -> list[Path]:
    d = Path(env["XDG_STATE_HOME"]) / "sandbox-conformance" / "logs"
    return sorted(d.iterdir()) if d.is_dir() else []


def assert_no_pytest_internals(ran: Ran) -> None:
    for word in PYTEST_INTERNALS:
        assert word not in ran.both, f"{word!r} in the default output:\n{ran.both[-3000:]}"


def assert_ends_with_verdict(ran: Ran, word: str) -> None:
    last = ran.stderr.strip().splitlines()[-1]
    m = VERDICT.match(ANSI.sub("", last))
    assert m and m.group(1) == word and m.group(2) == "native" and int(m.group(3)) == ran.rc, ran.stderr


# ---- run, as a user runs it -------------------------------------------------------------------------------


def test_on_a_terminal_run_shows_the_coloured_table_progress_and_no_pytest(native: None,
                                                                            env: dict[str, str]) -> None:
    ran = sbxc("run", "--mode", "native", tty_out=True, tty_err=True, env=env)
    assert ran.rc == 0, ran.both[-3000:]
    assert_no_pytest_internals(ran)
    assert_ends_with_verdict(ran, "PASS")
    assert ANSI.search(ran.stdout), "no colour on a terminal"
    plain = ANSI.sub("", ran.stdout)
    assert plain.startswith("PROMISE "), plain[:500]
    assert plain.strip().splitlines()[-1].startswith("witness: "), plain[-500:]
    assert PROGRESS + "started" in ran.stderr and PROGRESS + "done in " in ran.stderr, ran.stderr
    rows = render.parse_table_text(plain.rsplit("\nwitness: ", 1)[0])
    assert rows and {v for _, v, _ in rows} <= set(render.VERDICTS), rows
    table = plain.rsplit("\nwitness: ", 1)[0].splitlines()
    assert all(len(ln) <= COLUMNS for ln in table), "the table is wider than the terminal"
    assert logs(env) == [], "a passing run kept its pytest log"


def test_through_a_pipe_run_prints_lines_without_colour_or_progress(native: None,
                                                                    env: dict[str, str]) -> None:
    ran = sbxc("run", "--mode", "native", tty_out=False, tty_err=False, env=env)
    assert ran.rc == 0, ran.both[-3000:]
    assert_no_pytest_internals(ran)
    assert_ends_with_verdict(ran, "PASS")
    assert not ANSI.search(ran.both), "colour through a pipe"
    assert PROGRESS not in ran.stderr, "progress through a pipe"
    lines = ran.stdout.strip().splitlines()
    # The parsed form (mrcheck/tiers.py, the tests): `promise: verdict[: detail]`, then the summary.
    assert lines[-1].startswith("witness: ") and ": PASS [" in lines[-1], lines[-1]
    assert all(re.match(r"^\S.*: (kept|BROKEN|not tested)(: .*)?$", ln) for ln in lines[:-1]), lines


def test_progress_follows_stderr_and_the_table_follows_stdout(native: None, env: dict[str, str]) -> None:
    ran = sbxc("run", "--mode", "native", tty_out=False, tty_err=True, env=env)
    assert ran.rc == 0, ran.both[-3000:]
    assert PROGRESS + "started" in ran.stderr, ran.stderr
    assert not ran.stdout.startswith("PROMISE") and not ANSI.search(ran.stdout), ran.stdout[:500]


def test_no_color_keeps_the_table_and_progress_but_drops_the_colour(native: None,
                                                                    env: dict[str, str]) -> None:
    ran = sbxc("run", "--mode", "native", tty_out=True, tty_err=True, env={**env, "NO_COLOR": "1"})
    assert ran.rc == 0, ran.both[-3000:]
    assert not ANSI.search(ran.both), "colour despite NO_COLOR=1"
    assert ran.stdout.startswith("PROMISE ") and PROGRESS + "done in " in ran.stderr


def test_markdown_renders_the_same_rows_as_the_table(native: None, env: dict[str, str]) -> None:
    table = sbxc("run", "--mode", "native", tty_out=True, tty_err=False, env={**env, "NO_COLOR": "1"})
    md = sbxc("run", "--mode", "native", "--format", "markdown", tty_out=False, tty_err=False, env=env)
    assert table.rc == md.rc == 0, table.both[-2000:] + md.both[-2000:]
    assert_no_pytest_internals(md)
    table_rows = render.parse_table_text(table.stdout.rsplit("\nwitness: ", 1)[0])
    md_rows = render.parse_table_markdown(md.stdout)

    def norm(rows: list[render.Row]) -> list[render.Row]:
        return [(p, v, " ".join(d.split())) for p, v, d in rows]  # a wrapped detail lost its line breaks

    assert norm(md_rows) == norm(table_rows) and len(md_rows) > 5, (md.stdout, table.stdout)
    assert md.stdout.startswith("#### sandbox-conformance witness: PASS\n\n| promise | verdict |"), \
        md.stdout[:300]
    # The summary line ends every form alike.
    last = md.stdout.strip().splitlines()[-1]
    assert last == table.stdout.strip().splitlines()[-1], (md.stdout, table.stdout)


def test_a_red_run_keeps_pytests_report_and_names_it_at_the_end(native: None, env: dict[str, str]) -> None:
    # A launcher with no sandbox at all: every isolation promise is BROKEN, by assertion.
    ran = sbxc("run", "--mode", "native", "--launcher", "env", "--", "-k", "network or pid",
               tty_out=True, tty_err=True, env=env)
    assert ran.rc == 1, ran.both[-3000:]
    assert_no_pytest_internals(ran)
    assert_ends_with_verdict(ran, "FAIL")
    assert re.search(r"\x1b\[[0-9;]*31m", ran.stdout), "BROKEN is not red on a terminal"
    named = re.findall(r"pytest's report: (\S+\.log)", ran.stderr)
    kept = logs(env)
    assert [Path(n) for n in named] == kept and len(kept) == 1, (ran.stderr, kept)
    report = kept[0].read_text()
    assert "test session starts" in report and "AssertionError" in report, report[-2000:]


def test_verbose_shows_pytests_report_on_stderr_and_keeps_no_log(native: None, env: dict[str, str]) -> None:
    ran = sbxc("run", "--mode", "native", "-v", tty_out=False, tty_err=False, env=env)
    assert ran.rc == 0, ran.both[-3000:]
    assert "test session starts" in ran.stderr and "test session starts" not in ran.stdout
    assert logs(env) == []


def test_log_file_gets_pytests_report_where_asked(native: None, env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "witness.log"
    ran = sbxc("witness", "--log", str(log), tty_out=False, tty_err=False, env=env)
    assert ran.rc == 0, ran.both[-3000:]
    assert_no_pytest_internals(ran)
    assert "test session starts" in log.read_text()
    assert logs(env) == [] and "pytest's report" not in ran.stderr


# ---- witness, as a user runs it -----------------------------------------------------------------------


def test_witness_on_a_terminal_and_through_a_pipe(native: None, env: dict[str, str]) -> None:
    tty = sbxc("witness", "--", "-k", "network or pid", tty_out=True, tty_err=True, env=env)
    pipe = sbxc("witness", "--", "-k", "network or pid", tty_out=False, tty_err=False, env=env)
    assert tty.rc == pipe.rc == 0, tty.both[-2000:] + pipe.both[-2000:]
    for ran in (tty, pipe):
        assert_no_pytest_internals(ran)
    assert ANSI.search(tty.stdout) and not ANSI.search(pipe.both)
    table = render.parse_table_text(ANSI.sub("", tty.stdout).rsplit("\nwitness: ", 1)[0])
    assert all(LINE.match(ln) for ln in pipe.stdout.splitlines()[:-1]), pipe.stdout
    assert [(p, v, " ".join(d.split())) for p, v, d in table] == render.parse_lines_text(pipe.stdout), \
        (tty.stdout, pipe.stdout)
    assert {"network", "pid"} <= {p for p, _, _ in table}, table
    assert ANSI.sub("", tty.stdout).splitlines()[-1] == pipe.stdout.splitlines()[-1]


def test_usage_errors_of_the_output_options_are_one_line(env: dict[str, str], tmp_path: Path) -> None:
    for args in (("witness", "-v", "--log", str(tmp_path / "x.log")),
                 ("witness", "--json", "-", "--format", "markdown"),
                 ("witness", "--log", str(tmp_path / "nowhere" / "x.log")),
                 ("run", "--format", "html")):
        ran = sbxc(*args, tty_out=False, tty_err=False, env=env)
        assert ran.rc == 2, (args, ran.both)
        assert "Traceback" not in ran.stderr and ran.stdout == "", (args, ran.both)


# ---- the renderer on its own --------------------------------------------------------------------------

ROWS: list[render.Row] = [
    ("masked {state}/db", "BROKEN", "nothing is mounted at {state}/db | a pipe"),
    ("read_only /usr", "kept", ""),
    ("network", "not tested", "no network namespace: " + " ".join(["why"] * 30)),
    ("read_only {state}", "kept", "partly: 1 of 2 witnesses ran"),
]


def test_a_family_is_grouped_and_named_once() -> None:
    table = render.table_text(ROWS)
    assert [ln.split()[0] for ln in table[1:]] == ["masked", "read_only", "{state}", "network"], table
    assert render.parse_lines_text("\n".join([*render.lines_text(ROWS), "witness: 2 kept"])) == \
        render.grouped(ROWS)
    assert render.lines_text(ROWS)[1:3] == ["read_only /usr: kept", "read_only {state}: kept: partly: 1 of 2 "
                                            "witnesses ran"]


@pytest.mark.parametrize("width", [0, 60, 80, 200])
def test_the_table_reads_back_as_the_rows_it_was_made_of(width: int) -> None:
    table = "\n".join(render.table_text(ROWS, width=width))
    back = render.parse_table_text(table)
    assert [(p, v, " ".join(d.split())) for p, v, d in back] == \
        [(p, v, " ".join(d.split())) for p, v, d in render.grouped(ROWS)]
    start = table.splitlines()[0].index("WHAT")
    if width - start >= render.MIN_DETAIL:
        assert all(len(ln) <= width for ln in table.splitlines()), table
    else:  # too narrow a column to wrap into: one line per row, however long
        assert len(table.splitlines()) == 1 + len(ROWS), table


def test_markdown_escapes_what_would_end_a_cell_and_reads_back() -> None:
    md = render.table_markdown(ROWS)
    assert md[2] == "| `masked {state}/db` | **BROKEN** | nothing is mounted at {state}/db \\| a pipe |"
    assert render.parse_table_markdown("\n".join(md)) == render.grouped(ROWS)
    assert render.md_code("a`b|c") == "`` a`b\\|c ``"


def test_a_refusal_in_markdown_leads_with_what_is_needed() -> None:
    text = render.refusal_markdown("sandbox-conformance run", "no bwrap on PATH", because=["a <b>"],
                                   ways_on=["apt-get install bubblewrap"], notes=["n*"])
    assert text[0] == "#### sandbox-conformance run: not tested here" and "REFUSED" not in "\n".join(text)
    assert "- because: a \\<b>" in text and "- apt-get install bubblewrap" in text and "Note: n\\*" in text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("environ", "tty", "colour"), [
    ({}, True, True),
    ({}, False, False),
    ({"NO_COLOR": "1"}, True, False),
    ({"NO_COLOR": ""}, True, True),  # no-color.org: present *and not empty*
    ({"TERM": "dumb"}, True, False),
])
def test_colour_only_on_a_terminal_and_never_with_no_color(environ: dict[str, str], tty: bool,
                                                           colour: bool) -> None:
    stream = _Tty() if tty else io.StringIO()
    assert render.use_colour(stream, environ) is colour
    assert render.resolve(None, stream) is (Format.table if tty else Format.lines)
    assert render.resolve("markdown", stream) is Format.markdown


def test_the_summary_keeps_its_shape_with_colour() -> None:
    style = Style(colour=True)
    line = ANSI.sub("", render.lines_text([("pid", "BROKEN", "x")], style)[0])
    assert line == "pid: BROKEN: x"


# ---- progress and the log policy on their own ------------------------------------------------------------


def test_progress_is_silent_off_a_terminal_and_times_each_stage() -> None:
    quiet = io.StringIO()
    with Progress("p", stream=quiet).stage("build"):
        pass
    assert quiet.getvalue() == ""
    clock = iter([0.0, 12.34, 12.34]).__next__
    loud = _Tty()
    with Progress("p", stream=loud, clock=clock).stage("build") as st:
        st.result = "exit 0"
    assert loud.getvalue() == "p: build: started\np: build: done in 12.3s (exit 0)\n"
    loud = _Tty()
    with pytest.raises(KeyboardInterrupt), Progress("p", stream=loud).stage("vm boot"):
        raise KeyboardInterrupt
    assert loud.getvalue().splitlines()[-1].startswith("p: vm boot: stopped after ")


def test_a_heartbeat_says_a_long_stage_is_alive() -> None:
    loud = _Tty()
    st = Progress("p", stream=loud).begin("vm boot", heartbeat=0.05)
    time.sleep(0.3)
    st.end("kvm")
    beats = [ln for ln in loud.getvalue().splitlines() if ln.endswith("so far")]
    assert beats and loud.getvalue().splitlines()[-1].startswith("p: vm boot: done in "), loud.getvalue()


def test_only_the_innermost_stage_with_a_heartbeat_beats() -> None:
    """A build inside a run: one `so far` line per beat, the build's, and the run's again after it."""
    loud = _Tty()
    progress = Progress("p", stream=loud)
    run = progress.begin("container run", heartbeat=0.05)
    with progress.stage("container image build", heartbeat=0.05):
        time.sleep(0.4)
        during = loud.getvalue().splitlines()
    time.sleep(0.4)
    run.end("PASS")
    beats = [ln for ln in during if ln.endswith("so far")]
    assert beats and all(ln.startswith("p: container image build: ") for ln in beats), during
    after = loud.getvalue().splitlines()[len(during):]
    assert any(ln.startswith("p: container run: ") and ln.endswith("so far") for ln in after), after


def test_a_stage_ended_from_two_threads_says_so_once() -> None:
    loud = _Tty()
    st = Progress("p", stream=loud, clock=iter([0.0, 4.0, 4.0, 4.0]).__next__).begin("vm boot")
    threads = [threading.Thread(target=st.end, args=("tcg",)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loud.getvalue() == "p: vm boot: started\np: vm boot: done in 4.0s (tcg)\n"
    assert st.ended


@pytest.mark.parametrize(("code", "word"), [(0, "PASS"), (1, "FAIL"), (2, "ERROR"), (75, "REFUSED"),
                                            (None, "timed out"), (-9, "exit -9")])
def test_a_legs_result_word_is_the_verdict_lines(code: int | None, word: str) -> None:
    assert result_word(code) == word


def test_run_log_is_removed_when_the_run_passed_and_kept_when_not(tmp_path: Path) -> None:
    environ = {"XDG_STATE_HOME": str(tmp_path)}
    for code, kept in ((0, 0), (None, 0), (1, 2)):
        log = output.RunLog.choose(verbose=False, log=None, environ=environ)
        assert log.path is not None and log.path.is_file()
        # container and VM modes copy each leg's log back as STEM-LABEL.log; the stem itself stays empty
        for label in ("root", "sbxc"):
            log.path.with_name(f"{log.path.stem}-{label}.log").write_text("pytest said\n")
        assert len(log.finish(code)) == kept
        assert len(log.files()) == kept
        for p in log.files():
            p.unlink()
    assert output.RunLog.choose(verbose=True, log=None, environ=environ).path is None
    assert output.RunLog.choose(verbose=False, log="x.log", environ=environ).path is None


def test_a_home_that_does_not_exist_gets_no_log_and_nothing_made_for_one(tmp_path: Path) -> None:
    # Issue 28: root made HOME's whole tree (/nowhere/x/.local/state/sandbox-conformance/logs).
    nowhere = tmp_path / "nowhere" / "x"
    assert output.new_log("witness", {"HOME": str(nowhere)}) is None
    named = {"XDG_STATE_HOME": str(nowhere / "state"), "HOME": str(tmp_path)}
    assert output.new_log("witness", named) is None
    assert output.RunLog.choose(verbose=False, log=None, environ={"HOME": str(nowhere)}).path is None
    assert sorted(tmp_path.iterdir()) == []
    # A HOME that exists gets its ~/.local/state made as ever; a named XDG_STATE_HOME is made too.
    made = output.new_log("witness", {"HOME": str(tmp_path)})
    assert made is not None and made.is_relative_to(tmp_path / ".local" / "state")
    made = output.new_log("witness", {"XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(nowhere)})
    assert made is not None and made.is_relative_to(tmp_path / "state")


def test_old_logs_are_pruned_to_the_newest(tmp_path: Path) -> None:
    for i in range(output.KEEP + 5):
        p = tmp_path / f"witness-{i:03}.log"
        p.write_text("x")
        os.utime(p, (1000 + i, 1000 + i))
    output.prune(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == output.KEEP and left[0] == "witness-005.log"


# ---- one launcher failure, printed once (issue 29) ---------------------------------------------------

BOOM = "harness error: launcher 'x': exited 1; stderr: boom"


@pytest.mark.parametrize("fmt", [Format.lines, Format.table, Format.markdown])
def test_one_launch_failure_is_printed_once_whatever_the_format(fmt: Format) -> None:
    rows = [("network", "not tested", BOOM), ("pid", "not tested", BOOM), ("uts", "kept", "")]
    stdout = io.StringIO()
    out = output.WitnessOutput(fmt, Style(), False, None, False, False, stdout, io.StringIO())
    out.report(rows, problems=[BOOM], head="witness: 1 kept", word="FAIL", tail="[3 witnesses]")
    text = stdout.getvalue()
    assert text.count("stderr: boom") == 1, text
    assert text.count("said once, below") == 2, text


def test_a_row_that_failed_otherwise_keeps_its_own_detail() -> None:
    rows = [("pid", "not tested", "harness error: the second launch: exited 3"), ("uts", "BROKEN", "x")]
    assert render.said_once(rows, [BOOM]) == rows


def test_mr_check_counts_the_rows_that_point_to_the_failure_said_once() -> None:
    from sandbox_conformance.mrcheck.tiers import failure_lines

    lines = [f"network: not tested: {render.SAID_BELOW}", f"pid: not tested: {render.SAID_BELOW}", BOOM,
             "witness: 0 kept, 0 BROKEN, 2 not tested (profile p, launcher 'x'): FAIL"]
    assert failure_lines(lines)[0] == f"{BOOM} (2 promises not tested because of it)"
