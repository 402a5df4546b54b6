//! The ipsec NF against independent ESP implementations and published test vectors.
//!
//! This machine's kernel has no ESP (no xfrm), so the peers are userspace:
//!
//! * **Wireshark** (`tshark`): ESP the NF produces is decrypted by Wireshark's ESP
//!   dissector with an `esp_sa` entry "AES-GCM with 16 octet ICV [RFC4106]", which also
//!   verifies the ICV (`esp.icv_good`); a frame with one flipped ICV bit must come out as
//!   `esp.icv_bad`, so the check is known to be live.
//! * **scapy** (`SecurityAssociation(ESP, crypt_algo='AES-GCM', …)`, on top of
//!   python3-cryptography): decrypts what the NF produces, and produces ESP that the NF
//!   must decrypt. The script is `tests/interop/scapy_esp.py`.
//! * **draft-mcgrew-gcm-test-01**: the ESP packets of its AES-GCM test cases with 32-bit
//!   sequence numbers, rebuilt byte for byte by [`esp_seal`] and opened by [`esp_open`]
//!   (case 3 is AES-256; cases 2, 4 and 12 are AES-128 and check the framing, AAD and
//!   nonce construction). These need no tool and always run.
//!
//! A missing tool skips its test with a message, unless `CI=true` or
//! `BUFFET_REQUIRE_PRIVILEGED=1`: then it is a failure. Debian packages: `tshark`,
//! `python3-scapy`, `python3-cryptography`; scapy is run with `/usr/bin/python3`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use buffet_nfs::ipsec::{
    esp_header, esp_open, esp_pad_len, esp_seal, EspCipher, InboundSaPolicy, IpsecPolicy,
    IpsecState, OpenError, OutboundSaPolicy,
};
use buffet_nfs::Ipsec;
use buffet_sdk::etherparse::{IpNumber, PacketBuilder};
use buffet_sdk::{DropCause, NetworkFunction, Packet, PacketMeta, Verdict};
use pcap_file::pcap::{PcapPacket, PcapReader, PcapWriter};

const LOCAL: &str = "203.0.113.1";
const REMOTE: &str = "198.51.100.1";
const SPI_OUT: u32 = 0x0000_c0de;
const SPI_IN: u32 = 0x0000_beef;
/// AES-256 key then salt, as policy, tshark, scapy and `ip xfrm` all take it.
const KEY_OUT: &str = "4a6f6e6573207361797320746869732069732061206b657920666f7220455350deadbeef";
const KEY_IN: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff13572468a";
const SCAPY: &str = "/usr/bin/python3";

// ---------------------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------------------

fn required() -> bool {
    let ci = std::env::var("CI").unwrap_or_default();
    ci.eq_ignore_ascii_case("true")
        || ci == "1"
        || std::env::var("BUFFET_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1")
}

/// Whether `what` can be used; panics when it cannot and the environment requires it.
fn available(what: &str, probe: &mut Command) -> bool {
    let why = match probe.output() {
        Ok(o) if o.status.success() => return true,
        Ok(o) => format!(
            "{} ({})",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => e.to_string(),
    };
    if required() {
        panic!(
            "{what} is required (CI=true or BUFFET_REQUIRE_PRIVILEGED=1) but unusable: {why}; \
             install tshark python3-scapy python3-cryptography"
        );
    }
    eprintln!(
        "SKIPPED: {what} unusable ({why}); install the Debian packages tshark, python3-scapy, \
         python3-cryptography to run this interop test"
    );
    false
}

fn have_tshark() -> bool {
    available("tshark", Command::new("tshark").arg("--version"))
}

fn have_scapy() -> bool {
    available(
        "scapy with AES-GCM (/usr/bin/python3 with python3-scapy and python3-cryptography)",
        Command::new(SCAPY).args([
            "-c",
            "import scapy.layers.ipsec, cryptography.hazmat.primitives.ciphers.aead",
        ]),
    )
}

fn scapy_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/scapy_esp.py")
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tool output is UTF-8")
}

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ipsec_interop");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}-{name}", std::process::id()))
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut w = PcapWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    for (i, f) in frames.iter().enumerate() {
        let ts = Duration::from_millis(i as u64);
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, f))
            .unwrap();
    }
}

fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let mut r = PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut frames = Vec::new();
    while let Some(p) = r.next_packet() {
        frames.push(p.unwrap().data.into_owned());
    }
    frames
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------
// The NF under test
// ---------------------------------------------------------------------------------------

/// A tenant of the ipsec NF: 10.2.0.0/16 behind the peer, through SPI_OUT; the peer
/// sends back through SPI_IN.
fn gateway() -> IpsecState {
    let policy = IpsecPolicy {
        outbound: vec![OutboundSaPolicy {
            spi: SPI_OUT,
            key: KEY_OUT.into(),
            local: LOCAL.into(),
            remote: REMOTE.into(),
            selector: "10.2.0.0/16".into(),
            ttl: None,
        }],
        inbound: vec![InboundSaPolicy {
            spi: SPI_IN,
            key: KEY_IN.into(),
            local: LOCAL.into(),
            remote: REMOTE.into(),
            selector: Some("10.2.0.0/16".into()),
            replay_window: None,
        }],
        ..Default::default()
    };
    let mut state = IpsecState::default();
    Ipsec::default().init(&policy, &mut state).unwrap();
    state
}

/// Runs one frame through the NF in a 2048-byte buffer (an Mbuf's size).
fn handle(state: &mut IpsecState, frame: &[u8]) -> (Verdict, Vec<u8>) {
    let mut buf = vec![0u8; 2048];
    buf[..frame.len()].copy_from_slice(frame);
    let mut pkt = Packet::parse_with_capacity(&mut buf, frame.len(), PacketMeta::default())
        .expect("test frames parse");
    let verdict = Ipsec::default().handle(&mut pkt, state);
    (verdict, pkt.data().to_vec())
}

/// The payload of inner packet `i`: lengths cover every padding length, one is large.
fn payload(i: usize) -> Vec<u8> {
    let mut p = format!("buffet esp #{i:02} ").into_bytes();
    p.extend(std::iter::repeat_n(
        b'a' + (i % 26) as u8,
        if i == 9 { 1300 } else { i },
    ));
    p
}

fn inner_frame(i: usize) -> Vec<u8> {
    let mut v = Vec::new();
    // Ports above 40000: no Wireshark heuristic dissector claims the payload.
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 1, 0, 1], [10, 2, 0, (i + 1) as u8], 64)
        .udp(40001, 40002)
        .write(&mut v, &payload(i))
        .unwrap();
    v
}

/// Ten inner frames encapsulated by the NF, then the last one again with its ICV's last
/// bit flipped (the negative control).
fn buffet_esp() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut gw = gateway();
    let inner: Vec<Vec<u8>> = (0..10).map(inner_frame).collect();
    let mut esp: Vec<Vec<u8>> = inner
        .iter()
        .map(|f| {
            let (v, out) = handle(&mut gw, f);
            assert_eq!(v, Verdict::Pass);
            out
        })
        .collect();
    let mut bad = esp[9].clone();
    *bad.last_mut().unwrap() ^= 1;
    esp.push(bad);
    (inner, esp)
}

// ---------------------------------------------------------------------------------------
// Wireshark
// ---------------------------------------------------------------------------------------

