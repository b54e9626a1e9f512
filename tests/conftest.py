"""The project's own tests. Skips are promises: SANDBOX_CONFORMANCE_REQUIRE=1 turns every skip into a
failure unless the test is listed, with its reason, in tests/expected-skips.txt."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
EXPECTED_SKIPS = TESTS / "expected-skips.txt"
TEST_USER = os.environ.get("SANDBOX_CONFORMANCE_TEST_USER", "sbxc-test")


def require_switch() -> bool:
    return os.environ.get("SANDBOX_CONFORMANCE_REQUIRE", "") not in ("", "0")


def expected_skips() -> dict[str, str]:
    """`test id | reason` lines; '#' starts a comment."""
    out: dict[str, str] = {}
    if EXPECTED_SKIPS.exists():
        for line in EXPECTED_SKIPS.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                nodeid, _, reason = line.partition("|")
                out[nodeid.strip()] = reason.strip()
    return out


def _interrupt(signum: int, _frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # once: a second signal would only abort the teardown
    raise KeyboardInterrupt(signal.Signals(signum).name)


def pytest_configure(config: pytest.Config) -> None:
    # A cancelled `make test` tears its fixtures down (the Docker tier's dockerd, VM scratch) as ^C
    # does: SIGTERM and SIGHUP become the same KeyboardInterrupt (docs/cancellation.md).
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
    # A red witness run keeps its pytest log under $XDG_STATE_HOME (conformance/output.py): the many
    # red-by-design runs of this suite keep theirs in a directory of the session's, removed after it.
    global _STATE_HOME
    _STATE_HOME = tempfile.mkdtemp(prefix="pytest-sbxc-state-")
    os.chmod(_STATE_HOME, 0o755)
    os.environ["XDG_STATE_HOME"] = _STATE_HOME


_STATE_HOME: str | None = None


def pytest_unconfigure(config: pytest.Config) -> None:
    if _STATE_HOME is not None:
        shutil.rmtree(_STATE_HOME, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and require_switch() and not hasattr(report, "wasxfail"):
        base = item.nodeid.split("[", 1)[0]
        allowed = expected_skips()
        if item.nodeid not in allowed and base not in allowed:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            report.outcome = "failed"
            report.longrepr = (f"skipped under SANDBOX_CONFORMANCE_REQUIRE=1 and not listed in "
                               f"{EXPECTED_SKIPS.name}: {reason}")


@pytest.fixture(scope="session")
def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root on this host")


@pytest.fixture(scope="session")
def test_user() -> str:
    """The unprivileged user integration tests run bwrap as (made by scripts/test-host-setup)."""
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        pytest.skip(f"no user {TEST_USER!r}: run scripts/test-host-setup as root")
    if os.geteuid() != 0:
        pytest.skip("switching to the test user needs root")
    return TEST_USER


@pytest.fixture(scope="session")
def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if not path:
        pytest.skip("bwrap not installed (apt-get install bubblewrap)")
    return path
