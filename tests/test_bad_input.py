"""Bad input is exit 2 with one line naming the option and what was expected, before any work
(README "exit codes"; issue 28): empty values, outputs that are inputs or each other, special files,
unbounded numbers, users setpriv cannot switch to, launchers that do not exist, /proc as a layout root.

In-process through commands.cli.main, with the cancellation handlers and the guardian left out
(nothing is started before a usage error), so the table runs in about a second."""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_conformance.commands import cli
from sandbox_conformance.processes import cancel

REFERENCE = Path(cli.__file__).resolve().parent.parent / "conformance" / "profiles" / "reference.toml"


@contextlib.contextmanager
def _quiet_cancel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cancel, "install", lambda label, **_kw: None)
    yield


def run_cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with _quiet_cancel(monkeypatch), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as e:  # argparse's own errors (commands/cli.py _Parser.error)
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def one_usage_line(code: int, err: str, *needles: str) -> str:
    lines = err.splitlines()
    # `run` adds its verdict line (`sandbox-conformance: ERROR mode=... exit=2`) after the reason.
    reason = [ln for ln in lines if " ERROR mode=" not in ln]
    assert code == 2, (code, err)
    assert len(reason) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in reason[0], (n, reason[0])
    return reason[0]


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    shutil.copy(REFERENCE, tmp_path / "p.toml")
    (tmp_path / "skips.txt").write_text("# none\n")
    os.mkfifo(tmp_path / "fifo")
    os.symlink("loop", tmp_path / "loop")
    os.link(tmp_path / "p.toml", tmp_path / "hardlink.toml")
    return tmp_path


# ---- empty values: never "the default" -----------------------------------------------------------

EMPTY = [
    ("witness", "--profile"), ("witness", "--adapter"), ("witness", "--expected-skips"),
    ("witness", "--layout-root"), ("witness", "--as-user"),
    ("witness", "--json"), ("witness", "--junitxml"), ("witness", "--log"), ("witness", "--launcher-env"),
    ("witness", "--host-cannot-observe"),
    ("run", "--profile"), ("run", "--adapter"), ("run", "--expected-skips"), ("run", "--as-user"),
    ("run", "--verdict-json"), ("run", "--image"), ("run", "--base-image"),
    ("controls", "--only"), ("controls", "--as-user"),
    ("mr-check", "--base"), ("mr-check", "--config"), ("mr-check", "-C"),
    ("probe", "--require"), ("probe", "--only"), ("probe", "--as-user"),
    ("adapters", "--as-user"),
    ("fleet-report", "--output"), ("fleet-report", "--junit-dir"),
]


# Each option apart (`--flag ''`) and, for a long one, joined (`--flag=`): a short option has no
# joined form to try (a case generated and skipped would be a failure under --require).
EMPTY_FORMS = [
    (c, f, form) for c, f in EMPTY for form in ("apart", "joined") if form == "apart" or f.startswith("--")
]


@pytest.mark.parametrize(
    ("command", "flag", "form"), EMPTY_FORMS, ids=[f"{form}-{c} {f}" for c, f, form in EMPTY_FORMS]
)
def test_an_empty_value_is_a_usage_error_in_every_command(
    monkeypatch: pytest.MonkeyPatch, inputs: Path, command: str, flag: str, form: str
) -> None:
    given = [flag, ""] if form == "apart" else [f"{flag}="]
    extra = [str(inputs)] if command == "fleet-report" else []
    code, _, err = run_cli(monkeypatch, command, *extra, *given)
    one_usage_line(code, err, flag, "empty")


def test_an_empty_positional_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_cli(monkeypatch, "fleet-report", "")
    one_usage_line(code, err, "empty")


@pytest.mark.parametrize("probe", ["platform", "sandboxed", "deployment"])
def test_requiring_a_probe_that_is_never_supported_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                                    probe: str) -> None:
    # They answer detected / not_detected: `--require deployment` exited 1 on a host that was clear.
    code, _, err = run_cli(monkeypatch, "probe", "--require", f"bwrap,{probe}")
    one_usage_line(code, err, "--require", probe, "never supported")


@pytest.mark.parametrize("argv", [["--mode", "native", "--image", "x"], ["--mode", "vm", "--base-image", "x"],
                                  ["--image", "x", "--base-image", "y"]])
