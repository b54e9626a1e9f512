"""The agent sandboxes end to end: Anthropic's sandbox-runtime (srt) and the Codex CLI's `codex sandbox`,
pinned and installed by scripts/test-tier-deps, each run as root and as the unprivileged test user and
kept to the profile it ships; each promise it does not keep goes red alone when a profile claims it;
and the vocabulary these profiles need (hidden paths, accepted refusals, a network through a proxy,
capabilities none_effective, more than one init) is checked as data first, and then for its negative
controls going red by the witness that judges them.

Ground truth checked by hand (srt 0.0.83, codex 0.171.0, this kernel) and pinned below as expectations:
    srt    writes EROFS (ro /), deny-read dir = empty writable tmpfs, own netns with lo and srt's proxy,
           ipc and uts shared, pid private (PID 1 bwrap as root, apply-seccomp as a user), caps full in
           the helper's userns as root and Prm/Eff/Amb empty as a user, NoNewPrivs 1, seccomp 2, every
           door to a nested userns refused, environment passed through.
    codex  writes EROFS, "none" path = mode-000 ro tmpfs (EACCES), socket(2) refused EPERM, ipc and pid
           private, uts shared, no capability in any set, NoNewPrivs 1, seccomp 2, nested userns
           created, environment passed through."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import stat
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from witness_cli import REPO, junit, witness

from sandbox_conformance.conformance import adapters, plan
from sandbox_conformance.conformance import profile as P
from sandbox_conformance.conformance.adapters import codex, srt

TEST_USER = os.environ.get("SANDBOX_CONFORMANCE_TEST_USER", "sbxc-test")

# ---- the vocabulary, as data -------------------------------------------------------------------------

MINIMAL = '[profile]\nname = "t"\n'


def _load(tmp_path: Path, body: str) -> P.Profile:
    f = tmp_path / "p.toml"
    f.write_text(body)
    return P.load(f)


def test_the_new_vocabulary_parses_and_makes_its_own_promise_families(tmp_path: Path) -> None:
    prof = _load(
        tmp_path,
        MINIMAL
        + '[filesystem]\nread_only = ["/usr"]\nhidden = ["{state}/db"]\nrefuse = ["EROFS", "EACCES"]\n'
        + '[network]\nmode = "proxy"\nallowed = ["localhost"]\n'
        + '[namespaces]\npid = "private"\n'
        + '[process]\ncapabilities = "none_effective"\ninit = ["bwrap", "apply-seccomp"]\n',
    )
    assert prof.filesystem.hidden == ("{state}/db",) and prof.filesystem.refuse == ("EROFS", "EACCES")
    assert prof.network is P.NetworkMode.proxy and prof.network_allowed == ("localhost",)
    assert prof.process.capabilities is P.Caps.none_effective
    assert prof.process.init == ("bwrap", "apply-seccomp")
    assert {"hidden", "network", "network_proxy", "capabilities", "read_only"} <= set(prof.promises())
    # The defaults stay strict: EROFS only, one init as one name.
    strict = _load(
        tmp_path,
        MINIMAL + '[filesystem]\nread_only = ["/usr"]\n[namespaces]\npid = "private"\n'
        '[process]\ninit = "bwrap"\n',
    )
    assert strict.filesystem.refuse == ("EROFS",) and strict.process.init == ("bwrap",)
    assert "network_proxy" not in _load(tmp_path, MINIMAL + '[network]\nmode = "none"\n').promises()


@pytest.mark.parametrize(
    ("body", "key", "expected"),
    [
        ('[filesystem]\nread_only = ["/usr"]\nrefuse = "EACCES"\n', "filesystem.refuse", "errno names"),
        ('[filesystem]\nread_only = ["/usr"]\nrefuse = []\n', "filesystem.refuse", "errno names"),
        ('[filesystem]\nrefuse = ["EACCES"]\n', "filesystem.refuse", "read_only or filesystem.masked"),
        ('[filesystem]\nhidden = ["/x"]\nmasked = ["/x"]\n', "filesystem.hidden", "one promise per path"),
        ('[network]\nmode = "none"\nallowed = ["localhost"]\n', "network.allowed", 'mode = "proxy"'),
        ('[network]\nmode = "proxy"\nallowed = ["*.example.com"]\n', "network.allowed", "no wildcard"),
        ('[network]\nmode = "proxy"\nallowed = ["example.com:443"]\n', "network.allowed", "no port"),
        ('[process]\ncapabilities = "some"\n', "process.capabilities", "'none_effective'"),
        ('[namespaces]\npid = "private"\n[process]\ninit = []\n', "process.init", "list of names"),
    ],
)
def test_a_bad_use_of_the_new_vocabulary_names_file_key_and_expectation(
    tmp_path: Path, body: str, key: str, expected: str
) -> None:
    with pytest.raises(P.InvalidProfile) as e:
        _load(tmp_path, MINIMAL + body)
    assert str(e.value).startswith(f"{tmp_path / 'p.toml'}: {key}: expected "), e.value
    assert expected in str(e.value)


def test_the_srt_settings_are_built_from_the_task_spec() -> None:
    spec = {
        "state": "/L/state",
        "workdir": "/L/state/users/alice/tasks/t/work",
        "user_tmp": "/L/state/users/alice/tmp",
        "neighbour_control": "/L/state/users/alice/tasks/n/control",
        "other_user": "/L/state/users/bob",
    }
    found = {
        "bwrap": "/usr/bin/bwrap",
        "socat": "/usr/bin/socat",
        "rg": "/usr/bin/rg",
        "node": "/usr/bin/node",
    }
    served = {
        "mode": "proxy",
        "allowed": ["localhost"],
        "served": [{"name": "localhost", "address": "127.0.0.1", "port": 4}],
    }
    s = srt.settings(spec, served, found)
    assert s["filesystem"]["denyRead"] == ["/L/state/db", spec["neighbour_control"], spec["other_user"]]
    assert s["filesystem"]["allowWrite"] == [spec["workdir"], spec["user_tmp"]]
    # The name, and the one loopback address:port it is served at (srt refuses loopback otherwise).
    assert s["network"]["allowedDomains"] == ["localhost", "127.0.0.1:4"]
    assert srt.settings(spec, None, found)["network"]["allowedDomains"] == []
    assert srt.settings(spec, {"mode": "none"}, found)["network"]["allowedDomains"] == []
    assert srt.pinned(["python3", "-I", "-S", "-"])[0].startswith(("/usr/bin/", "/bin/"))
    # The launcher's own directory (the layout root: its .env, its daemon socket) is denied entry by
    # entry, all but the one that leads to the state.
    own = srt.launcher_dir_entries(spec, "/L", [".env", "run", "state", "task.json"])
    assert own == ["/L/.env", "/L/run", "/L/task.json"]
    assert srt.settings(spec, None, found, own)["filesystem"]["denyRead"][:3] == own
    assert srt.launcher_dir_entries(spec, "/", ["etc", "L"]) == []
    assert srt.launcher_dir_entries(spec, spec["workdir"], ["x"]) == []


def test_the_agent_tools_get_an_allowlisted_environment_not_the_launchers() -> None:
    # srt and codex pass their environment to the command, and their PID 1 inside keeps it.
    env = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "SANDBOX_CONFORMANCE_CANARY_SECRET": "s", "AWS_KEY": "k"}
    assert srt.tool_env(env, HOME="/w") == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "HOME": "/w"}
    assert srt.tool_env({})["PATH"] == srt.SYSTEM_PATH


def test_the_codex_permissions_profile_is_toml_codex_can_parse() -> None:
    spec = {
        "state": "/L/st ate",  # a space, and a quote below: the values are TOML strings, not bare words
        "workdir": '/L/w"ork',
        "user_tmp": "/L/tmp",
        "neighbour_control": "/L/n",
        "other_user": "/L/bob",
    }
    args = codex.overrides(spec)
    assert args[0] == args[2] == "-c"
    parsed = tomllib.loads("\n".join(args[1::2]))
    assert parsed["default_permissions"] == codex.PROFILE
    table = parsed["permissions"][codex.PROFILE]["filesystem"]
    assert table == {
        ":root": "read",
        '/L/w"ork': "write",
        "/L/tmp": "write",
        "/L/st ate/db": "none",
        "/L/n": "none",
        "/L/bob": "none",
    }
    with_own = tomllib.loads("\n".join(codex.overrides(spec, ["/L/.env", "/L/run"])[1::2]))
    added = with_own["permissions"][codex.PROFILE]["filesystem"].items()
    assert {k: v for k, v in added if k not in table} == {"/L/.env": "none", "/L/run": "none"}


@pytest.mark.parametrize("name", ["srt", "codex"])
def test_an_agent_adapter_whose_tool_is_not_installed_is_unavailable_with_the_reason(
    tmp_path: Path, name: str
) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), srt.NPM_PREFIX_ENV: str(tmp_path)}
    with pytest.raises(adapters.Unavailable, match="is not installed under"):
        adapters.resolve(name, env=env)
    done = witness("--adapter", name, env={srt.NPM_PREFIX_ENV: str(tmp_path)})
    assert done.returncode == 75, done.stdout + done.stderr
    assert f"adapter {name}: not tested:" in done.stderr and "scripts/test-tier-deps" in done.stderr


def test_a_listed_name_the_suite_can_serve_resolves_to_this_host() -> None:
    local = plan._local_addresses()
    assert plan._served_at("localhost", local)[0] is not None
    address, why = plan._served_at("sbxc-no-such-name.invalid", local)
    assert address is None and "does not resolve" in why


# ---- end to end ----------------------------------------------------------------------------------------


def ready(name: str) -> adapters.Resolved:
    try:
        return adapters.resolve(name)
    except adapters.Unavailable as e:
        pytest.skip(f"{name} adapter: {e}")


def verdicts(report: dict) -> dict[str, str]:
    return {p["promise"]: p["verdict"] for p in report["promises"]}


def run(tmp_path: Path, *args: str) -> tuple[int, dict, dict, str]:
    j, x = tmp_path / "r.json", tmp_path / "j.xml"
    adapter = ("--launcher-spec", "--launcher-stdin") if "--launcher" in args else ()
    done = witness(*args, *adapter, "--json", str(j), "--junitxml", str(x), timeout=300)
    assert j.exists(), f"no report (exit {done.returncode}): {done.stdout}{done.stderr[-2000:]}"
    return done.returncode, json.loads(j.read_text()), junit(x), done.stdout


def unsearchable(path: str, user: str) -> bool:
    """Some directory above `path` cannot be searched by `user` (execute permission, path_resolution(7))."""
    pw = pwd.getpwnam(user)
    groups = {pw.pw_gid, *os.getgrouplist(user, pw.pw_gid)}
    for d in Path(path).parents:
        st = os.stat(d)
        bit = (
            stat.S_IXUSR if st.st_uid == pw.pw_uid else stat.S_IXGRP if st.st_gid in groups else stat.S_IXOTH
        )
        if not st.st_mode & bit:
            return True
    return False


# srt's apply-seccomp refuses socket(AF_UNIX) itself (EPERM; the i386 entry point is killed with
# SIGSYS, io_uring_setup EPERM: probed through the launcher), so no unix socket can be connected. The
# witness program opens its socket before its try (conformance/inside.py unix_trials), so the refusal
# reaches the witness as "could not try", a BROKEN verdict on a promise srt keeps.
def broken(report: dict, as_user: str | None) -> dict[str, str]:
    """The promises not kept. One allowance, for a tool that binds the host's `/` read-only in a
    user namespace (srt and codex both): bwrap cannot remount a submount its caller cannot reach, and
    leaves it read-write ("that should be safe to ignore because its not something the user can
    access", bubblewrap.c bind_mount). A host that has such mounts (another tier's dockerd data root
    under a 0700 directory) shows them in the task's mount table; write_surface names them. Allowed
    only when every one it names lies beneath a directory the task's user cannot search."""
    out = {p["promise"]: p["detail"] for p in report["promises"] if p["verdict"] != "kept"}
    detail = out.get("write_surface", "")
    if as_user and detail:
        points = re.findall(r" at (/[^',\]]*)'", detail)
        if points and all(unsearchable(m, as_user) for m in points):
            del out["write_surface"]
    return out


