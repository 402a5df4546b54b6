#!/usr/bin/python3
"""Writes the frame trace vectors under tests/vectors/: `args`, `tenants.toml` and
`frames.csv` of each, from the definitions below (deterministic: no randomness, no
third-party modules).

    /usr/bin/python3 scripts/frame-vectors.py           # write them
    /usr/bin/python3 scripts/frame-vectors.py --check   # fail if a written file differs

Each frame is built field by field here and written as one `ts_ns,hex_frame` line with
a `#` comment above it saying what it is, which tenant it must go to and why. The
expected outputs (`expected.out`, `expected.err`) are not written here: they are derived
by hand from those comments and committed next to them (tests/vectors/README.md).
"""

import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tests" / "vectors"

SRC_MAC = bytes([2, 0, 0, 0, 0, 1])
DST_MAC = bytes([2, 0, 0, 0, 0, 2])


def csum(data):
    """The Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def v4(a):
    return bytes(int(x) for x in a.split("."))


def v6(a):
    """An IPv6 address (`::` allowed once; a dotted IPv4 tail allowed)."""
    head, _, tail = a.partition("::") if "::" in a else (a, "", None)

    def groups(s):
        out = []
        for g in [g for g in s.split(":") if g]:
            if "." in g:
                b = v4(g)
                out += [b[0] << 8 | b[1], b[2] << 8 | b[3]]
            else:
                out.append(int(g, 16))
        return out

    h = groups(head)
    t = groups(tail) if tail is not None else []
    mid = [0] * (8 - len(h) - len(t))
    return b"".join(struct.pack("!H", g) for g in h + mid + t)


def eth(ether_type, payload, vlan=None):
    tag = struct.pack("!HH", 0x8100, vlan) if vlan is not None else b""
    return DST_MAC + SRC_MAC + tag + struct.pack("!H", ether_type) + payload


def pseudo4(src, dst, proto, length):
    return src + dst + struct.pack("!BBH", 0, proto, length)


def pseudo6(src, dst, proto, length):
    return src + dst + struct.pack("!IxxxB", length, proto)


def udp(sport, dport, payload, pseudo):
    length = 8 + len(payload)
    hdr = struct.pack("!HHHH", sport, dport, length, 0)
    c = csum(pseudo(17, length) + hdr + payload) or 0xFFFF
    return struct.pack("!HHHH", sport, dport, length, c) + payload


def tcp(sport, dport, pseudo, flags=0x02):
    hdr = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, flags, 1000, 0, 0)
    c = csum(pseudo(6, len(hdr)) + hdr)
    return hdr[:16] + struct.pack("!H", c) + hdr[18:]


def icmp_echo():
    body = struct.pack("!BBHHH", 8, 0, 0, 1, 1)
    return body[:2] + struct.pack("!H", csum(body)) + body[4:]


def ipv4(src, dst, proto, l4, options=b"", frag=0, total=None, ihl=None, tos=0):
    """An IPv4 packet; `frag` is the 16-bit flags + fragment offset field; `total` and
    `ihl` override the computed total length and header length (malformed frames)."""
    hlen = 20 + len(options)
    ihl = hlen // 4 if ihl is None else ihl
    total = hlen + len(l4) if total is None else total
    s, d = v4(src), v4(dst)
    hdr = struct.pack("!BBHHHBBH4s4s", 4 << 4 | ihl, tos, total, 1, frag, 64, proto, 0, s, d)
    hdr += options
    hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
    return eth(0x0800, hdr + l4)


def udp4(src, dst, sport, dport, payload=b"data", vlan=None, **ip):
    p = lambda proto, n: pseudo4(v4(src), v4(dst), proto, n)
    frame = ipv4(src, dst, 17, udp(sport, dport, payload, p), **ip)
    return retag(frame, vlan)


def tcp4(src, dst, sport, dport):
    p = lambda proto, n: pseudo4(v4(src), v4(dst), proto, n)
    return ipv4(src, dst, 6, tcp(sport, dport, p))


def udp6(src, dst, sport, dport, payload=b"data"):
    s, d = v6(src), v6(dst)
    l4 = udp(sport, dport, payload, lambda proto, n: pseudo6(s, d, proto, n))
    hdr = struct.pack("!IHBB16s16s", 6 << 28, len(l4), 17, 64, s, d)
    return eth(0x86DD, hdr + l4)


def retag(frame, vlan):
    """Inserts a VLAN tag after the MAC addresses."""
    if vlan is None:
        return frame
    return frame[:12] + struct.pack("!HH", 0x8100, vlan) + frame[12:]


def arp_request():
    body = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, SRC_MAC, v4("10.9.9.9"), bytes(6), v4("10.9.9.1"))
    return eth(0x0806, body)


# The vectors. Each frame: (ts_ns, comment, bytes). Comments say what the frame is and
# which tenant it must go to, and why; the expected files are derived from them.

OTHER = "172.16.0.1"  # a destination no prefix rule covers
ME = "10.9.9.9"  # the default source, no source rule covers it

EDGES_TENANTS = """\
# Classifier edge cases. K = 2: even ids on worker 0, odd ids on worker 1. No MAX_NB.
# Lower priority wins; equal priorities: the rule admitted first (file order) wins.

