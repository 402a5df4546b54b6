#!/usr/bin/env python3
"""Writes examples/sample.pcap, the capture the documented commands replay.

Four tenants (destinations 10.1.0.0/16 .. 10.4.0.0/16, as examples/tenants.toml
classifies them), 60 rounds over two seconds: per tenant and round a DNS-sized UDP
packet to port 53, an HTTP GET to port 80 (Host: www.example.com for even rounds,
ads.tracker.net for odd ones) and a TCP SYN to port 22. Deterministic: the same bytes
every run. Python 3 standard library only:

    python3 examples/make-sample-pcap.py examples/sample.pcap
"""
import struct
import sys


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4(src, dst, proto, payload):
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0x4000, 64, proto, 0,
                      bytes(src), bytes(dst))
    hdr = hdr[:10] + struct.pack("!H", checksum(hdr)) + hdr[12:]
    return hdr + payload


def l4_checksum(src, dst, proto, segment):
    pseudo = struct.pack("!4s4sBBH", bytes(src), bytes(dst), 0, proto, len(segment))
    return checksum(pseudo + segment)


def udp(src, dst, sport, dport, payload):
    seg = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    c = l4_checksum(src, dst, 17, seg) or 0xFFFF
    return ipv4(src, dst, 17, seg[:6] + struct.pack("!H", c) + seg[8:])


def tcp(src, dst, sport, dport, flags, seq, payload):
    seg = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, flags, 65535, 0, 0) + payload
    c = l4_checksum(src, dst, 6, seg)
    return ipv4(src, dst, 6, seg[:16] + struct.pack("!H", c) + seg[18:])


def ether(ip_packet):
    return bytes([2, 0, 0, 0, 0, 2]) + bytes([2, 0, 0, 0, 0, 1]) + b"\x08\x00" + ip_packet


def main(path):
    frames = []
    for r in range(60):
        for t in range(1, 5):
            src, dst = [192, 168, 1, 10 + t], [10, t, 0, 1]
            host = b"www.example.com" if r % 2 == 0 else b"ads.tracker.net"
            http = b"GET / HTTP/1.1\r\nHost: " + host + b"\r\nUser-Agent: buffet\r\n\r\n"
            frames.append(ether(udp(src, dst, 40000 + r, 53, bytes([r & 0xFF]) * 32)))
            frames.append(ether(tcp(src, dst, 41000 + r, 80, 0x18, r * 1000, http)))
            frames.append(ether(tcp(src, dst, 42000 + r, 22, 0x02, r, b"")))
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for i, f in enumerate(frames):
        ts_us = i * 2_000_000 // len(frames)
        out.append(struct.pack("<IIII", ts_us // 1_000_000, ts_us % 1_000_000, len(f), len(f)))
        out.append(f)
    with open(path, "wb") as fh:
        fh.write(b"".join(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/sample.pcap")