SRT_PROMISES = {
    "read_only /usr",
    "read_only {state}",
    "writable {workdir}",
    "hidden {state}/db",
    "hidden {neighbour_control}",
    "hidden {other_user}",
    "control",
    "user_tmp",
    "network",
    "network_proxy",
    "nested_userns",
    "pid",
    "no_new_privs",
    "write_surface",
    "kernel_view",
    "workdir",
    "leftovers",
    "unchanged",
    "terminal",
    "syscalls",
    # the default promises each keeps (kernel_interfaces is disclaimed by both: as root /proc/sys opens)
    "descriptors",
    "secrets",
    "devices",
    "host_sockets",
}
# codex disclaims host_sockets too: its seccomp leaves sendmsg(2) open to any host socket in its `/`.
CODEX_PROMISES = (SRT_PROMISES - {"network_proxy", "nested_userns", "host_sockets"}) | {"ipc", "capabilities"}


@pytest.mark.integration
@pytest.mark.parametrize("as_user", [None, TEST_USER], ids=["root", "unprivileged"])
@pytest.mark.parametrize(("name", "promises"), [("srt", SRT_PROMISES), ("codex", CODEX_PROMISES)])
def test_an_agent_sandbox_keeps_every_promise_of_its_profile(
    root_only: None,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    name: str,
    promises: set[str],
    as_user: str | None,
) -> None:
    if as_user:
        request.getfixturevalue("test_user")
    ready(name)
    extra = ["--as-user", as_user] if as_user else []
    # (exit 1 where the one allowance of `broken` applied: the witness itself makes none)
    _, report, _, stdout = run(tmp_path, "--adapter", name, *extra)
    assert not broken(report, as_user), stdout
    assert set(verdicts(report)) == promises, stdout
    [task] = report["tasks"]
    seen = task["host_view"]["status"]
    assert seen["NoNewPrivs"] == "1" and seen["Seccomp"] == "2", seen
    if name == "srt":
        # Through srt's proxy: the listed name came back, echoed; nothing else was let through.
        [offered] = task["observations"]["proxies"]["offered"]
        by_kind = {t["kind"]: t["result"] for t in offered["tunnels"]}
        assert by_kind["listed"]["echoed"] is True, offered
        assert not any(r["established"] for k, r in by_kind.items() if k != "listed"), offered
    else:
        # No socket at all: the connects were refused by socket(2) itself.
        assert {c["result"]["stage"] for c in task["observations"]["tcp"]} == {"socket"}