[[tenant]]
id = 10
name = "host"
rules = [ { dst_ip = "10.1.2.3/32", priority = 10 } ]

[[tenant]]
id = 11
name = "prefix16"
rules = [ { dst_ip = "10.1.0.0/16", priority = 20 } ]

[[tenant]]
id = 12
name = "source"
rules = [ { src_ip = "192.168.0.0/16", priority = 50 } ]

[[tenant]]
id = 13
name = "tcp-range"
rules = [ { protocol = "tcp", dst_port = "1000-1999", priority = 60 } ]

[[tenant]]
id = 14
name = "dns"
rules = [ { protocol = "udp", dst_port = 53, priority = 60 } ]

[[tenant]]
id = 15
name = "v6"
rules = [ { dst_ip = "2001:db8:1::/48", priority = 70 } ]

[[tenant]]
id = 16
name = "vlan42"
rules = [ { vlan = 42, priority = 80 } ]
"""

EDGES_FRAMES = [
    (0, "IPv4/UDP to 10.1.2.3: the /32 of tenant 10 (priority 10) and the /16 of tenant 11 "
        "(priority 20) both match; the lower priority wins -> tenant 10, worker 0",
     udp4(ME, "10.1.2.3", 1000, 9)),
    (1, "IPv4/UDP to 10.1.2.4: only the /16 matches -> tenant 11, worker 1",
     udp4(ME, "10.1.2.4", 1000, 9)),
    (2, "IPv4/UDP to 10.2.0.1: outside 10.1.0.0/16, no other rule -> unmatched",
     udp4(ME, "10.2.0.1", 1000, 9)),
    (3, "IPv4/UDP from 192.168.5.5 to 172.16.0.1: the source prefix -> tenant 12, worker 0",
     udp4("192.168.5.5", OTHER, 1000, 9)),
    (4, "IPv4/UDP from 192.168.5.5 to 10.1.2.3: source rule (priority 50) and the /32 "
        "(priority 10) -> tenant 10, worker 0",
     udp4("192.168.5.5", "10.1.2.3", 1000, 9)),
    (5, "TCP to port 1000, the range's low end -> tenant 13, worker 1",
     tcp4(ME, OTHER, 40000, 1000)),
    (6, "TCP to port 1999, the range's high end -> tenant 13, worker 1",
     tcp4(ME, OTHER, 40000, 1999)),
    (7, "TCP to port 999, one below the range -> unmatched",
     tcp4(ME, OTHER, 40000, 999)),
    (8, "TCP to port 2000, one above the range -> unmatched",
     tcp4(ME, OTHER, 40000, 2000)),
    (9, "UDP to port 1500: inside the range, but tenant 13's rule is TCP only -> unmatched",
     udp4(ME, OTHER, 40000, 1500)),
    (10, "UDP to port 53 -> tenant 14, worker 0",
     udp4(ME, OTHER, 40000, 53)),
    (11, "TCP to port 53: tenant 14's rule is UDP only -> unmatched",
     tcp4(ME, OTHER, 40000, 53)),
    (12, "ICMP echo request: no ports, so no port rule can match -> unmatched",
     ipv4(ME, OTHER, 1, icmp_echo())),
    (13, "UDP, a non-first fragment (offset 1480) whose payload starts like a UDP header "
         "to port 53: a non-first fragment has no ports -> unmatched",
     ipv4(ME, OTHER, 17, struct.pack("!HHHH", 40000, 53, 16, 0) + b"datadata", frag=185)),
    (14, "UDP to port 53, first fragment (more-fragments set, offset 0): it has ports -> "
         "tenant 14, worker 0",
     udp4(ME, OTHER, 40000, 53, frag=0x2000)),
    (15, "UDP to port 53 in IPv4 with 4 bytes of options (IHL 6, four NOPs): the ports "
         "follow the options -> tenant 14, worker 0 (a parser assuming IHL 5 would read "
         "port 257 from the options)",
     udp4(ME, OTHER, 40000, 53, options=b"\x01\x01\x01\x01")),
    (16, "IPv6/UDP to 2001:db8:1::5: inside 2001:db8:1::/48 -> tenant 15, worker 1",
     udp6("2001:db8::9", "2001:db8:1::5", 40000, 9)),
    (17, "IPv6/UDP to 2001:db8:2::5: outside the /48 -> unmatched",
     udp6("2001:db8::9", "2001:db8:2::5", 40000, 9)),
    (18, "IPv6/UDP to ::ffff:10.1.2.3: the IPv4-mapped form of tenant 10's host, but an "
         "IPv4 prefix matches IPv4 packets only -> unmatched",
     udp6("2001:db8::9", "::ffff:10.1.2.3", 40000, 9)),
    (19, "VLAN 42 tagged IPv4/UDP to 172.16.0.1 -> tenant 16, worker 0",
     udp4(ME, OTHER, 40000, 9, vlan=42)),
    (20, "VLAN 43 tagged: no VLAN 42 -> unmatched",
     udp4(ME, OTHER, 40000, 9, vlan=43)),
    (21, "VLAN 42 tagged IPv4/UDP to 10.1.2.3: the /32 (priority 10) beats the VLAN rule "
         "(priority 80) -> tenant 10, worker 0",
     udp4(ME, "10.1.2.3", 40000, 9, vlan=42)),
    (22, "ARP request: neither IPv4 nor IPv6 -> malformed (unsupported EtherType)",
     arp_request()),
    (23, "IPv4 cut after 10 bytes of its header -> malformed (truncated IP header)",
     udp4(ME, "10.1.2.3", 1000, 9)[:24]),
    (24, "IPv4/UDP to 10.1.2.3 whose total length (100) is beyond the frame -> malformed",
     udp4(ME, "10.1.2.3", 1000, 9, total=100)),
    (25, "IPv4/TCP to port 1000 with only 10 bytes of TCP header -> malformed (truncated L4)",
     ipv4(ME, OTHER, 6, tcp4(ME, OTHER, 40000, 1000)[34:44])),
    (26, "IPv4/UDP to 10.1.2.3 with IHL 4 -> malformed (IHL below 5)",
     udp4(ME, "10.1.2.3", 1000, 9, ihl=4)),
    (27, "A VLAN EtherType with no room for the tag (14 bytes) -> malformed",
     DST_MAC + SRC_MAC + b"\x81\x00"),
    (28, "IPv4/UDP from 10.9.9.9 to 172.16.0.1 port 9: no rule -> unmatched",
     udp4(ME, OTHER, 40000, 9)),
]

PRIORITIES_TENANTS = """\
# Overlapping rules and priorities. K = 2: even ids on worker 0, odd ids on worker 1.
# Lower priority wins; equal priorities: the rule admitted first wins, and tenants are
# admitted in file order (not id order), each tenant's rules in their order.

