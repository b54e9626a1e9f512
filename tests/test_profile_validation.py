"""Profile values that pass a loose check but can never be kept, or crash later, are one line naming
the key (conformance/profile.py parse; issue 28)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sandbox_conformance.conformance import profile

REPO = Path(__file__).resolve().parent.parent

BASE = '[profile]\nname = "p"\n'

BAD = {
    "lone } in a path": '[filesystem]\nread_only = ["/usr}"]\n',
    "lone { in a path": '[filesystem]\nread_only = ["/us{r"]\n',
    "} in an environment value": '[environment]\nset = { A = "x}" }\n',
    "{ in an environment value": '[environment]\nset = { A = "{x" }\n',
    "NUL in an environment value": '[environment]\nset = { A = "a\\u0000b" }\n',
    "NUL in a path": '[filesystem]\nread_only = ["/usr\\u0000x"]\n',
    "NUL in a control file": '[task]\ncontrol = "{control}"\ncontrol_files = ["a\\u0000b"]\n',
    "a 300-byte control file": f'[task]\ncontrol = "{{control}}"\ncontrol_files = ["{"x" * 300}"]\n',
    "read_only and writable": '[filesystem]\nread_only = ["{state}/db"]\nwritable = ["{state}/db"]\n',
    "masked and read_only": '[filesystem]\nread_only = ["/etc"]\nmasked = ["/etc/"]\n',
    "a trailing slash": '[filesystem]\nmasked = ["{state}/db"]\nabsent = ["{state}/db/"]\n',
    "a double slash": '[filesystem]\nmasked = ["{state}/db"]\nwritable = ["{state}//db"]\n',
    "a dot component": '[filesystem]\nmasked = ["{state}/db"]\nhidden = ["{state}/./db"]\n',
    "an unknown errno": '[filesystem]\nread_only = ["/usr"]\nrefuse = ["EROFS", "ENOTANERRNO"]\n',
    "an unknown userns errno": '[userns]\nnested = "refused"\nerrno = ["EBOGUS"]\n',
    "a newline after an errno": '[filesystem]\nread_only = ["/usr"]\nrefuse = ["EROFS\\n"]\n',
    "a newline after an env name": '[environment]\nallow = ["PATH\\n"]\n',
    "a newline after a size": '[limits]\nmemory_max = "512M\\n"\n',
    "a newline after an allowed host": '[network]\nmode = "proxy"\nallowed = ["localhost\\n"]\n',
    "a 65-byte hostname": f'[namespaces]\nuts = "private"\nhostname = "{"h" * 65}"\n',
    "an unknown syscall door": '[syscalls]\nmount = "refused"\n',
    "a door's unknown word": '[syscalls]\nkeyctl = "closed"\n',
    "a door's unknown errno": '[syscalls]\nkeyctl = ["ENOTANERRNO"]\n',
    "a door's empty errno list": '[syscalls]\nkeyctl = []\n',
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_a_value_that_can_never_be_kept_is_one_line_naming_the_key(body: str) -> None:
    doc = tomllib.loads(BASE + body)
    with pytest.raises(profile.InvalidProfile) as e:
        profile.parse(doc, "p.toml")
    assert str(e.value).startswith("p.toml: ") and "\n" not in str(e.value)


GOOD = {
    "placeholders": '[filesystem]\nread_only = ["{state}/x"]\nmasked = ["{state}/db"]\n',
    "a 64-byte hostname": f'[namespaces]\nuts = "private"\nhostname = "{"h" * 64}"\n',
    "a 255-byte control file": f'[task]\ncontrol = "{{control}}"\ncontrol_files = ["{"x" * 255}"]\n',
    "known errnos": '[filesystem]\nread_only = ["/usr"]\nrefuse = ["EROFS", "EACCES", "EPERM"]\n',
    "placeholders in a value": '[environment]\nset = { HOME = "{user_tmp}/home" }\n',
    "syscall doors": '[syscalls]\nkeyctl = ["EPERM", "ENOSYS"]\nio_uring_setup = "refused"\n',
}


@pytest.mark.parametrize("body", GOOD.values(), ids=GOOD.keys())
def test_the_tightened_checks_still_take_what_can_be_kept(body: str) -> None:
    profile.parse(tomllib.loads(BASE + body), "p.toml")


def test_every_profile_key_is_in_the_launcher_authors_table() -> None:
    # docs/launchers.md promises launcher authors every profile key in one table: a key the parser
    # takes and the table leaves out is one a newcomer cannot learn from the docs.
    from sandbox_conformance.conformance.profile import _SCHEMA

    lines = (REPO / "docs" / "launchers.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("| `[")]
    missing = []
    for section, keys in _SCHEMA.items():
        rows = [r for r in table if f"`[{section}]" in r or f"`[{section}." in r]
        for k in keys:
            if not any(f"`{k}`" in r or f"] {k}`" in r or f".{k}]`" in r for r in rows):
                missing.append(f"[{section}] {k}")
    assert not missing, f"profile keys missing from docs/launchers.md's table: {missing}"


def test_the_doors_default_to_what_a_sandbox_without_capabilities_refuses() -> None:
    # The mount API is promised only where capabilities are: with them, fsopen(2) rightly opens.
    bare = profile.parse(tomllib.loads(BASE), "p.toml").doors()
    assert bare["ptrace_outside"] == "refused" and bare["fsopen"] == "allowed" and bare["keyctl"] == "allowed"
    no_caps = profile.parse(tomllib.loads(BASE + '[process]\ncapabilities = "none"\n'), "p.toml").doors()
    assert {no_caps[d] for d in profile.MOUNT_API_DOORS} == {"refused"}
    said = profile.parse(tomllib.loads(BASE + '[syscalls]\nptrace_outside = "allowed"\nkeyctl = ["EPERM"]\n'),
                         "p.toml").doors()
    assert said["ptrace_outside"] == "allowed" and said["keyctl"] == ("EPERM",)
