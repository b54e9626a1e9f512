"""This host's IPv4 interface addresses, from the kernel's SIOCGIFCONF (netdevice(7)).

One ioctl, no import beyond the standard library: the witness asks for them on the way to its first
launch, where psutil.net_if_addrs() cost its import (~10 ms of a ~330 ms witness run,
bench/witness_bench.py). SIOCGIFCONF returns each interface's (or label's, `eth0:1`) primary IPv4
address: enough for a listener target, not a full inventory. For every address of every interface
(a secondary one without a label included), psutil, as conformance/plan.py does."""

from __future__ import annotations

import array
import fcntl
import socket
import struct

SIOCGIFCONF = 0x8912  # <linux/sockios.h>
IFNAMSIZ = 16
# struct ifreq: the name, then a union whose largest member (struct ifmap) is 24 bytes with 8-byte
# longs and 16 with 4-byte ones.
IFREQ_SIZE = IFNAMSIZ + (24 if struct.calcsize("P") == 8 else 16)
MAX_INTERFACES = 256


def ipv4_addresses() -> dict[str, list[str]]:
    """{interface name: [IPv4 address]} in the kernel's order. OSError if the ioctl is refused."""
    buf = array.array("B", bytes(IFREQ_SIZE * MAX_INTERFACES))
    pointer, _ = buf.buffer_info()
    # struct ifconf { int ifc_len; char *ifc_buf; } with the C compiler's alignment ("@", native).
    request = struct.pack("@iP", len(buf), pointer)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        answer = fcntl.ioctl(s.fileno(), SIOCGIFCONF, request)
    used, _ = struct.unpack("@iP", answer)
    data = buf.tobytes()[:used]
    out: dict[str, list[str]] = {}
    for at in range(0, used, IFREQ_SIZE):
        name = data[at:at + IFNAMSIZ].split(b"\0", 1)[0].decode(errors="replace")
        # ifr_addr: a struct sockaddr_in (family, port, then the address) after the name.
        family = struct.unpack_from("@H", data, at + IFNAMSIZ)[0]
        if family == socket.AF_INET:
            out.setdefault(name, []).append(socket.inet_ntoa(data[at + IFNAMSIZ + 4:at + IFNAMSIZ + 8]))
    return out