#[test]
fn wireshark_decrypts_and_verifies_buffet_esp() {
    if !have_tshark() {
        return;
    }
    let (inner, esp) = buffet_esp();
    let pcap = tmp("buffet-esp.pcap");
    write_pcap(&pcap, &esp);
    // UAT fields: protocol, src, dst, SPI, encryption, key (key ‖ salt), authentication, its key.
    let sa = format!(
        "uat:esp_sa:\"IPv4\",\"{LOCAL}\",\"{REMOTE}\",\"{SPI_OUT:#010x}\",\
         \"AES-GCM with 16 octet ICV [RFC4106]\",\"0x{KEY_OUT}\",\"NULL\",\"\""
    );
    let out = run_ok(Command::new("tshark").arg("-r").arg(&pcap).args([
        "-n",
        "-o",
        "esp.enable_encryption_decode:TRUE",
        "-o",
        "esp.enable_authentication_check:TRUE",
        "-o",
        &sa,
        "-T",
        "fields",
        "-E",
        "separator=|",
        "-e",
        "esp.spi",
        "-e",
        "esp.sequence",
        "-e",
        "esp.icv_good",
        "-e",
        "esp.icv_bad",
        "-e",
        "esp.pad_len",
        "-e",
        "esp.protocol",
        "-e",
        "ip.src",
        "-e",
        "ip.dst",
        "-e",
        "udp.payload",
    ]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), esp.len(), "tshark output:\n{out}");
    for (i, line) in lines.iter().enumerate() {
        let f: Vec<&str> = line.split('|').collect();
        assert_eq!(f.len(), 9, "{line}");
        let seq = if i == 10 { 10 } else { i + 1 };
        assert_eq!(f[0], format!("{SPI_OUT:#010x}"), "{line}");
        assert_eq!(f[1], seq.to_string(), "{line}");
        if i == 10 {
            assert_eq!((f[2], f[3]), ("0", "1"), "tampered ICV must be bad: {line}");
            continue;
        }
        assert_eq!((f[2], f[3]), ("1", "0"), "ICV must verify: {line}");
        let inner_ip = &inner[i][14..];
        assert_eq!(f[4], esp_pad_len(inner_ip.len()).to_string(), "{line}");
        assert_eq!(f[5], "0x04", "next header IPv4: {line}");
        assert_eq!(
            f[6],
            format!("{LOCAL},10.1.0.1"),
            "outer, inner source: {line}"
        );
        assert_eq!(f[7], format!("{REMOTE},10.2.0.{}", i + 1), "{line}");
        assert_eq!(f[8], hex(&payload(i)), "decrypted payload: {line}");
    }
    let _ = std::fs::remove_file(pcap);
}

// ---------------------------------------------------------------------------------------
// scapy
// ---------------------------------------------------------------------------------------

#[test]
fn scapy_decrypts_buffet_esp() {
    if !have_scapy() {
        return;
    }
    let (inner, esp) = buffet_esp();
    let pcap = tmp("buffet-esp-scapy.pcap");
    write_pcap(&pcap, &esp);
    let out = run_ok(
        Command::new(SCAPY)
            .arg(scapy_script())
            .arg("decrypt")
            .arg(&pcap)
            .arg(SPI_OUT.to_string())
            .arg(KEY_OUT),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), esp.len(), "scapy output:\n{out}");
    for (i, f) in inner.iter().enumerate() {
        assert_eq!(lines[i], hex(&f[14..]), "packet {i}: scapy's inner packet");
    }
    assert_eq!(lines[10], "ERR IPSecIntegrityError", "tampered ICV");
    let _ = std::fs::remove_file(pcap);
}

