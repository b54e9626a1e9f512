"""Profile values that pass a loose check but can never be kept, or crash later, are one line naming
the key (conformance/profile.py parse; issue 28)."""

from __future__ import annotations

import tomllib

import pytest

from conformance import profile

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
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_a_value_that_can_never_be_kept_is_one_line_naming_the_key(body: str) -> None:
    doc = tomllib.loads(BASE + body)
    with pytest.raises(profile.ProfileError) as e:
        profile.parse(doc, "p.toml")
    assert str(e.value).startswith("p.toml: ") and "\n" not in str(e.value)


GOOD = {
    "placeholders": '[filesystem]\nread_only = ["{state}/x"]\nmasked = ["{state}/db"]\n',
    "a 64-byte hostname": f'[namespaces]\nuts = "private"\nhostname = "{"h" * 64}"\n',
    "a 255-byte control file": f'[task]\ncontrol = "{{control}}"\ncontrol_files = ["{"x" * 255}"]\n',
    "known errnos": '[filesystem]\nread_only = ["/usr"]\nrefuse = ["EROFS", "EACCES", "EPERM"]\n',
    "placeholders in a value": '[environment]\nset = { HOME = "{user_tmp}/home" }\n',
}


@pytest.mark.parametrize("body", GOOD.values(), ids=GOOD.keys())
def test_the_tightened_checks_still_take_what_can_be_kept(body: str) -> None:
    profile.parse(tomllib.loads(BASE + body), "p.toml")