def test_an_image_option_no_mode_would_use_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                            argv: list[str]) -> None:
    # They were dropped without a word: a run that did not test the image its user named.
    code, _, err = run_cli(monkeypatch, "run", "--print-mode", *argv)
    one_usage_line(code, err, "image")


# ---- an output is never an input, nor another output ------------------------------------------------

COLLIDE = [
    ("witness", ["--profile", "{p}", "--json", "{p}"], "--json"),
    ("witness", ["--profile", "{p}", "--junitxml", "{p}"], "--junitxml"),
    ("witness", ["--profile", "{p}", "--log", "{p}"], "--log"),
    ("witness", ["--expected-skips", "{s}", "--json", "{s}"], "--json"),
    ("witness", ["--profile", "{p}", "--json", "{d}/./p.toml"], "--json"),
    ("witness", ["--profile", "{p}", "--json", "{d}/hardlink.toml"], "--json"),
    ("witness", ["--json", "{d}/out", "--junitxml", "{d}/out"], "--json"),
    ("witness", ["--json", "{d}/out", "--log", "{d}/out"], "--json"),
    ("run", ["--profile", "{p}", "--json", "{p}"], "--json"),
    ("run", ["--profile", "{p}", "--verdict-json", "{p}"], "--verdict-json"),
    ("run", ["--json", "{d}/out", "--junitxml", "{d}/out"], "--json"),
    ("run", ["--verdict-json", "{d}/out", "--log", "{d}/out"], "--log"),
]


@pytest.mark.parametrize(("command", "argv", "flag"), COLLIDE, ids=[" ".join(a) for _, a, _ in COLLIDE])
def test_no_output_may_replace_an_input_or_another_output(
    monkeypatch: pytest.MonkeyPatch, inputs: Path, command: str, argv: list[str], flag: str
) -> None:
    before = (inputs / "p.toml").read_bytes()
    words = [a.format(p=inputs / "p.toml", s=inputs / "skips.txt", d=inputs) for a in argv]
    code, _, err = run_cli(monkeypatch, command, *words)
    one_usage_line(code, err, flag)
    assert (inputs / "p.toml").read_bytes() == before
    assert (inputs / "skips.txt").read_text() == "# none\n"
    assert not (inputs / "out").exists()


# `--json -` is stdout, by design: not among the cases.
OUTPUTS = [
    (flag, target)
    for flag in ("--junitxml", "--json", "--log")
    for target in ("/dev/full", "/proc/version", "-", "{d}/fifo", "{d}/loop", "{d}")
    if (flag, target) != ("--json", "-")
]


@pytest.mark.parametrize(("flag", "target"), OUTPUTS)
def test_an_output_that_cannot_be_a_report_is_refused_up_front(
    monkeypatch: pytest.MonkeyPatch, inputs: Path, flag: str, target: str
) -> None:
    code, out, err = run_cli(monkeypatch, "witness", flag, target.format(d=inputs))
    one_usage_line(code, err, flag)
    assert "PASS" not in out
    assert not (Path.cwd() / "-").exists()


def test_the_fleet_table_is_never_written_into_a_hosts_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host = tmp_path / "h1"
    host.mkdir()
    (host / "run.json").write_text('{"verdict": "PASS"}')
    code, _, err = run_cli(monkeypatch, "fleet-report", str(tmp_path), "--output", str(host / "run.json"))
    one_usage_line(code, err, "--output", "host directory")
    assert (host / "run.json").read_text() == '{"verdict": "PASS"}'


# ---- bad numbers, names and places --------------------------------------------------------------

NUMBERS = [
    # witness --timeout: the old spelling of --launch-timeout, whose rename notice must not make a
    # bad value two lines.
    ("witness", "--launch-timeout"), ("witness", "--timeout"),
    ("run", "--timeout"), ("run", "--launch-timeout"),
    ("controls", "--timeout"), ("controls", "--launch-timeout"),
]


