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
//! * **draft-mcgrew-gcm-test-01**: the ESP packets of its AES-GCM test cases, with 32-bit
//!   and extended sequence numbers, rebuilt byte for byte by [`esp_seal`] and opened by
//!   [`esp_open`] (cases 3, 9, 11 and 14 are AES-256; the AES-128 ones check the framing,
//!   padding, AAD and nonce construction; AES-192 case 7 is left out, `ring` has no
//!   AES-192). These need no tool and always run.
//!
//! A missing tool is a privilege skip (`buffet_testkit::require_tool`): one `SKIP` line,
//! or a failure under `CI=true` or `BUFFET_REQUIRE_PRIVILEGED=1`. Debian packages: `tshark`,
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
use buffet_testkit::require_tool;
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

/// How to get the interop peers.
const TOOLS_HINT: &str = "install the Debian packages tshark, python3-scapy, python3-cryptography \
                          to run this interop test";

/// Privilege gate of a test that needs tshark.
fn have_tshark(test: &str) -> bool {
    require_tool(
        test,
        "tshark",
        Command::new("tshark").arg("--version"),
        TOOLS_HINT,
    )
}

/// Privilege gate of a test that needs scapy with AES-GCM.
fn have_scapy(test: &str) -> bool {
    require_tool(
        test,
        "scapy with AES-GCM (/usr/bin/python3 with python3-scapy and python3-cryptography)",
        Command::new(SCAPY).args([
            "-c",
            "import scapy.layers.ipsec, cryptography.hazmat.primitives.ciphers.aead",
        ]),
        TOOLS_HINT,
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
/// sends back through SPI_IN. `esn`: both SAs use extended sequence numbers.
fn gateway(esn: bool) -> IpsecState {
    let policy = IpsecPolicy {
        outbound: vec![OutboundSaPolicy {
            spi: SPI_OUT,
            key: KEY_OUT.into(),
            local: LOCAL.into(),
            remote: REMOTE.into(),
            selector: "10.2.0.0/16".into(),
            ttl: None,
            esn,
        }],
        inbound: vec![InboundSaPolicy {
            spi: SPI_IN,
            key: KEY_IN.into(),
            local: LOCAL.into(),
            remote: REMOTE.into(),
            selector: Some("10.2.0.0/16".into()),
            replay_window: None,
            esn,
        }],
        ..Default::default()
    };
    let mut state = IpsecState::default();
    Ipsec::default().init(&policy, &mut state).unwrap();
    state
}

/// Runs one frame through the NF in a 2048-byte buffer (a heap PacketBuf's size).
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
fn buffet_esp(esn: bool) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut gw = gateway(esn);
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
    if !have_tshark("wireshark_decrypts_and_verifies_buffet_esp") {
        return;
    }
    let (inner, esp) = buffet_esp(false);
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
    if !have_scapy("scapy_decrypts_buffet_esp") {
        return;
    }
    let (inner, esp) = buffet_esp(false);
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
    if !have_scapy("buffet_decrypts_scapy_esp") {
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

    let mut gw = gateway(false);
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

/// Extended sequence numbers: scapy checks the NF's 12-byte AAD (SPI ‖ high ‖ low), and
/// the NF follows scapy's counter across the 2^32 wrap, inferring the high half.
#[test]
fn extended_sequence_numbers_with_scapy() {
    if !have_scapy("extended_sequence_numbers_with_scapy") {
        return;
    }
    let (inner, esp) = buffet_esp(true);
    let pcap = tmp("buffet-esn-scapy.pcap");
    write_pcap(&pcap, &esp);
    let decrypt = |esn_hi: Option<&str>| {
        let mut cmd = Command::new(SCAPY);
        cmd.arg(scapy_script())
            .arg("decrypt")
            .arg(&pcap)
            .arg(SPI_OUT.to_string())
            .arg(KEY_OUT)
            .args(esn_hi);
        run_ok(&mut cmd)
    };
    let with_esn = decrypt(Some("0"));
    let lines: Vec<&str> = with_esn.lines().collect();
    for (i, f) in inner.iter().enumerate() {
        assert_eq!(lines[i], hex(&f[14..]), "packet {i}");
    }
    assert_eq!(lines[10], "ERR IPSecIntegrityError");
    let without = decrypt(None);
    assert!(
        without.lines().all(|l| l == "ERR IPSecIntegrityError"),
        "an ESN ICV must not verify with a 32-bit AAD:\n{without}"
    );
    let _ = std::fs::remove_file(&pcap);

    const COUNT: usize = 24;
    let start = (1u64 << 32) - 12;
    let pcap = tmp("scapy-esn.pcap");
    let out = run_ok(
        Command::new(SCAPY)
            .arg(scapy_script())
            .arg("encrypt")
            .arg(&pcap)
            .arg(SPI_IN.to_string())
            .arg(KEY_IN)
            .args([REMOTE, LOCAL])
            .arg(COUNT.to_string())
            .arg(start.to_string()),
    );
    let expected: Vec<Vec<u8>> = out.lines().map(unhex).collect();
    let frames = read_pcap(&pcap);
    let _ = std::fs::remove_file(&pcap);
    let mut gw = gateway(true);
    // Every fifth packet first, then the others: those after the wrap move the window into
    // the next 2^32 subspace, and the older ones are then placed before it (RFC 4303
    // Appendix A2.2, case B).
    let early: Vec<usize> = (0..COUNT).step_by(5).collect();
    for i in early
        .iter()
        .copied()
        .chain((0..COUNT).filter(|i| i % 5 != 0))
    {
        let (v, out) = handle(&mut gw, &frames[i]);
        assert_eq!(v, Verdict::Pass, "scapy ESN packet {i}");
        assert_eq!(&out[14..], &expected[i][..], "scapy ESN packet {i}");
    }
    assert_eq!(gw.inbound_top(SPI_IN), Some(start + COUNT as u64 - 1));
    assert_eq!(
        handle(&mut gw, &frames[13]).0,
        Verdict::Drop(DropCause::Replay)
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
    /// The sequence number; all 64 bits of it with `esn`.
    seq: u64,
    esn: bool,
    iv: &'static str,
    /// ESP payload, padding, pad length and next header: the draft's plaintext.
    plaintext: &'static str,
    /// The whole ESP packet: SPI, sequence number (low 32 bits), IV, ciphertext, ICV.
    packet: &'static str,
}

/// The AES-GCM test cases of draft-mcgrew-gcm-test-01 §4 with a key size `ring` has
/// (case 7 is AES-192), with 32-bit sequence numbers and with ESN (cases 1, 5, 6, 8–11,
/// 13, 14). Cases 3, 9, 11 and 14 are AES-256.
const VECTORS: &[Vector] = &[
    Vector {
        case: 1,
        keymat: "4c80cdefbb5d10da906ac73c3613a634 2e443b68",
        spi: 0x0000_4321,
        seq: 0x8765_4321_0000_0000,
        esn: true,
        iv: "4956ed7e3b244cfe",
        plaintext: "45000048699a000080114db7c0a80102 c0a801010a9bf15638d3010000010000
                    00000000045f736970045f7564700373 69700963796265726369747902646b00
                    0021000101020201",
        packet: "00004321000000004956ed7e3b244cfe fecf537e729d5b07dc30df528dd22b76
                 8d1b98736696a6fd348509fa13ceac34 cfa2436f14a3f3cf65925bf1f4a13c5d
                 15b21e1884f5ff6247aeabb786b93bce 61bc17d768fd9732459018148f6cbe72
                 2fd04796562dfdb4",
    },
    Vector {
        case: 2,
        keymat: "feffe9928665731c6d6a8f9467308308 cafebabe",
        spi: 0x0000_a5f8,
        seq: 0x0000_000a,
        esn: false,
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
        esn: false,
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
        esn: false,
        iv: "0000000000000000",
        plaintext: "4500003c99c500008001cb7a40679318 010101010800075c0200440061626364
                    65666768696a6b6c6d6e6f7071727374 75767761626364656667686901020201",
        packet: "00000000000000010000000000000000 4688daf2f973a392732909c331d56d60
                 f694abaa414b5e7ff5fdcdfff5e9a284 456476492719ffb64de7d9dca1e1d894
                 bc3bd57873ed4d181d19d4d5c8c18af3 f821d496eeb096e98ad2b69e4799c71d",
    },
    Vector {
        case: 5,
        keymat: "3de09874b388e6491988d0c3607eae1f 57690e43",
        spi: 0x42f6_7e3f,
        seq: 0x1010_1010_1010_1010,
        esn: true,
        iv: "4e280000a2fca1a3",
        plaintext: "4500003c99c300008001cb7c40679318 010101010800085c0200430061626364
                    65666768696a6b6c6d6e6f7071727374 75767761626364656667686901020201",
        packet: "42f67e3f101010104e280000a2fca1a3 fba2caa4853cf9f0f22cb10d86dd83b0
                 fec75691cf1a04b00d1138ec9c357917 65acbd8701ad79845bf9fe3fba487bc9
                 1755e6662b4c8d0d1f5e22739530320a e0d731cc978ecafaeae88f00e80d6e48",
    },
    Vector {
        case: 6,
        keymat: "3de09874b388e6491988d0c3607eae1f 57690e43",
        spi: 0x42f6_7e3f,
        seq: 0x1010_1010_1010_1010,
        esn: true,
        iv: "4e280000a2fca1a3",
        plaintext: "4500001c42a200008001441f406793b6 e00000020a00f5ff01020201",
        packet: "42f67e3f101010104e280000a2fca1a3 fba2ca845e5df9f0f22c3e6e86dd831e
                 1fc65792cd1af9130e1379ed369f071f 35e034be95f112e4e7d05d35",
    },
    Vector {
        case: 8,
        keymat: "abbccddef00112233445566778899aab decaf888",
        spi: 0x0000_0100,
        seq: 1,
        esn: true,
        iv: "cafedebaceface74",
        plaintext: "4500004933ba00007f119106c3fb1d10 c2b1d326c02831ce0035dd7b800302d5
                    00004e20001e8c18d75b81dc91baa047 6b91b924b280389d92c963bac046ec95
                    9b6266c04722b14923010101",
        packet: "0000010000000001cafedebaceface74 18a6fd42f72cbf4ab2a2ea901f73d814
                 e3e7f243d95412e1c349c1d2fbec168f 9190feebaf2cb01984e65863965d7472
                 b79da345e0e780191f0d2f0e0f496c22 6f2127b27db35724e7845d68651f57e6
                 5f354f75ff17015769623436",
    },
    Vector {
        case: 9,
        keymat: "abbccddef00112233445566778899aab abbccddef00112233445566778899aab 73616c74",
        spi: 0x1740_5e67,
        seq: 0x156f_3126_dd0d_b99b,
        esn: true,
        iv: "616e640169766563",
        plaintext: "45080028732c00004006e9f90a010612 0a01038f06b88023dd6bafbecb712602
                    50101f646d540001",
        packet: "17405e67dd0db99b616e640169766563 f2d69ecdbd5a0d5b8d5ef38bad4da58d
                 1f278fde98ef67549d524a3018d9a57f f4d3a31ce673119e451626c2415771e3
                 b7eebca614c89b35",
    },
    Vector {
        case: 10,
        keymat: "3de09874b388e6491988d0c3607eae1f 57690e43",
        spi: 0x42f6_7e3f,
        seq: 0x1010_1010_1010_1010,
        esn: true,
        iv: "4e280000a2fca1a3",
        plaintext: "45000049333e00007f119182c3fb1d10 c2b1d326c02831ce0035cb458003025b
                    000001e0001e8c18d65759d52284a035 2c71475c8880391c764d6e5ee0496b32
                    5ae270c03899493915010101",
        packet: "42f67e3f101010104e280000a2fca1a3 fba2cad12fc1f9f00d3cebf305410db8
                 3d7784b607323d220f24b0a97d541828 00cadb0f68d99ef0e0c0c89ae9bea888
                 4e52d65bc1afd0740f742444747b5b39 ab533163aad4550ee5160975cdb608c5
                 769189609763b8e18caa81e2",
    },
    Vector {
        case: 11,
        keymat: "abbccddef00112233445566778899aab abbccddef00112233445566778899aab 73616c74",
        spi: 0x1740_5e67,
        seq: 0x156f_3126_dd0d_b99b,
        esn: true,
        iv: "616e640169766563",
        plaintext: "636973636f0172756c65730174686501 6e6574776501646566696e6501746865
                    746563686e6f6c6f6769657301746861 7477696c6c01646566696e65746f6d6f
                    72726f7701020201",
        packet: "17405e67dd0db99b616e640169766563 d4b7ed86a1777f2ea13d6973d324c69e
                 7b43f826fb56831226508bebd2dceb18 d0a6df10e5487df074113e14c641024e
                 3e6773d91a62ee429b043a10e3efe6b0 12a49363412364f8c0cac587f249e56b
                 11e24f30e44ccc76",
    },
    Vector {
        case: 12,
        keymat: "7d773d00c144c525ac619d18c84a3f47 d9664267",
        spi: 0x3354_67ae,
        seq: 0xffff_ffff,
        esn: false,
        iv: "43457e9182443bc6",
        plaintext: "01020201",
        packet: "335467aeffffffff43457e9182443bc6 437f866bcb3f699fe9b0822bac961c45 04bef270",
    },
    Vector {
        case: 13,
        keymat: "abbccddef00112233445566778899aab decaf888",
        spi: 0x0000_0100,
        seq: 1,
        esn: true,
        iv: "cafedebaceface74",
        plaintext: "746f016265016f72016e6f7401746f01 62650001",
        packet: "0000010000000001cafedebaceface74 29c9fc69a197d038ccdd14e2ddfcaa05
                 43332164412503524303ed3c6c5f2838 43af8c3e",
    },
    Vector {
        case: 14,
        keymat: "6c6567616c697a656d6172696a75616e 61616e64646f69746265666f72656961 7475726e",
        spi: 0x796b_6963,
        seq: 0xffff_ffff_ffff_ffff,
        esn: true,
        iv: "333021696765746d",
        plaintext: "45000030da3a00008001df3bc0a80005 c0a800010800c6cd0200070061626364
                    65666768696a6b6c6d6e6f7071727374 01020201",
        packet: "796b6963ffffffff333021696765746d f97ab2aa356d8edce17644ac8c78e25d
                 d24dedbb29ebf1b64a274b39b49c3a86 4cd3d78ca4ae68a32b42458fb57dbe82
                 1dcc63b9d0937ba2945f669368661a32 9fb4c053",
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
        let (seq, seq_hi) = (v.seq as u32, v.esn.then_some((v.seq >> 32) as u32));
        let n = esp_seal(
            &cipher,
            v.spi,
            seq,
            seq_hi,
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
        let o = esp_open(&cipher, &mut buf, 0, seq_hi).unwrap();
        assert_eq!((o.spi, o.seq), (v.spi, seq), "case {}", v.case);
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

        // The high half of an ESN is authenticated though never sent; without ESN it is
        // not part of the AAD at all.
        let wrong_hi = match seq_hi {
            Some(hi) => [Some(hi ^ 1), None],
            None => [Some(0), Some(1)],
        };
        for hi in wrong_hi {
            let mut p = packet.clone();
            assert_eq!(esp_open(&cipher, &mut p, 0, hi), Err(OpenError::Integrity));
        }
        // Any altered bit fails the ICV.
        for i in [0, 5, 9, packet.len() / 2, packet.len() - 1] {
            let mut bad = packet.clone();
            bad[i] ^= 1;
            assert_eq!(
                esp_open(&cipher, &mut bad, 0, seq_hi),
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
    let v = VECTORS.iter().find(|v| v.case == 3).unwrap();
    let policy = IpsecPolicy {
        inbound: vec![InboundSaPolicy {
            spi: v.spi,
            key: v.keymat.split_whitespace().collect(),
            local: LOCAL.into(),
            remote: REMOTE.into(),
            selector: None,
            replay_window: None,
            esn: false,
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