def _profile(tmp_path: Path, name: str, edit: Callable[[str], str]) -> Path:
    text = adapters.profile_path(adapters.ADAPTERS[name].profile).read_text()
    changed = edit(text)
    assert changed != text, "the edit changed nothing"
    f = tmp_path / f"{name}-claims-more.toml"
    f.write_text(changed)
    return f


def _add(section: str, line: str) -> Callable[[str], str]:
    return lambda text: text.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1)


OVERCLAIMS = [
    # srt shares the host's ipc and uts namespaces, passes the environment through, and lets the task out
    # through its proxy; as root its command holds a full capability set in the helper's user namespace.
    ("srt", "ipc", _add("namespaces", 'ipc = "private"'), None, {"ipc"}),
    ("srt", "uts", _add("namespaces", 'uts = "private"'), None, {"uts"}),
    (
        "srt",
        "environment",
        lambda t: t + '\n[environment]\nallow = ["PATH", "HOME", "LANG", "PWD"]\n',
        None,
        {"environment"},
    ),
    (
        "srt",
        "network none",
        lambda t: t.replace('mode = "proxy"', 'mode = "none"').replace('allowed = ["localhost"]', ""),
        None,
        {"network"},
    ),
    (
        "srt",
        "capabilities as root",
        _add("process", 'capabilities = "none_effective"'),
        "root",
        {"capabilities"},
    ),
    # codex shares the host's uts namespace, lets the task make user namespaces, passes the environment.
    ("codex", "uts", _add("namespaces", 'uts = "private"'), None, {"uts"}),
    ("codex", "nested userns", lambda t: t + '\n[userns]\nnested = "refused"\n', None, {"nested_userns"}),
    (
        "codex",
        "environment",
        lambda t: t + '\n[environment]\nallow = ["PATH", "HOME", "LANG", "PWD"]\n',
        None,
        {"environment"},
    ),
]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("name", "claim", "edit", "who", "red"), OVERCLAIMS, ids=[f"{n}-{c}" for n, c, *_ in OVERCLAIMS]
)
def test_a_profile_that_claims_more_than_the_tool_does_is_red_on_exactly_that(
    root_only: None,
    tmp_path: Path,
    name: str,
    claim: str,
    edit: Callable[[str], str],
    who: str | None,
    red: set[str],
) -> None:
    r = ready(name)
    code, report, _, stdout = run(
        tmp_path, "--profile", str(_profile(tmp_path, name, edit)), "--launcher", r.launcher
    )
    assert code == 1, stdout
    assert set(broken(report, None)) == red, stdout


