#!/usr/bin/python3
"""scapy as an independent ESP peer for crates/buffet-nfs/tests/ipsec_interop.rs.

Tunnel-mode ESP with AES-GCM (RFC 4106, 16-byte ICV), through scapy's own
SecurityAssociation; nothing here knows about Buffet.

  scapy_esp.py decrypt IN.pcap SPI KEYHEX [ESN_HI]
      For every frame: the decrypted inner IPv4 packet in hex, or "ERR <exception>"
      when scapy refuses it (a bad ICV raises IPSecIntegrityError). With ESN_HI, the SA
      uses extended sequence numbers whose high 32 bits are ESN_HI.
  scapy_esp.py encrypt OUT.pcap SPI KEYHEX SRC DST COUNT [ESN_START]
      Encrypts COUNT inner packets (UDP of growing sizes, TCP, ICMP) with sequence
      numbers 1..COUNT (or, with extended sequence numbers, ESN_START, ESN_START+1, ...),
      writes the Ethernet frames to OUT.pcap and prints each inner IPv4 packet in hex,
      one per line.

KEYHEX is RFC 4106 keying material: the AES key followed by the 4-byte salt.
Run with Debian's /usr/bin/python3 (python3-scapy, python3-cryptography).
"""
import sys

from scapy.all import Ether, IP, UDP, TCP, ICMP, Raw, rdpcap, wrpcap, conf
from scapy.layers.ipsec import ESP, SecurityAssociation

conf.verb = 0


def sa(spi, keyhex, src="0.0.0.0", dst="0.0.0.0"):
    return SecurityAssociation(
        ESP,
        spi=spi,
        crypt_algo="AES-GCM",
        crypt_key=bytes.fromhex(keyhex),
        tunnel_header=IP(src=src, dst=dst),
    )


def inner(i):
    src, dst = "10.2.0.%d" % (1 + i % 200), "10.1.0.1"
    if i % 7 == 5:
        return IP(src=src, dst=dst, tos=0xb8) / TCP(sport=40000 + i, dport=40443, flags="PA", seq=i) / Raw(b"t" * i)
    if i % 7 == 6:
        return IP(src=src, dst=dst) / ICMP(id=7, seq=i) / Raw(b"ping %d" % i)
    return IP(src=src, dst=dst, id=i) / UDP(sport=40001, dport=40002) / Raw(bytes((i + j) % 256 for j in range(3 * i)))


def main(argv):
    cmd = argv[1]
    if cmd == "decrypt":
        path, spi, keyhex = argv[2], int(argv[3], 0), argv[4]
        esn = {"esn_en": True, "esn": int(argv[5], 0)} if len(argv) > 5 else {}
        s = sa(spi, keyhex)
        for frame in rdpcap(path):
            try:
                print(bytes(s.decrypt(frame[IP], **esn)).hex())
            except Exception as e:  # noqa: BLE001 - the exception's name is the answer
                print("ERR", type(e).__name__)
    elif cmd == "encrypt":
        path, spi, keyhex, src, dst, count = argv[2], int(argv[3], 0), argv[4], argv[5], argv[6], int(argv[7])
        esn_start = int(argv[8], 0) if len(argv) > 8 else None
        s = sa(spi, keyhex, src, dst)
        frames = []
        for i in range(count):
            p = IP(bytes(inner(i)))  # fill in lengths and checksums once
            if esn_start is None:
                e = s.encrypt(p)
            else:
                # scapy takes the low half from the SA's counter, the high half as `esn`.
                full = esn_start + i
                s.seq_num = full & 0xFFFFFFFF
                e = s.encrypt(p, esn_en=True, esn=full >> 32)
            frames.append(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / e)
            print(bytes(p).hex())
        wrpcap(path, frames)
    else:
        sys.exit("usage: see the module docstring")


if __name__ == "__main__":
    main(sys.argv)
