"""Many hosts (issue 16): the Ansible collection in fleet/ and `sandbox-conformance fleet-report`.

The renderer first, on report directories written here (every shape of host: passed, broken in one
leg of two, refused, unreachable, stopped, unreadable files, gathered by hand). Then the real thing:
the collection installed from the checkout with ansible-galaxy and its playbook run against an
inventory of real targets reached through Ansible's own connection plugins:
- `local`: this host (`local` connection; the tool is already installed, the venv's);
- `plain`: a container of the Docker tier's image with Docker's defaults (`community.docker.docker`),
  which must come back refused, its cause in the table (seccomp refuses user namespaces);
- `shaped`: a container with container mode's flags (runners/container.py security_flags), where
  the suite runs natively and passes;
- `down`: a container that exists but was never started, and `closed`: ssh to a loopback port nobody
  listens on. Both are reported unreachable, and neither hides the others' rows.
The role installs the tool in both containers from the checkout (Debian packages, offline pip)."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fleet_ansible import BIN, REPO, Controller, by, missing, read_json, sections, write_json

from sandbox_conformance.commands import fleet_report
from sandbox_conformance.processes.children import Completed, run
from sandbox_conformance.runners.container import security_flags

if TYPE_CHECKING:
    from docker_tier import DockerTier

# The Docker tier's session fixture; imported as a plugin only (an import here would stop pytest
# rewriting its asserts). Any test using it may be the one that pays for the tier's set-up.
pytest_plugins = ["docker_tier"]
SETUP_TIMEOUT = 1500
PLAYBOOK = "sandbox_conformance.fleet.conformance"


# --- the renderer, on report directories written here ----------------------------------------------


# What `run` says inside the Docker tier's containers (Docker's default seccomp profile, no
# CAP_SYS_ADMIN): the cause the probe named, not nesting (runners/decide.py _sandbox_boundary).
DENIED_IN_CONTAINER = r"user namespaces are denied here \((seccomp|no_cap_sys_admin)\)"

def finding(probe: str, verdict: str, reason: str = "", cause: str | None = None) -> dict[str, Any]:
    return {"probe": probe, "verdict": verdict, "reason": reason or f"{probe} is {verdict}", "evidence": {},
            "facts": {"cause": cause} if cause else {}}


def promise(label: str, verdict: str, detail: str = "") -> dict[str, Any]:
    return {"promise": label, "verdict": verdict, "detail": detail, "tests": [], "a_key_added_later": 1}


def witness_doc(code: int, *promises: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "exit": code, "promises": list(promises), "summary": {}}


GOOD_PROBES = [finding("userns", "supported"), finding("sandboxed", "not_detected")]
PLAIN_PROBES = [finding("userns", "denied", "a seccomp filter refuses unshare", "seccomp"),
                finding("sandboxed", "detected", "inside a sandbox: seccomp fired")]
KEPT = [promise("network", "kept"), promise("pid", "kept"), promise("cgroup", "not tested", "no leaf")]


def host_dir(root: Path, name: str, *, state: str = "reached", reason: str = "", task: str = "",
             probes: list[dict[str, Any]] | None = None, run_json: dict[str, Any] | None = None,
             legs: dict[str, dict[str, Any]] | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    write_json(d / "host.json", {"schema": 1, "host": name, "state": state, "reason": reason, "task": task})
    if probes is not None:
        write_json(d / "probe.json", {"schema": 1, "context": {}, "findings": probes})
    if run_json is not None:
        write_json(d / "run.json", {"schema": 1, **run_json})
    for leg, doc in (legs or {}).items():
        write_json(d / ("witness.json" if leg == "main" else f"witness-{leg}.json"), doc)
    return d


def outcome(status: str, code: int, reason: str = "", mode: str = "native") -> dict[str, Any]:
    word = {"passed": "PASS", "failed": "FAIL", "refused": "REFUSED"}.get(status, "ERROR")
    return {"status": status, "exit_code": code, "mode": mode, "reason": reason,
            "verdict_line": f"sandbox-conformance: {word} mode={mode} exit={code} time=1.0s"}


def passed(root: Path, name: str) -> Path:
    return host_dir(root, name, probes=GOOD_PROBES, run_json=outcome("passed", 0),
                    legs={"main": witness_doc(0, *KEPT)})


@pytest.fixture
def mixed_fleet(tmp_path: Path) -> Path:
    root = tmp_path / "reports"
    passed(root, "good")
    host_dir(root, "plain", probes=PLAIN_PROBES,
             run_json=outcome("refused", 75, "inside a sandbox: nested user namespaces are refused", "auto"))
    host_dir(root, "gone", state="unreachable",
             reason="ssh: connect to host 10.9.9.9 port 22: Connection refused")
    host_dir(root, "halfway", state="failed", task="Install the tool", reason="E: Unable to locate package")
    (root / "junit").mkdir()  # an earlier run's JUnit directory is not a host
    (root / ".sandbox-conformance-reports").write_text("tag\n")
    return root


def cli(*args: str, timeout: float = 60) -> Completed:
    return run([str(BIN / "sandbox-conformance"), "fleet-report", *args], timeout=timeout)


def test_each_host_is_one_row_with_its_status_and_why(mixed_fleet: Path) -> None:
    c = cli(str(mixed_fleet))
    assert c.returncode == 0, c.stderr
    assert c.stdout.splitlines()[0] == ("fleet: 4 hosts: 1 passed, 1 refused, 1 stopped, 1 unreachable; "
                                        "no promise broken")
    hosts = by(sections(c.stdout)["Hosts"], "HOST")
    assert list(hosts) == ["gone", "good", "halfway", "plain"]
    assert hosts["good"] == {"HOST": "good", "STATUS": "passed", "MODE": "native", "KEPT": "2", "BROKEN": "0",
                                  "NOT TESTED": "1", "WHY": ""}
    assert hosts["plain"]["STATUS"] == "refused"
    assert hosts["plain"]["WHY"] == "inside a sandbox: nested user namespaces are refused"
    assert hosts["gone"]["STATUS"] == "unreachable"
    assert "Connection refused" in hosts["gone"]["WHY"]
    assert hosts["halfway"]["STATUS"] == "stopped"
    assert hosts["halfway"]["WHY"] == "at 'Install the tool': E: Unable to locate package"


def test_the_probe_matrix_and_its_causes_group_hosts_of_one_shape(tmp_path: Path) -> None:
    root = tmp_path / "r"
    for name in ("c1", "c2"):
        host_dir(root, name, probes=PLAIN_PROBES, run_json=outcome("refused", 75, "nesting", "auto"))
    passed(root, "h")
    found = sections(cli(str(root)).stdout)
    probes = by(found["Probes (host × probe)"], "HOST")
    assert probes["c1"] == {"HOST": "c1", "userns": "DENIED", "sandboxed": "det"}
    assert probes["h"] == {"HOST": "h", "userns": "yes", "sandboxed": "-"}
    causes = found["Probe causes"]
    assert causes[0] == {"PROBE": "userns", "VERDICT": "denied", "CAUSE": "seccomp", "HOSTS": "c1, c2",
                         "REASON (first host)": "a seccomp filter refuses unshare"}
    assert [c["PROBE"] for c in causes] == ["userns", "sandboxed"]  # supported / not_detected need no cause


def test_a_promise_broken_in_one_leg_is_broken_for_the_host_and_exits_1(tmp_path: Path) -> None:
    root = tmp_path / "r"
    passed(root, "good")
    host_dir(root, "box", probes=GOOD_PROBES, run_json=outcome("failed", 1, "", "container"), legs={
        "root": witness_doc(0, *KEPT),
        "sbxc": witness_doc(1, promise("network", "BROKEN", "eth0 is up inside"), *KEPT[1:]),
    })
    c = cli(str(root))
    assert c.returncode == 1, c.stderr
    assert c.stdout.splitlines()[0] == "fleet: 2 hosts: 1 passed, 1 failed; BROKEN on box (1)"
    found = sections(c.stdout)
    matrix = by(found["Promises (promise × host)"], "PROMISE")
    assert matrix["network"] == {"PROMISE": "network", "box": "BROKEN", "good": "kept"}
    assert matrix["cgroup"] == {"PROMISE": "cgroup", "box": "-", "good": "-"}
    assert found["Broken promises"] == [{"HOST": "box", "PROMISE": "network", "LEGS": "sbxc",
                                         "WHAT THE TASK SAW": "eth0 is up inside"}]
    assert found["Not tested"] == [{"PROMISES": "cgroup", "HOSTS": "box, good", "WHY NOT TESTED": "no leaf"}]


def test_refused_and_unreachable_hosts_exit_0_unless_require(mixed_fleet: Path) -> None:
    assert cli(str(mixed_fleet)).returncode == 0
    c = cli(str(mixed_fleet), "--require")
    assert c.returncode == 1
    assert "Hosts" in c.stdout  # the table is printed either way


@pytest.mark.parametrize("make_dir, says", [
    (lambda tmp: tmp / "nowhere", "no such directory"),
    (lambda tmp: (tmp / "f").write_text("x") and tmp / "f", "not a directory"),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "no host directories"),
    (lambda tmp: (tmp / "junk" / "sub").mkdir(parents=True) or tmp / "junk", "no host directories"),
])
def test_a_bad_dir_is_exit_2_with_one_line(tmp_path: Path, make_dir: Any, says: str) -> None:
    d = make_dir(tmp_path)
    c = cli(str(d))
    assert c.returncode == 2
    assert c.stdout == ""
    [line] = c.stderr.strip().splitlines()
    assert line.startswith("sandbox-conformance fleet-report: ") and says in line, line


def test_an_unreadable_report_is_a_note_on_its_host_not_a_crash(mixed_fleet: Path) -> None:
    (mixed_fleet / "good" / "probe.json").write_text("{not json")
    (mixed_fleet / "good" / "run.json").write_text("[]")
    c = cli(str(mixed_fleet))
    assert c.returncode == 0, c.stderr
    hosts = by(sections(c.stdout)["Hosts"], "HOST")
    assert hosts["good"]["STATUS"] == "passed"  # its witness report says exit 0
    assert "probe.json: unreadable (JSONDecodeError" in hosts["good"]["WHY"]
    assert hosts["plain"]["STATUS"] == "refused"  # and the others are all there


def test_reports_gathered_by_hand_need_no_host_or_run_json(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "web1").mkdir(parents=True)
    write_json(root / "web1" / "probe.json", {"schema": 1, "findings": GOOD_PROBES})
    write_json(root / "web1" / "witness.json",
               witness_doc(1, promise("pid", "BROKEN", "sees pid 1 of the host")))
    (root / "web2").mkdir()
    write_json(root / "web2" / "probe.json", {"schema": 1, "findings": PLAIN_PROBES})
    c = cli(str(root))
    assert c.returncode == 1
    hosts = by(sections(c.stdout)["Hosts"], "HOST")
    assert (hosts["web1"]["STATUS"], hosts["web1"]["BROKEN"]) == ("failed", "1")
    assert hosts["web2"]["STATUS"] == "no report"


def test_markdown_has_the_same_rows_as_tables(mixed_fleet: Path) -> None:
    c = cli(str(mixed_fleet), "--format", "markdown")
    assert c.returncode == 0
    lines = c.stdout.splitlines()
    assert lines[0].startswith("fleet: 4 hosts")
    assert "### Hosts" in lines
    assert "| HOST | STATUS | MODE | KEPT | BROKEN | NOT TESTED | WHY |" in lines
    assert "| good | passed | native | 2 | 0 | 1 |   |" in lines
    assert "| plain | DENIED | det |" in lines


def test_one_junit_file_per_host(mixed_fleet: Path, tmp_path: Path) -> None:
    out = tmp_path / "junit"
    assert cli(str(mixed_fleet), "--junit-dir", str(out), "--output", str(tmp_path / "t.txt")).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["gone.xml", "good.xml", "halfway.xml", "plain.xml"]
    good = ET.parse(out / "good.xml").getroot().find("testsuite")
    assert good is not None
    counts = tuple(good.get(k) for k in ("tests", "failures", "errors", "skipped"))
    assert counts == ("6", "0", "0", "1")
    plain = ET.parse(out / "plain.xml").getroot()
    run_case = plain.find(".//testcase[@name='witness']")
    assert run_case is not None and run_case.find("skipped") is not None
    assert run_case.find("skipped").get("message", "").startswith("refused: inside a sandbox")
    userns = plain.find(".//testcase[@name='userns']/skipped")
    assert userns is not None
    assert userns.get("message") == "denied (seccomp): a seccomp filter refuses unshare"
    gone = ET.parse(out / "gone.xml").getroot().find(".//testcase[@name='witness']/error")
    assert gone is not None and gone.get("message", "").startswith("unreachable: ssh: connect")
    assert (tmp_path / "t.txt").read_text().startswith("fleet: 4 hosts")


def test_the_renderer_is_a_pure_function_of_the_loaded_fleet(mixed_fleet: Path) -> None:
    fleet = fleet_report.load(mixed_fleet)
    assert [h.status for h in fleet.hosts] == ["unreachable", "passed", "stopped", "refused"]
    assert fleet_report.exit_code(fleet) == 0
    assert fleet_report.exit_code(fleet, require=True) == 1
    assert fleet_report.render(fleet, "text") == fleet_report.render(fleet_report.load(mixed_fleet), "text")


# --- the real fleet: the collection, Ansible, this host and containers --------------------------------


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Controller:
    why = missing()
    if why:
        pytest.skip(why)
    ctl = Controller(tmp_path_factory.mktemp("ansible"))
    c = ctl.install_collection()
    assert c.ok, f"ansible-galaxy collection install ./fleet: {c.stderr_tail(5) or c.stdout[-500:]}"
    return ctl


@dataclasses.dataclass(frozen=True)
class FleetRun:
    controller: Controller
    inventory: Path
    reports: Path
    result: Completed
    seconds: float
    containers: dict[str, str]  # inventory name -> container name
    tier: Any

    @property
    def table(self) -> str:
        return (self.reports / "fleet.txt").read_text()


def free_loopback_port() -> int:
    """A loopback port nobody listens on (bound, then released: ssh there is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def fleet_run(docker_tier: DockerTier, controller: Controller,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRun]:
    tmp = tmp_path_factory.mktemp("fleet")
    tag = secrets.token_hex(3)
    names = {"plain": f"sbxc-fleet-plain-{tag}", "shaped": f"sbxc-fleet-shaped-{tag}",
             "down": f"sbxc-fleet-down-{tag}"}
    try:
        for host, flags, verb in (("plain", [], "run"),
                                  ("shaped", [*security_flags("docker"), "--cgroupns=private"], "run"),
                                  ("down", [], "create")):  # exists, never started
            c = docker_tier.docker_cmd(verb, *(["--detach"] if verb == "run" else []), "--name", names[host],
                                       *flags, docker_tier.image, "sleep", "infinity", timeout=120)
            assert c.ok, f"docker {verb} {host}: {c.stderr_tail(3)}"
        local_tmp = tmp / "local"
        local_tmp.mkdir()
        container = {"ansible_connection": "community.docker.docker",
                     "ansible_docker_extra_args": f"--host {docker_tier.host}"}
        inventory = write_json(tmp / "inventory.yml", {"all": {
            "vars": {"ansible_python_interpreter": "/usr/bin/python3"},
            "children": {
                "this_host": {"hosts": {"local": {
                    "ansible_connection": "local",
                    "sandbox_conformance_install": "none",
                    "sandbox_conformance_cli": str(BIN / "sandbox-conformance"),
                    "sandbox_conformance_target_reports": str(local_tmp / "reports"),
                }}},
                "containers": {"vars": container, "hosts": {
                    host: {"ansible_host": name} for host, name in names.items()}},
                "ssh": {"hosts": {"closed": {
                    "ansible_host": "127.0.0.1", "ansible_port": free_loopback_port(), "ansible_user": "root",
                    "ansible_ssh_common_args": "-o ConnectTimeout=5 -o StrictHostKeyChecking=no "
                                               "-o UserKnownHostsFile=/dev/null -o BatchMode=yes",
                }}},
            },
        }})
        reports = tmp / "reports"
        started = time.monotonic()
        result = controller.playbook(PLAYBOOK, inventory,
                                     # sandbox_conformance_src: the default, the cwd (the checkout)
                                     "--extra-vars", f"sandbox_conformance_reports={reports}",
                                     env={"DOCKER_CONFIG": docker_tier.env["DOCKER_CONFIG"]})
        seconds = time.monotonic() - started
        print(f"\nfleet playbook: {seconds:.1f}s for {len(names) + 2} hosts (exit {result.returncode})")
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        # The playbook's own table, kept for the tests: the text render is what it showed.
        c = run([str(BIN / "sandbox-conformance"), "fleet-report", str(reports)], timeout=60)
        (reports / "fleet.txt").write_text(c.stdout)
        yield FleetRun(controller, inventory, reports, result, seconds, names, docker_tier)
    finally:
        docker_tier.docker_cmd("rm", "--force", *names.values(), timeout=120)


@pytest.mark.integration
@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_fleet_table_has_a_row_per_host(fleet_run: FleetRun) -> None:
    table = fleet_run.table
    assert table.splitlines()[0] == "fleet: 5 hosts: 2 passed, 1 refused, 2 unreachable; no promise broken"
    hosts = by(sections(table)["Hosts"], "HOST")
    assert list(hosts) == ["closed", "down", "local", "plain", "shaped"]
    for name in ("local", "shaped"):
        row = hosts[name]
        assert (row["STATUS"], row["MODE"], row["BROKEN"]) == ("passed", "native", "0")
        assert int(row["KEPT"]) > 10
    assert hosts["plain"]["STATUS"] == "refused"
    # The refusal names the boundary that is really there (runners/decide.py): the tier's containers
    # run under Docker's default seccomp profile, which refuses the namespaces before nesting could.
    assert re.search(DENIED_IN_CONTAINER, hosts["plain"]["WHY"]), hosts["plain"]["WHY"]
    assert (hosts["down"]["STATUS"], hosts["closed"]["STATUS"]) == ("unreachable", "unreachable")
    assert "is not running" in hosts["down"]["WHY"]
    assert "Connection refused" in hosts["closed"]["WHY"]
    # The playbook showed the same table.
    assert "fleet: 5 hosts: 2 passed, 1 refused, 2 unreachable; no promise broken" in fleet_run.result.stdout


@pytest.mark.integration
@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_plain_container_comes_back_with_its_cause(fleet_run: FleetRun) -> None:
    found = sections(fleet_run.table)
    probes = by(found["Probes (host × probe)"], "HOST")
    assert set(probes) == {"local", "plain", "shaped"}  # unreachable hosts have no probe row
    assert (probes["plain"]["userns"], probes["plain"]["sandboxed"]) == ("DENIED", "det")
    for name in ("local", "shaped"):
        assert [probes[name][p] for p in ("userns", "userns.map", "netns", "pidns.proc")] == ["yes"] * 4
    userns = [c for c in found["Probe causes"] if c["PROBE"] == "userns"]
    assert len(userns) == 1
    assert userns[0]["VERDICT"] == "denied" and userns[0]["HOSTS"] == "plain"
    assert userns[0]["CAUSE"] in ("seccomp", "no_cap_sys_admin"), userns


@pytest.mark.integration
@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_promise_matrix_has_a_column_per_witnessed_host(fleet_run: FleetRun) -> None:
    found = sections(fleet_run.table)
    matrix = by(found["Promises (promise × host)"], "PROMISE")
    for label in ("network", "nested_userns", "pid", "capabilities"):
        assert matrix[label] == {"PROMISE": label, "local": "kept", "shaped": "kept"}
    assert "Broken promises" not in found


@pytest.mark.integration
@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_fetched_reports_and_the_junit_files(fleet_run: FleetRun) -> None:
    reports = fleet_run.reports
    for host in ("local", "shaped"):
        assert {"host.json", "probe.json", "run.json", "witness.json", "witness.xml"} <= {
            p.name for p in (reports / host).iterdir()}
        assert read_json(reports / host / "witness.json")["exit"] == 0
    assert read_json(reports / "plain" / "run.json")["status"] == "refused"
    assert not (reports / "plain" / "witness.json").exists()
    assert read_json(reports / "down" / "host.json")["state"] == "unreachable"
    assert not (reports / ".source.tar").exists()
    assert (reports / "fleet.md").read_text().startswith("fleet: 5 hosts")
    junit = reports / "junit"
    assert sorted(p.name for p in junit.iterdir()) == ["closed.xml", "down.xml", "local.xml", "plain.xml",
                                                       "shaped.xml"]
    plain = ET.parse(junit / "plain.xml").getroot().find(".//testcase[@name='witness']/skipped")
    assert plain is not None and plain.get("message", "").startswith("refused: ")


# Where the inventory says (local), else the modules' own default: PATH, then the role's venv.
CLI = "{{ sandbox_conformance_cli | default('sandbox-conformance') }}"
REPORTS = "{{ sandbox_conformance_target_reports | default('/var/tmp/sbxc-fleet-modules') }}"


def write_probe_play(path: Path, out: Path, hosts: str, **witness: Any) -> Path:
    """A play using the modules directly: the probe's facts in a `when:`, the witness's result."""
    to_controller = {"delegate_to": "localhost"}
    return write_json(path, [{
        "name": "modules", "hosts": hosts, "gather_facts": False,
        "tasks": [
            {"name": "probe", "sandbox_conformance.fleet.probe": {"cli": CLI}, "register": "probed"},
            {"name": "only where user namespaces are denied", "when":
             "sandbox_conformance.findings['userns'].verdict == 'denied'",
             "ansible.builtin.copy": {"dest": f"{out}/{{{{ inventory_hostname }}}}.needs-another-way",
                                      "content": "{{ sandbox_conformance.findings['userns'].facts.cause }}"},
             **to_controller},
            {"name": "witness", "sandbox_conformance.fleet.witness": {
                "cli": CLI, "report_dir": REPORTS, **witness},
             "register": "witnessed", "ignore_errors": True},
            {"name": "keep the results", "ansible.builtin.copy": {
                "dest": f"{out}/{{{{ inventory_hostname }}}}.json",
                "content": "{{ {'probe': probed, 'witness': witnessed} | to_json }}"}, **to_controller},
        ],
    }])


@pytest.mark.integration
@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("fail_on_refusal", [False, True])
def test_the_modules_facts_status_and_refusal(fleet_run: FleetRun, tmp_path: Path,
                                              fail_on_refusal: bool) -> None:
    play = write_probe_play(tmp_path / "play.yml", tmp_path, "local,plain", fail_on_refusal=fail_on_refusal)
    c = fleet_run.controller.playbook(play, fleet_run.inventory, timeout=300,
                                      env={"DOCKER_CONFIG": fleet_run.tier.env["DOCKER_CONFIG"]})
    assert c.returncode == 0, c.stdout[-3000:]
    local, plain = (read_json(tmp_path / f"{h}.json") for h in ("local", "plain"))
    # probe: never changed, facts a `when:` can read.
    for r in (local, plain):
        assert r["probe"]["changed"] is False and not r["probe"].get("failed")
    assert local["probe"]["findings"]["userns"]["verdict"] == "supported"
    assert not (tmp_path / "local.needs-another-way").exists()
    assert (tmp_path / "plain.needs-another-way").read_text() in ("seccomp", "no_cap_sys_admin")
    # witness: a pass, and a refusal that fails the task only when asked.
    assert (local["witness"]["status"], local["witness"]["exit_code"]) == ("passed", 0)
    assert local["witness"]["report"]["exit"] == 0 and local["witness"]["changed"] is False
    assert local["witness"]["verdict_line"].startswith("sandbox-conformance: PASS mode=native exit=0")
    w = plain["witness"]
    assert (w["status"], w["exit_code"], w["report"]) == ("refused", 75, None)
    assert w["verdict_line"].startswith("sandbox-conformance: REFUSED mode=auto exit=75")
    assert re.search(DENIED_IN_CONTAINER, w["reason"]), w["reason"]
    assert bool(w.get("failed")) is fail_on_refusal


@pytest.mark.integration
def test_a_probe_that_cannot_run_fails_the_task_with_why(controller: Controller, tmp_path: Path) -> None:
    inventory = write_json(tmp_path / "inv.yml", {"all": {"hosts": {"local": {
        "ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}}}})
    play = write_json(tmp_path / "play.yml", [{"hosts": "local", "gather_facts": False, "tasks": [
        {"sandbox_conformance.fleet.probe": {"cli": str(tmp_path / "no-such-cli")}}]}])
    c = controller.playbook(play, inventory, timeout=120)
    assert c.returncode == 2, c.stdout[-2000:]
    assert f"no {tmp_path / 'no-such-cli'} on this host" in c.stdout


@pytest.mark.integration
def test_the_role_reads_its_package_lists_from_the_checkout(controller: Controller, tmp_path: Path) -> None:
    """The Debian set-up is the Dockerfile's, the make set-up scripts/system-deps': read from the
    checkout each run, so neither list can drift from what container mode and `make` install."""
    play = write_json(tmp_path / "play.yml", [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "sandbox_conformance.fleet.conformance",
                                          "tasks_from": "noop.yml", "public": True}},
        {"ansible.builtin.copy": {"dest": str(tmp_path / "lists.json"), "content": "{{ {"
                                  "'debian': sandbox_conformance_debian_packages, "
                                  "'make': sandbox_conformance_make_packages} | to_json }}"}},
    ]}])
    inventory = write_json(tmp_path / "inv.yml", {"all": {"hosts": {}}})
    c = controller.playbook(play, inventory, timeout=120)
    assert c.ok, c.stdout[-2000:]
    lists = read_json(tmp_path / "lists.json")
    dockerfile = (REPO / "Dockerfile").read_text()
    assert {"bubblewrap", "python3-pytest", "python3", "tar"} <= set(lists["debian"])
    assert all(p in dockerfile for p in lists["debian"] if p != "tar")
    assert {"bubblewrap", "libcap-dev", "make"} <= set(lists["make"])


@pytest.mark.integration
def test_the_modules_documentation_is_valid(controller: Controller) -> None:
    c = run([str(BIN / "ansible-doc"), "--json", "sandbox_conformance.fleet.probe",
             "sandbox_conformance.fleet.witness"], timeout=120, env=controller.env(), cwd=str(REPO))
    assert c.ok, c.stderr_tail(5)
    assert "no_log" not in c.stdout and "fail_on_refusal" in c.stdout and "findings" in c.stdout


def test_the_cli_needs_nothing_but_the_checkout(mixed_fleet: Path) -> None:
    """The playbook renders with the controller's python from a bare checkout (no venv, no deps)."""
    c = run(["/usr/bin/python3", "-B", "-s", "-m", "sandbox_conformance", "fleet-report", str(mixed_fleet)],
            timeout=60, cwd=str(REPO), env={"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8"})
    assert c.returncode == 0, c.stderr
    assert c.stdout.startswith("fleet: 4 hosts")
