"""kernel/netif.py against psutil (getifaddrs(3)) on this host, and in a network namespace of its own."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sandbox_conformance.kernel.netif import ipv4_addresses

REPO = Path(__file__).resolve().parent.parent


def test_each_interface_with_an_ipv4_address_gives_its_first_one_as_getifaddrs_does() -> None:
    ours = ipv4_addresses()
    theirs = {name: [a.address for a in addrs if a.family == socket.AF_INET]
              for name, addrs in psutil.net_if_addrs().items()}
    assert ours, "a host has at least loopback"
    assert ours["lo"][0].startswith("127.")
    for name, addrs in theirs.items():
        if addrs:
            assert name in ours and ours[name][0] == addrs[0], (name, ours, theirs)
    for name, addrs in ours.items():
        assert set(addrs) <= set(theirs.get(name, [])), (name, ours, theirs)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1)")
def test_in_a_fresh_network_namespace_there_is_nothing_until_loopback_is_up() -> None:
    code = ("import json; from sandbox_conformance.kernel.netif import ipv4_addresses; "
            "print(json.dumps(ipv4_addresses()))")
    done = subprocess.run(["unshare", "--net", "--map-root-user", sys.executable, "-c", code], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"unshare --net refused here: {done.stderr.strip()}")
    assert json.loads(done.stdout) == {}, "lo is down in a new namespace: no address to list"