[[tenant]]
id = 31
name = "first"
rules = [ { dst_ip = "10.5.0.0/16", priority = 50 } ]

[[tenant]]
id = 30
name = "same-rule-later"
rules = [ { dst_ip = "10.5.0.0/16", priority = 50 } ]

[[tenant]]
id = 32
name = "longer-prefix-worse-priority"
rules = [ { dst_ip = "10.5.5.0/24", priority = 60 } ]

[[tenant]]
id = 33
name = "host"
rules = [ { dst_ip = "10.5.5.5/32", priority = 10 } ]

[[tenant]]
id = 34
name = "two-rules"
rules = [ { dst_ip = "10.6.0.0/16", priority = 40 },
          { protocol = "udp", dst_port = "7000-7099", priority = 5 } ]

[[tenant]]
id = 35
name = "tie-later"
rules = [ { protocol = "udp", dst_port = 7050, priority = 5 } ]
"""

PRIORITIES_FRAMES = [
    (0, "UDP to 10.5.1.1 port 9: tenants 31 and 30 have the same rule at priority 50; "
        "31 comes first in the file -> tenant 31, worker 1",
     udp4(ME, "10.5.1.1", 40000, 9)),
    (1, "UDP to 10.5.5.1: the /24 of tenant 32 is longer but priority 60 loses to 50 -> "
        "tenant 31, worker 1",
     udp4(ME, "10.5.5.1", 40000, 9)),
    (2, "UDP to 10.5.5.5: the /32 at priority 10 -> tenant 33, worker 1",
     udp4(ME, "10.5.5.5", 40000, 9)),
    (3, "UDP to 10.6.0.1 port 9: tenant 34's first rule -> tenant 34, worker 0",
     udp4(ME, "10.6.0.1", 40000, 9)),
    (4, "UDP to 172.16.0.1 port 7050: tenant 34's second rule and tenant 35's rule, both "
        "priority 5; 34 was admitted first -> tenant 34, worker 0",
     udp4(ME, OTHER, 40000, 7050)),
    (5, "UDP to port 7000, the range's low end -> tenant 34, worker 0",
     udp4(ME, OTHER, 40000, 7000)),
    (6, "UDP to port 7099, the range's high end -> tenant 34, worker 0",
     udp4(ME, OTHER, 40000, 7099)),
    (7, "UDP to port 7100, one above -> unmatched",
     udp4(ME, OTHER, 40000, 7100)),
    (8, "UDP to port 6999, one below -> unmatched",
     udp4(ME, OTHER, 40000, 6999)),
    (9, "UDP to 10.5.1.1 port 7050: the port rule (priority 5) beats the /16 (50) -> "
        "tenant 34, worker 0",
     udp4(ME, "10.5.1.1", 40000, 7050)),
    (10, "TCP to 10.5.1.1 port 7050: tenant 34's port rule is UDP only, the /16 matches "
         "TCP too -> tenant 31, worker 1",
     tcp4(ME, "10.5.1.1", 40000, 7050)),
    (11, "UDP to 10.5.5.5 port 7050: priority 5 beats the /32's 10 -> tenant 34, worker 0",
     udp4(ME, "10.5.5.5", 40000, 7050)),
]

MIGRATE_TENANTS = """\
# Classification feeds the scheduler: the overload_migration trace, with frames.
# K = 2; tenant 4 and 10 start on worker 0, tenant 7 on worker 1; MAX_NB from
# --tenant-max (2) for all three.