@pytest.mark.integration
def test_srt_keeps_capabilities_none_effective_for_an_unprivileged_caller(
    root_only: None, test_user: str, tmp_path: Path
) -> None:
    r = ready("srt")
    f = _profile(tmp_path, "srt", _add("process", 'capabilities = "none_effective"'))
    _, report, _, stdout = run(
        tmp_path, "--profile", str(f), "--launcher", r.launcher, "--as-user", test_user
    )
    assert not broken(report, test_user) and verdicts(report)["capabilities"] == "kept", stdout
    [task] = report["tasks"]
    assert int(task["host_view"]["status"]["CapBnd"], 16) != 0, (
        "the bounding set was full when this was written"
    )


# ---- negative controls of the new vocabulary -------------------------------------------------------------


@pytest.mark.integration
def test_a_hidden_path_whose_content_leaks_is_red_by_the_hidden_witness(
    root_only: None, tmp_path: Path
) -> None:
    # srt denies reads of three paths; a profile that calls the control directory hidden too is wrong
    # there only: its seeded file reads back inside.
    r = ready("srt")
    f = _profile(tmp_path, "srt", lambda t: t.replace('"{other_user}"]', '"{other_user}", "{control}"]', 1))
    code, report, cases, stdout = run(tmp_path, "--profile", str(f), "--launcher", r.launcher)
    assert code == 1 and set(broken(report, None)) == {"hidden {control}"}, stdout
    assert cases["test_a_hidden_paths_host_content_is_unreadable[{control}]"] == "failure"
    assert cases["test_nothing_written_in_a_hidden_path_reaches_the_host[{control}]"] == "passed"


