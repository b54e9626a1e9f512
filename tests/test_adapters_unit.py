"""The adapters' pure parts: the registry, the profiles they ship, the OCI profile derivation (a
table: flip one thing in the bundle, one promise changes), the port of OCI runtime-tools'
masked-path check, and the reasons an adapter gives when it cannot run."""

from __future__ import annotations

import copy
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sandbox_conformance.conformance import adapters, profile
from sandbox_conformance.conformance.adapters import oci, unshare

# ---- registry and shipped profiles ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(adapters.ADAPTERS))
def test_every_adapter_ships_a_profile_that_loads_and_promises_something(name: str) -> None:
    path = adapters.profile_path(adapters.ADAPTERS[name].profile)
    prof = profile.load(path)
    assert prof.promises(), f"{path} makes no promise"


def test_an_unknown_adapter_is_named_with_the_known_ones() -> None:
    with pytest.raises(KeyError, match="no adapter 'no-such-sandbox' \\(known: unshare, runc, crun"):
        adapters.resolve("no-such-sandbox")


def test_the_unshare_adapter_uses_exactly_its_documented_flags() -> None:
    try:
        r = adapters.resolve("unshare")
    except adapters.Unavailable as e:
        pytest.skip(str(e))
    words = shlex.split(r.launcher)
    assert words[0].endswith("/unshare") and tuple(words[1:]) == unshare.FLAGS
    assert r.witness_args() == [
        "--profile", str(r.profile), "--launcher", r.launcher, "--launcher-spec", "--launcher-stdin"
    ]


def test_the_command_line_helper_prints_witness_arguments_or_exits_75(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert adapters.main(["args", "systemd-run"]) in (0, 75)
    assert adapters.main(["args", "nope"]) == 2
    assert "no adapter 'nope'" in capsys.readouterr().err


# ---- the OCI profile, derived from the bundle ----------------------------------------------------


def derived(mutate: Any = None) -> dict[str, Any]:
    config = oci.template()
    if mutate:
        mutate(config)
    return oci.derive_profile(config)


def test_the_reference_bundle_derives_the_full_set_of_promises() -> None:
    doc = derived()
    prof = profile.parse(doc, "<derived>")
    assert set(prof.promises()) == {
        "masked",
        "read_only",
        "writable",
        "absent",
        "aliases",
        "write_surface",
        "kernel_view",
        "leftovers",
        "control",
        "user_tmp",
        "workdir",
        "network",
        "nested_userns",
        "pid",
        "ipc",
        "uts",
        "capabilities",
        "no_new_privs",
        "environment",
        "unchanged",
        *profile.DEFAULT_PROMISES,
    }
    assert "promises" not in doc, "the bundle disclaims nothing"
    assert doc["filesystem"]["absent"] == ["{neighbour_control}", "{other_user}"]
    assert doc["environment"]["allow"] == ["PATH", "HOME", "LANG", "TASK_ID"]


def _drop_ns(kind: str) -> Any:
    return lambda c: c["linux"].update(namespaces=[n for n in c["linux"]["namespaces"] if n["type"] != kind])


def _join_host_net(c: dict[str, Any]) -> None:
    for n in c["linux"]["namespaces"]:
        if n["type"] == "network":
            n["path"] = "/proc/1/ns/net"


def _bind_other_user(c: dict[str, Any]) -> None:
    c["mounts"].append(
        {"destination": "{other_user}", "type": "bind", "source": "{other_user}", "options": ["bind", "ro"]}
    )


def _control_rw(c: dict[str, Any]) -> None:
    for m in c["mounts"]:
        if m["destination"] == "{control}":
            m["options"] = ["bind", "rw"]


@pytest.mark.parametrize(
    ("mutate", "section", "key", "expected"),
    [
        (_drop_ns("network"), "network", "mode", "host"),
        (_join_host_net, "network", "mode", "host"),
        (_drop_ns("pid"), "namespaces", "pid", "shared"),
        (
            lambda c: c["process"]["capabilities"].update(bounding=["CAP_SYS_ADMIN"]),
            "process",
            "capabilities",
            "any",
        ),
        (lambda c: c["process"].update(noNewPrivileges=False), "process", "no_new_privs", False),
        (lambda c: c["linux"].pop("seccomp"), "userns", "nested", "allowed"),
        (_bind_other_user, "filesystem", "absent", ["{neighbour_control}"]),
        (lambda c: c["linux"].update(maskedPaths=[]), "filesystem", "masked", []),
        (_control_rw, "filesystem", "writable", ["{control}", "{workdir}"]),
    ],
    ids=[
        "no-netns",
        "host-netns-by-path",
        "no-pidns",
        "a-capability",
        "no-nnp",
        "no-seccomp",
        "other-user-bound",
        "no-mask",
        "control-rw",
    ],
)
def test_one_change_to_the_bundle_changes_one_derived_promise(
    mutate: Any, section: str, key: str, expected: Any
) -> None:
    before, after = derived(), derived(mutate)
    assert after[section][key] == expected
    rest = copy.deepcopy(after)
    rest[section][key] = before[section][key]
    if mutate is _control_rw:  # the control promise itself goes too: it is not read-only any more
        assert "control" not in after["task"]
        rest["task"] = before["task"]
    if mutate is _bind_other_user:  # bound read-only, it is now a read-only path instead
        assert after["filesystem"]["read_only"] == [*before["filesystem"]["read_only"], "{other_user}"]
        rest["filesystem"]["read_only"] = before["filesystem"]["read_only"]
    assert rest == before


def test_the_profile_writer_round_trips_through_tomllib() -> None:
    doc = derived()
    assert tomllib.loads(oci.profile_toml(doc, "# header\n")) == doc
    open_proc = derived(lambda c: c["linux"].pop("readonlyPaths"))
    assert tomllib.loads(oci.profile_toml(open_proc)) == open_proc


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda c: c["linux"].pop("readonlyPaths"), "/proc/sys and /proc/sysrq-trigger not in"),
        (
            lambda c: c["linux"].update(readonlyPaths=["/proc/sys"]),
            "with /proc/sysrq-trigger not in linux.readonlyPaths",
        ),
        (
            lambda c: c["mounts"].append({"destination": "/sys", "type": "sysfs", "source": "sysfs"}),
            "sysfs read-write",
        ),
    ],
    ids=["no-readonly-paths", "sysrq-open", "sysfs-rw"],
)
def test_a_bundle_that_leaves_kernel_settings_writable_derives_no_kernel_interfaces_promise(
    mutate: Any, why: str
) -> None:
    # runc spec's readonlyPaths are what keep it: without them crun as root opened core_pattern.
    before, after = derived(), derived(mutate)
    assert why in after["promises"]["not_claimed"]["kernel_interfaces"]
    assert "kernel_interfaces" not in profile.parse(after, "<derived>").promises()
    assert {k: v for k, v in after.items() if k != "promises"} == before