[[tenant]]
id = 4
rules = [ { dst_ip = "10.4.0.0/16" } ]

[[tenant]]
id = 10
rules = [ { dst_ip = "10.10.0.0/16" } ]

[[tenant]]
id = 7
rules = [ { protocol = "tcp", dst_port = 80 } ]
"""

MIGRATE_FRAMES = [
    (0, "timeslot 0. UDP to 10.4.0.1 -> tenant 4 (new on w0, pkt 1), pass 0",
     udp4(ME, "10.4.0.1", 40000, 9)),
    (0, "UDP to 10.4.0.2 -> tenant 4 (pkt 2), pass 0",
     udp4(ME, "10.4.0.2", 40000, 9)),
    (0, "UDP to 10.4.0.3 -> tenant 4, pkt 3 > MAX_NB 2: drop (policed; w0 not charged)",
     udp4(ME, "10.4.0.3", 40000, 9)),
    (0, "UDP to 10.99.0.1 -> unmatched: no tenant, no counter moves",
     udp4(ME, "10.99.0.1", 40000, 9)),
    (0, "UDP to 10.10.0.1 -> tenant 10 on w0 (w0.pkt 3), pass 0",
     udp4(ME, "10.10.0.1", 40000, 9)),
    (0, "UDP to 10.10.0.1 -> tenant 10 (w0.pkt 4), pass 0",
     udp4(ME, "10.10.0.1", 40000, 9)),
    (0, "TCP to port 80 -> tenant 7 on w1 (w1.pkt 1), pass 1",
     tcp4(ME, OTHER, 40000, 80)),
    (0, "ARP -> malformed: no counter moves",
     arp_request()),
    (1, "timeslot 1. UDP to 10.4.0.1 -> tenant 4: tmp 3 (the policed packet counts); w0 "
        "last 4 >= 4: overloaded; mig w1 (last 1); 1 + 3 < 4 fails -> stays on w0; times 1 "
        "> threshold 0 -> overload report (w0, timeslot 1); pass 0",
     udp4(ME, "10.4.0.1", 40000, 9)),
    (1, "UDP to 10.10.0.1 -> tenant 10: tmp 2; w0 still overloaded; 1 + 2 < 4 -> moves to "
        "w1 (w0.last 2, w1.last 3), this packet already to w1; times 2 -> report (w0, 1)",
     udp4(ME, "10.10.0.1", 40000, 9)),
    (1, "UDP to port 80 -> unmatched (tenant 7's rule is TCP): no counter moves",
     udp4(ME, OTHER, 40000, 80)),
    (1, "TCP to port 80 -> tenant 7: tmp 1; w1 last 3 < 4 -> pass 1",
     tcp4(ME, OTHER, 40000, 80)),
    (1, "UDP to 10.10.0.2 -> tenant 10 (pkt 2), pass 1",
     udp4(ME, "10.10.0.2", 40000, 9)),
    (1, "UDP to 10.10.0.3 -> tenant 10, pkt 3 > 2: drop",
     udp4(ME, "10.10.0.3", 40000, 9)),
    (3, "timeslot 3. UDP to 10.4.0.1 -> tenant 4; it and w0 were idle in timeslot 2: tmp 0, "
        "last 0 < 4 -> pass 0",
     udp4(ME, "10.4.0.1", 40000, 9)),
]

VECTORS = {
    "classify_edges": (
        "# Classifier edge cases; no overload (worker MAX_NB 100), shift 0.\n"
        "--workers 2 --worker-max 100 --shift 0 --threshold 3\n",
        EDGES_TENANTS,
        EDGES_FRAMES,
    ),
    "classify_priorities": (
        "# Overlapping rules, priorities and ties; no overload.\n"
        "--workers 2 --worker-max 100 --shift 0 --threshold 3\n",
        PRIORITIES_TENANTS,
        PRIORITIES_FRAMES,
    ),
    "classify_then_migrate": (
        "# The overload_migration vector's schedule, reached through the classifier.\n"
        "--workers 2 --worker-max 4 --tenant-max 2 --shift 0 --threshold 0\n",
        MIGRATE_TENANTS,
        MIGRATE_FRAMES,
    ),
}


def frames_csv(frames):
    lines = ["# Written by scripts/frame-vectors.py; edit it there.", "ts_ns,hex_frame"]
    for seq, (ts, comment, frame) in enumerate(frames):
        lines.append(f"# seq {seq}: {comment} ({len(frame)} bytes)")
        lines.append(f"{ts},{frame.hex()}")
    return "\n".join(lines) + "\n"


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit("usage: frame-vectors.py [--check]")
    stale = []
    for name, (args, tenants, frames) in VECTORS.items():
        d = ROOT / name
        files = {"args": args, "tenants.toml": tenants, "frames.csv": frames_csv(frames)}
        for f, text in files.items():
            p = d / f
            if check:
                if not p.exists() or p.read_text() != text:
                    stale.append(str(p))
            else:
                d.mkdir(parents=True, exist_ok=True)
                p.write_text(text)
    if stale:
        sys.exit("out of date (run scripts/frame-vectors.py): " + ", ".join(stale))


if __name__ == "__main__":
    main()