#[test]
fn buffet_decrypts_scapy_esp() {
    if !have_scapy() {
        return;
    }
    const COUNT: usize = 24;
    let pcap = tmp("scapy-esp.pcap");
    let out = run_ok(
        Command::new(SCAPY)
            .arg(scapy_script())
            .arg("encrypt")
            .arg(&pcap)
            .arg(SPI_IN.to_string())
            .arg(KEY_IN)
            .args([REMOTE, LOCAL])
            .arg(COUNT.to_string()),
    );
    let expected: Vec<Vec<u8>> = out.lines().map(unhex).collect();
    let frames = read_pcap(&pcap);
    let _ = std::fs::remove_file(&pcap);
    assert_eq!((expected.len(), frames.len()), (COUNT, COUNT));

    let mut gw = gateway();
    // The last packet is held back to be tampered with first.
    for (i, (frame, want)) in frames.iter().zip(&expected).enumerate().take(COUNT - 1) {
        assert_eq!(esp_header(&frame[34..]), Some((SPI_IN, i as u32 + 1)));
        let (v, out) = handle(&mut gw, frame);
        assert_eq!(v, Verdict::Pass, "scapy packet {i}");
        assert_eq!(&out[14..], &want[..], "scapy packet {i}: inner packet");
        assert_eq!(&out[..14], &frame[..14], "Ethernet header kept");
    }
    let last = &frames[COUNT - 1];
    let mut bad = last.clone();
    bad[60] ^= 0x80;
    assert_eq!(handle(&mut gw, &bad).0, Verdict::Drop(DropCause::Integrity));
    let (v, out) = handle(&mut gw, last);
    assert_eq!((v, &out[14..]), (Verdict::Pass, &expected[COUNT - 1][..]));
    // The same packets again are replays.
    assert_eq!(handle(&mut gw, last).0, Verdict::Drop(DropCause::Replay));
    assert_eq!(
        handle(&mut gw, &frames[0]).0,
        Verdict::Drop(DropCause::Replay)
    );
    let c = gw.counters();
    assert_eq!(
        (c.decapsulated, c.bad_icv, c.replayed),
        (COUNT as u64, 1, 2),
        "{c:?}"
    );
}

// ---------------------------------------------------------------------------------------
// draft-mcgrew-gcm-test-01 known answers
// ---------------------------------------------------------------------------------------

struct Vector {
    case: u32,
    /// AES key ‖ salt.
    keymat: &'static str,
    spi: u32,
    seq: u32,
    iv: &'static str,
    /// ESP payload, padding, pad length and next header: the draft's plaintext.
    plaintext: &'static str,
    /// The whole ESP packet: SPI, sequence number, IV, ciphertext, ICV.
    packet: &'static str,
}

/// The test cases of draft-mcgrew-gcm-test-01 §4 that use 32-bit sequence numbers and
/// AES-128 or AES-256 (ring has no AES-192, so case 7 is left out; the others use ESN).
const VECTORS: &[Vector] = &[
    Vector {
        case: 2,
        keymat: "feffe9928665731c6d6a8f9467308308 cafebabe",
        spi: 0x0000_a5f8,
        seq: 0x0000_000a,
        iv: "facedbaddecaf888",
        plaintext: "4500003e698f000080114dccc0a80102 c0a801010a980035002a2343b2d00100
                    00010000000000000373697009637962 65726369747902646b00000100010001",
        packet: "0000a5f80000000afacedbaddecaf888 deb22cd9b07c72c16e3a65beeb8df304
                 a5a5897d33ae530f1ba76d5d114d2a5c 3de81827c10e9a4f51330d0eec416642
                 cfbb85a5b47e48a4ec3b9ba95d918bd1 83b70d3aa8bc6ee4c309e9d85a41ad4a",
    },
    Vector {
        case: 3,
        keymat: "abbccddef00112233445566778899aab abbccddef00112233445566778899aab 11223344",
        spi: 0x4a2c_bfe3,
        seq: 0x0000_0002,
        iv: "0102030405060708",
        plaintext: "4500003069a6400080062690c0a80102 9389155e0a9e008b2dc57ee000000000
                    7002400020bf0000020405b401010402 01020201",
        packet: "4a2cbfe3000000020102030405060708 ff425c9b724599df7a3bcd510194e00d
                 6a78107f1b0b1cbf06efae9d65a5d763 748a637985771d347f0545659f14e99d
                 ef842d8eb335f4eecfdbf831824b4c49 15956c96",
    },
    Vector {
        case: 4,
        keymat: "00000000000000000000000000000000 00000000",
        spi: 0,
        seq: 1,
        iv: "0000000000000000",
        plaintext: "4500003c99c500008001cb7a40679318 010101010800075c0200440061626364
                    65666768696a6b6c6d6e6f7071727374 75767761626364656667686901020201",
        packet: "00000000000000010000000000000000 4688daf2f973a392732909c331d56d60
                 f694abaa414b5e7ff5fdcdfff5e9a284 456476492719ffb64de7d9dca1e1d894
                 bc3bd57873ed4d181d19d4d5c8c18af3 f821d496eeb096e98ad2b69e4799c71d",
    },
    Vector {
        case: 12,
        keymat: "7d773d00c144c525ac619d18c84a3f47 d9664267",
        spi: 0x3354_67ae,
        seq: 0xffff_ffff,
        iv: "43457e9182443bc6",
        plaintext: "01020201",
        packet: "335467aeffffffff43457e9182443bc6 437f866bcb3f699fe9b0822bac961c45 04bef270",
    },
];

