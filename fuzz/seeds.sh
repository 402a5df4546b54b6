#!/usr/bin/env bash
# Fills fuzz/corpus/<target>/ with seed inputs taken from the repository's own test
# material: examples/sample.pcap's frames (plus a few hand-made IPv6, VLAN, SCTP and ARP
# frames), examples/tenants.toml (in TOML and JSON) and the documented NF policies, and
# the eBPF examples (examples/ebpf/*.c, compiled with clang -target bpf when clang is
# installed). Idempotent: seed files are named by content.
set -euo pipefail
cd "$(dirname "$0")"
root=..

python3 - "$root" <<'PY'
import hashlib, json, os, struct, sys

root = sys.argv[1]
try:
    import tomllib
except ImportError:  # Python < 3.11: the JSON seed is skipped
    tomllib = None

def put(target, data):
    d = os.path.join("corpus", target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def pcap_frames(path):
    with open(path, "rb") as f:
        raw = f.read()
    magic = raw[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    off, out = 24, []
    while off + 16 <= len(raw):
        _, _, incl, _ = struct.unpack(endian + "IIII", raw[off:off + 16])
        out.append(raw[off + 16:off + 16 + incl])
        off += 16 + incl
    return out

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return struct.pack("!H", ~s & 0xFFFF)

def eth(ethertype, dst=b"\x02\0\0\0\0\x02", src=b"\x02\0\0\0\0\x01"):
    return dst + src + struct.pack("!H", ethertype)

def ipv4(proto, src, dst, l4, dscp=0):
    h = struct.pack("!BBHHHBB2s4s4s", 0x45, dscp << 2, 20 + len(l4), 1, 0, 64, proto,
                    b"\0\0", bytes(src), bytes(dst))
    return h[:10] + csum(h) + h[12:] + l4

def ipv6(nh, src, dst, l4):
    return struct.pack("!IHBB", 6 << 28, len(l4), nh, 64) + bytes(src) + bytes(dst) + l4

udp = lambda sp, dp, p: struct.pack("!HHHH", sp, dp, 8 + len(p), 0) + p
tcp = lambda sp, dp, p: struct.pack("!HHIIBBHHH", sp, dp, 1, 0, 0x50, 0x18, 1024, 0, 0) + p
v6a = bytes.fromhex("20010db8000000000000000000000001")
v6b = bytes.fromhex("20010db8000000000000000000000053")
http = b"GET / HTTP/1.1\r\nHost: ads.tracker.net\r\n\r\n"
made = [
    eth(0x0800) + ipv4(6, [192, 168, 1, 5], [10, 2, 0, 9], tcp(40000, 80, http)),
    eth(0x0800) + ipv4(17, [10, 0, 0, 1], [10, 3, 0, 2], udp(1234, 53, b"\x03bad\x03com\0")),
    eth(0x86DD) + ipv6(17, v6a, v6b, udp(53, 53, b"query")),
    eth(0x8100) + struct.pack("!HH", 7, 0x0800) + ipv4(6, [1, 2, 3, 4], [10, 1, 0, 1], tcp(1, 2, b"evil")),
    eth(0x0800) + ipv4(132, [192, 168, 0, 1], [10, 4, 0, 1], struct.pack("!HHII", 1, 36412, 7, 0)),
    eth(0x0800) + ipv4(50, [198, 51, 100, 1], [203, 0, 113, 1], struct.pack("!II", 0x2001, 1) + b"\0" * 32),
    eth(0x0800) + ipv4(1, [10, 0, 0, 1], [10, 0, 0, 2], b"\x08\0\0\0\0\0\0\0", dscp=46),
    eth(0x0806, dst=b"\xff" * 6) + b"\0\x01\x08\0\x06\x04\0\x01" + b"\0" * 20,
]
frames = []
for fr in pcap_frames(os.path.join(root, "examples/sample.pcap")) + made:
    if fr not in frames:
        frames.append(fr)
sample = frames[:48] + made

for fr in sample:
    put("packet_classify", fr)

def batch(frs):
    return b"".join(struct.pack("!H", len(f)) + f for f in frs)

params = bytes(range(16))
for nf in range(9):
    for variant in (0, 1):
        for i in range(0, len(sample), 8):
            put("nf_handle", bytes([nf, variant]) + params + batch(sample[i:i + 8] + made[:2]))

with open(os.path.join(root, "examples/tenants.toml"), "rb") as f:
    tenants = f.read()
put("tenants_config", b"\0" + tenants)
# api_requests: ([method][route][id][auth][u16 body length][body])*, the API's own
# request shapes: admit, update, stats, a tenant token, remove, a dry-run set.
def req(m, r, n, a, body=b""):
    return bytes([m, r, n, a]) + struct.pack("!H", len(body)) + body
adm = json.dumps({"id": 5, "rules": [{"dst_ip": "10.5.0.0/16"}],
                  "policy": {"default": "allow"}}).encode()
upd = json.dumps({"id": 5, "rules": [{"dst_ip": "10.5.0.0/16"}],
                  "policy": {"default": "deny"}}).encode()
put("api_requests", req(1, 0, 5, 1, adm) + req(2, 2, 5, 1, upd) + req(0, 3, 5, 1)
    + req(1, 4, 5, 1) + req(3, 2, 5, 1))
put("api_requests", req(2, 1, 0, 1, b"[" + adm + b"]") + req(0, 6, 0, 1) + req(0, 7, 0, 1))
put("api_requests", req(1, 0, 0, 0, adm) + req(1, 0, 0, 2, adm) + req(0, 10, 0, 0))

if tomllib is not None:
    put("tenants_config", b"\1" + json.dumps(tomllib.loads(tenants.decode())).encode())
# The documented policies (docs/nfs.md, docs/ipsec.md) under one tenant each.
with open(os.path.join(root, "docs/nfs.md")) as f:
    nfs = f.read()
with open(os.path.join(root, "docs/ipsec.md")) as f:
    nfs += f.read()
blocks = nfs.split("```toml\n")[1:]
for block in blocks:
    body = block.split("```")[0]
    if "[tenant.policy]" not in body:
        continue
    text = '[[tenant]]\nid = 7\nrules = [ { dst_ip = "10.7.0.0/16", protocol = "udp", dst_port = "1000-2000" } ]\n' + body
    put("tenants_config", b"\0" + text.encode())
PY

if command -v "${CLANG:-clang}" >/dev/null 2>&1; then
  mkdir -p corpus/ebpf_load
  tmp=$(mktemp -d)
  for src in "$root"/examples/ebpf/*.c; do
    name=$(basename "$src" .c)
    if "${CLANG:-clang}" -O2 -g -target bpf -mcpu=v3 -I "$root/crates/buffet-ebpf/include" \
        -c "$src" -o "$tmp/$name.o" 2>/dev/null; then
      # Without debug info, too: smaller objects mutate faster.
      llvm-strip -g -o "$tmp/$name.stripped.o" "$tmp/$name.o" 2>/dev/null || true
      for o in "$tmp/$name.o" "$tmp/$name.stripped.o"; do
        [ -f "$o" ] && [ "$(stat -c %s "$o")" -le 8192 ] && cp "$o" "corpus/ebpf_load/$(sha1sum "$o" | cut -c1-40)"
      done
    fi
  done
  rm -rf "$tmp"
else
  echo "seeds.sh: no clang, ebpf_load starts from an empty corpus" >&2
  mkdir -p corpus/ebpf_load
fi
for t in corpus/*; do echo "seeds: $(ls "$t" | wc -l) in $t"; done