@pytest.mark.parametrize("value", ["inf", "nan", "1e308", "86401"])
@pytest.mark.parametrize(("command", "flag"), NUMBERS, ids=[f"{c} {f}" for c, f in NUMBERS])
def test_a_timeout_must_be_finite_positive_and_bounded(
    monkeypatch: pytest.MonkeyPatch, command: str, flag: str, value: str
) -> None:
    code, _, err = run_cli(monkeypatch, command, f"{flag}={value}")
    one_usage_line(code, err, flag, "positive number of seconds")


@pytest.mark.parametrize("value", ["inf", "nan", "1e308"])
def test_a_tier_timeout_must_be_finite_and_bounded(tmp_path: Path, value: str) -> None:
    from sandbox_conformance.mrcheck import config

    cfg = tmp_path / "mr.toml"
    cfg.write_text(f'[[tool.sandbox-conformance.tiers]]\nname = "t"\nglobs = ["x/**"]\ntimeout = {value}\n'
                   'run = { kind = "command", argv = ["true"] }\n')
    with pytest.raises(config.InvalidConfig, match="timeout: expected a positive number of seconds"):
        config.load(tmp_path, cfg)


@pytest.mark.parametrize("root", ["/proc"])
def test_a_layout_root_on_a_pseudo_filesystem_is_refused(monkeypatch: pytest.MonkeyPatch, root: str) -> None:
    code, _, err = run_cli(monkeypatch, "witness", "--layout-root", root)
    one_usage_line(code, err, "--layout-root")


@pytest.mark.parametrize("launcher", ["/nonexistent/launcher --task {task_id} --", "no-such-launcher-xyz"])
def test_a_launcher_that_does_not_exist_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, launcher: str
) -> None:
    code, _, err = run_cli(monkeypatch, "witness", "--launcher", launcher)
    one_usage_line(code, err, "--launcher")


def _user_without_own_group() -> str:
    import grp

    for u in pwd.getpwall():
        try:
            grp.getgrnam(u.pw_name)
        except KeyError:
            return u.pw_name
    pytest.skip("every user here has a group of its own name")


@pytest.mark.parametrize("command", ["run"])  # its container and VM legs name the group (user:group)
def test_a_user_whose_primary_group_has_another_name_is_refused_up_front(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("--as-user needs root")
    user = _user_without_own_group()
    code, _, err = run_cli(monkeypatch, command, "--as-user", user)
    one_usage_line(code, err, "--as-user", "primary group")


NO_SUCH_USER = ["witness", "run", "controls", "probe", "adapters", "adapters args runc"]


@pytest.mark.parametrize("given", NO_SUCH_USER)
def test_a_user_that_does_not_exist_is_one_line_in_every_command(
    monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    # `adapters --as-user TYPO` was the listing, exit 0.
    if os.geteuid() != 0 and not given.startswith("adapters"):
        pytest.skip("--as-user needs root: that is the line a user gets first here")
    code, _, err = run_cli(monkeypatch, *given.split(), "--as-user", "sbxc-no-such-user")
    one_usage_line(code, err, "--as-user", "sbxc-no-such-user")


def test_a_witness_launch_switches_to_the_primary_group_by_number() -> None:
    # witness and controls take such a user: setpriv gets the group's number, never its name.
    from sandbox_conformance.conformance.launch import as_user_prefix

    user = _user_without_own_group()
    assert f"--regid={pwd.getpwnam(user).pw_gid}" in as_user_prefix(user)


def test_a_probe_trial_switches_to_the_primary_group_by_number() -> None:
    from sandbox_conformance.probes.host import Host

    user = _user_without_own_group()
    prefix = Host(as_user=user).trial_prefix
    assert f"--regid={pwd.getpwnam(user).pw_gid}" in prefix, prefix


# ---- inputs that are not files to read ------------------------------------------------------------

SPECIAL = ["{d}/fifo", "/dev/zero", "{d}/loop", "{d}"]


@pytest.mark.parametrize("path", SPECIAL)
@pytest.mark.parametrize(("command", "flag"), [("witness", "--profile"), ("witness", "--expected-skips"),
                                               ("mr-check", "--config")])
def test_a_special_file_as_an_input_is_one_line_never_a_hang(
    monkeypatch: pytest.MonkeyPatch, inputs: Path, command: str, flag: str, path: str
) -> None:
    code, _, err = run_cli(monkeypatch, command, flag, path.format(d=inputs))
    one_usage_line(code, err)


LONG_NAME = ["witness --profile", "witness --expected-skips", "witness --layout-root", "witness --json",
             "witness --log", "run --profile", "run --verdict-json", "mr-check -C", "mr-check --config",
             "fleet-report"]


@pytest.mark.parametrize("given", LONG_NAME)
def test_a_path_longer_than_the_kernel_takes_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, given: str
) -> None:
    # ENAMETOOLONG: `mr-check -C` was a traceback (pathlib's is_dir() lets that errno through).
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, *given.split(), "a" * 5000)
    one_usage_line(code, err)