def test_rendering_expands_every_placeholder_and_sets_the_task_argv() -> None:
    values = {k: f"/v/{k}" for k in profile.PLACEHOLDERS}
    config = oci.render(oci.template(), values, ["python3", "-I", "-S", "-"])
    text = str(config)
    assert "{" + "state}" not in text and "/v/state" in text
    assert config["process"]["args"] == ["python3", "-I", "-S", "-"]
    assert config["process"]["cwd"] == "/v/workdir"


def test_rootless_maps_container_root_to_the_caller_only() -> None:
    config = oci.rootless(oci.template(), 1001, 1002)
    assert {"type": "user"} in config["linux"]["namespaces"]
    assert config["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 1001, "size": 1}]
    assert config["linux"]["gidMappings"] == [{"containerID": 0, "hostID": 1002, "size": 1}]


# ---- OCI runtime-tools' masked-path check, ported ------------------------------------------------


@pytest.mark.parametrize(
    ("stat", "listing", "passes"),
    [
        ({"ok": False, "errno": "ENOENT"}, {"ok": False, "errno": "ENOENT"}, True),  # missing: passes
        ({"ok": True, "value": {"type": "dir"}}, {"ok": True, "value": []}, True),  # an empty dir
        ({"ok": True, "value": {"type": "dir"}}, {"ok": True, "value": ["canary.sqlite"]}, False),
        ({"ok": False, "errno": "EACCES"}, {"ok": False, "errno": "EACCES"}, False),  # aborts, no pass
    ],
    ids=["missing", "empty-dir", "content-visible", "other-error"],
)
def test_runtime_tools_masked_check(stat: dict, listing: dict, passes: bool) -> None:
    assert oci.runtime_tools_masked_check(stat, listing) is passes


# ---- why an adapter cannot run -----------------------------------------------------------------


def test_runc_as_root_is_refused_because_it_would_write_host_cgroups() -> None:
    if oci.shutil.which("runc") is None:
        pytest.skip("runc not installed")
    why = oci.unavailable("runc", euid=0)
    assert why is not None and "cgroup" in why and "--as-user" in why
    assert oci.unavailable("runc", euid=1001) is None


def test_the_systemd_run_prefix_carries_every_property_with_its_placeholders(tmp_path: Path) -> None:
    from sandbox_conformance.conformance.adapters import systemd_run
    from sandbox_conformance.conformance.launch import external

    if systemd_run.shutil.which("systemd-run") is None:
        pytest.skip("systemd-run not installed")
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "comm").write_text("systemd\n")
    words = shlex.split(systemd_run.prefix(tmp_path))
    assert [w for i, w in enumerate(words) if i and words[i - 1] == "--property"] == list(
        systemd_run.PROPERTIES
    )
    # The witness expands placeholders inside each word: a property with two paths stays one word.
    values = {k: f"/l/{k}" for k in profile.PLACEHOLDERS}
    argv = external(systemd_run.prefix(tmp_path)).argv({}, values)
    assert "ReadWritePaths=/l/workdir /l/user_tmp" in argv
    assert argv[-4:] == ("python3", "-I", "-S", "-")


def test_a_hung_hierarchy_sweep_is_killed_with_everything_it_started(tmp_path: Path, monkeypatch) -> None:
    """nspawn's sweep runs `unshare ... sh -c`; on its timeout the whole group goes, not only the
    leader (subprocess.run's timeout killed `unshare` alone and left the shell's children running)."""
    import os
    import time

    from sandbox_conformance.conformance.adapters import nspawn

    token = f"sbxc-sweep-test-{os.getpid()}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # An `unshare` whose sweep hangs in a child it started, the way a stuck `find` or `sleep` would.
    (bin_dir / token).write_text("#!/bin/sh\nsleep 300\n")
    (bin_dir / token).chmod(0o755)
    (bin_dir / "unshare").write_text(f"#!/bin/sh\n{bin_dir / token} &\nwait\n")
    (bin_dir / "unshare").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(nspawn, "SWEEP_TIMEOUT", 0.5)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    started = time.monotonic()
    nspawn.sweep_hierarchy("sbxc-nspawn-test")
    assert time.monotonic() - started < 10

    def alive() -> list[int]:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()
                and Path(f"/proc/{p}/cmdline").exists()
                and token.encode() in Path(f"/proc/{p}/cmdline").read_bytes()]

    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive() == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("sbxc-nspawn-cg-")] == []