#[test]
fn draft_mcgrew_gcm_test_01_esp_packets() {
    for v in VECTORS {
        let keymat = unhex(v.keymat);
        let cipher = EspCipher::new(&keymat).unwrap();
        let plain = unhex(v.plaintext);
        let packet = unhex(v.packet);
        let iv: [u8; 8] = unhex(v.iv).try_into().unwrap();
        // The draft's trailer, read as RFC 4303 says.
        let (pad_len, next_header) = (plain[plain.len() - 2], plain[plain.len() - 1]);
        let payload_len = plain.len() - 2 - pad_len as usize;
        assert_eq!(
            esp_pad_len(payload_len),
            pad_len as usize,
            "case {}",
            v.case
        );

        // Seal: our framing, padding, nonce and AAD give the published packet.
        let mut buf = vec![0u8; packet.len()];
        buf[16..16 + payload_len].copy_from_slice(&plain[..payload_len]);
        let n = esp_seal(
            &cipher,
            v.spi,
            v.seq,
            iv,
            next_header,
            &mut buf,
            payload_len,
        )
        .unwrap();
        assert_eq!(n, packet.len(), "case {}", v.case);
        assert_eq!(hex(&buf), hex(&packet), "case {}: sealed packet", v.case);

        // Open: the published packet gives back the plaintext.
        let mut buf = packet.clone();
        let o = esp_open(&cipher, &mut buf, 0).unwrap();
        assert_eq!((o.spi, o.seq), (v.spi, v.seq), "case {}", v.case);
        assert_eq!(
            (o.pad_len, o.next_header, o.payload_len),
            (pad_len, next_header, payload_len)
        );
        assert_eq!(
            &buf[..payload_len],
            &plain[..payload_len],
            "case {}",
            v.case
        );

        // Any altered bit fails the ICV.
        for i in [0, 5, 9, packet.len() / 2, packet.len() - 1] {
            let mut bad = packet.clone();
            bad[i] ^= 1;
            assert_eq!(
                esp_open(&cipher, &mut bad, 0),
                Err(OpenError::Integrity),
                "case {} byte {i}",
                v.case
            );
        }
    }
}

/// Case 3 (AES-256, next header 1) through the whole NF: the ICV verifies and the replay
/// window moves, then the NF refuses the payload because tunnel mode needs next header 4.
#[test]
fn draft_case_3_through_the_nf() {
    let v = &VECTORS[1];
    let policy = IpsecPolicy {
        inbound: vec![InboundSaPolicy {
            spi: v.spi,
            key: v.keymat.split_whitespace().collect(),
            local: LOCAL.into(),
            remote: REMOTE.into(),
            selector: None,
            replay_window: None,
        }],
        ..Default::default()
    };
    let mut st = IpsecState::default();
    Ipsec::default().init(&policy, &mut st).unwrap();
    let mut frame = Vec::new();
    PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([198, 51, 100, 1], [203, 0, 113, 1], 64)
        .write(&mut frame, IpNumber(50), &unhex(v.packet))
        .unwrap();
    assert_eq!(
        handle(&mut st, &frame).0,
        Verdict::Drop(DropCause::Malformed)
    );
    let c = st.counters();
    assert_eq!((c.bad_icv, c.bad_next_header), (0, 1), "{c:?}");
    assert_eq!(st.inbound_top(v.spi), Some(2));
    assert_eq!(handle(&mut st, &frame).0, Verdict::Drop(DropCause::Replay));
}