@pytest.mark.integration
def test_a_refusal_outside_the_accepted_set_is_red_and_an_accepted_one_is_not(
    root_only: None, tmp_path: Path
) -> None:
    r = ready("codex")
    # codex refuses writes under its read-only / with EROFS: a profile that accepts only EACCES is wrong...
    only = _profile(tmp_path, "codex", _add("filesystem", 'refuse = ["EACCES"]'))
    code, report, _, stdout = run(tmp_path, "--profile", str(only), "--launcher", r.launcher)
    assert code == 1 and set(broken(report, None)) == {"read_only /usr", "read_only {state}"}, stdout
    # ...one that accepts what Landlock and seccomp say as well as EROFS is not.
    wide = _profile(tmp_path, "codex", _add("filesystem", 'refuse = ["EROFS", "EACCES", "EPERM"]'))
    code, report, _, stdout = run(tmp_path, "--profile", str(wide), "--launcher", r.launcher)
    assert code == 0 and not broken(report, None), stdout


@pytest.mark.integration
def test_a_proxy_that_lets_an_unlisted_name_through_is_red_by_the_proxy_witness(
    root_only: None, bwrap_path: str, tmp_path: Path
) -> None:
    # The reference sandbox plus a proxy that tunnels to any name, under a profile that allows one.
    text = (REPO / "conformance" / "profiles" / "reference.toml").read_text()
    text = text.split("[limits]")[0].split("[environment]")[
        0
    ]  # the launcher keeps no cgroup; adds proxy vars
    text = text.replace('[network]\nmode = "none"', '[network]\nmode = "proxy"\nallowed = ["localhost"]')
    text = text.replace('nested = "refused"', 'nested = "allowed"')  # not this test's question
    # Nor are the descriptors: the relay --offer-proxy runs in the task's pid namespace holds its socket
    # to the host's proxy (the descriptors witness names it, rightly).
    text += '\n[promises]\nnot_claimed = { descriptors = "the relay holds a host netns socket" }\n'
    f = tmp_path / "reference-proxy.toml"
    f.write_text(text)
    launcher = shlex.join(
        [sys.executable, "-m", "sandbox_conformance.conformance.control_launchers.reference",
         "--offer-proxy", "--"]
    )
    code, report, cases, stdout = run(tmp_path, "--profile", str(f), "--launcher", launcher)
    assert code == 1 and set(broken(report, None)) == {"network", "network_proxy"}, stdout
    assert cases["test_a_listed_name_is_reachable_through_the_proxy"] == "passed"
    assert cases["test_the_proxy_refuses_unlisted_names_loopback_and_the_hosts_addresses"] == "failure"
    assert cases["test_the_task_cannot_reach_the_hosts_tcp_listener"] == "failure"


@pytest.mark.integration
def test_the_new_controls_turn_their_named_witnesses_red(root_only: None, bwrap_path: str) -> None:
    names = "mask_is_a_copy,proxy_lets_unlisted_through,refusal_outside_accepted"
    done = witness_controls("--only", names)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    for n in names.split(","):
        assert re.search(rf"^control {n}: OK", done.stdout, re.M), done.stdout


def witness_controls(*args: str) -> object:
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "sandbox_conformance", "controls", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=600,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