@pytest.mark.parametrize("extra", [["--bogus-pytest-opt"], ["no_such_test_file.py"]])
def test_pytest_arguments_pytest_refuses_are_one_usage_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           extra: list[str]) -> None:
    # Issue 28: three lines (pytest's usage, its error, the log's name) and a table of nothing.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code, out, err = run_cli(monkeypatch, "witness", "--launcher", "true", "--", *extra)
    one_usage_line(code, err, "-- PYTEST ARGS: pytest refused them: ", extra[0])
    assert out == ""
    assert not list((tmp_path / "state").rglob("*.log"))  # nothing was judged: no report kept


@pytest.mark.parametrize("mode", ["native", "container", "vm"])
@pytest.mark.parametrize(("flag", "text", "says"), [
    ("--profile", "[filesystem]\nread_only = 5\n", "profile.name: expected a profile name"),
    ("--expected-skips", "no bar in this line\n", "--expected-skips"),
])
def test_runs_inputs_are_read_and_checked_before_it_probes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str, flag: str, text: str, says: str) -> None:
    """What a profile or an expected-skips file says does not depend on the mode: one line, exit 2, and
    no probe, decision or witness run before it (issue 30: one validation, before any work)."""
    bad = tmp_path / "bad"
    bad.write_text(text)
    code, _, err = run_cli(monkeypatch, "run", "--mode", mode, flag, str(bad))
    line = one_usage_line(code, err, says)
    assert line.startswith("sandbox-conformance run: ")
    assert "mode " not in err.replace("mode=", ""), err  # no decision was said: nothing was probed


# ---- matrix: the same checks, before any column runs -----------------------------------------------

MATRIX_BAD = [
    (["--json", "{fifo}"], "--json"),  # a special file: the old matrix renamed its JSON over /dev/full
    (["--markdown", "-"], "--markdown"), (["--junitxml", "-"], "--junitxml"),
    (["--json", "{d}/m", "--markdown", "{d}/m"], "--json"),
    (["--profile", "{d}/p.toml", "--json", "{d}/p.toml"], "--json"),
    (["--timeout", "nan"], "--timeout"), (["--timeout", "inf"], "--timeout"),
    (["--timeout", "1e308"], "--timeout"), (["--reports", "{d}/p.toml"], "--reports"),
    (["--reports", "{d}", "--json", "{d}/reference.json"], "--json"),
    (["--reports", "/proc/sbxc-none/reports"], "--reports"),  # made with its parents: where is tried
    (["--sandboxes", "reference,reference"], "--sandboxes"), (["--profile", "{fifo}"], "--profile"),
    (["--reports", "{long}"], "--reports"), (["--profile", "{long}"], "--profile"),  # ENAMETOOLONG
]


@pytest.mark.parametrize(("argv", "flag"), MATRIX_BAD, ids=[" ".join(a) for a, _ in MATRIX_BAD])
def test_matrix_refuses_bad_outputs_and_numbers_before_any_column_runs(
    monkeypatch: pytest.MonkeyPatch, inputs: Path, argv: list[str], flag: str
) -> None:
    from sandbox_conformance.commands import matrix

    def no_column(*_: object, **__: object) -> None:
        raise AssertionError("a column ran: the bad input was not caught first")

    monkeypatch.setattr(matrix, "run_column", no_column)
    fifo = inputs / "fifo"  # the fixture's
    before = (inputs / "p.toml").read_bytes()
    code, _, err = run_cli(monkeypatch, "matrix", *(a.format(d=inputs, fifo=fifo, long="a" * 5000)
                                                    for a in argv))
    one_usage_line(code, err, flag)
    assert (inputs / "p.toml").read_bytes() == before and fifo.is_fifo()
