//! pcap round trips and bad files.

use std::fs::File;
use std::io::Write;
use std::time::Duration;

use buffet_io::gen::{GenConfig, Generator};
use buffet_io::pcap::{PcapReader, PcapWriter};
use buffet_io::{PacketSource, PcapError, SourceError};
use pcap_file::pcap::{PcapHeader, PcapPacket};
use pcap_file::{DataLink, TsResolution};

fn generated(n: u64) -> Vec<(u64, Vec<u8>)> {
    let mut g = Generator::new(GenConfig {
        max_packets: Some(n),
        ..GenConfig::default()
    })
    .unwrap();
    let mut out = Vec::new();
    while let Some(p) = g.next_packet().unwrap() {
        out.push((p.ts_ns, p.data.to_vec()));
    }
    assert_eq!(out.len() as u64, n);
    out
}

fn read_all(path: &std::path::Path) -> Result<Vec<(u64, Vec<u8>)>, PcapError> {
    let mut r = PcapReader::open(path)?;
    let mut out = Vec::new();
    while let Some(p) = r.read_packet()? {
        out.push((p.ts_ns, p.data.to_vec()));
    }
    Ok(out)
}

#[test]
fn round_trip_is_byte_identical_with_ns_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gen.pcap");
    let pkts = generated(2_000);
    let mut w = PcapWriter::create(&path).unwrap();
    for (ts, data) in &pkts {
        w.write(*ts, data).unwrap();
    }
    assert_eq!(w.packets_written(), 2_000);
    w.finish().unwrap();

    let r = PcapReader::open(&path).unwrap();
    assert!(r.is_nanosecond());
    let back = read_all(&path).unwrap();
    assert_eq!(back, pkts);
    // Sub-microsecond digits survive.
    assert!(pkts.iter().any(|(ts, _)| ts % 1_000 != 0));
}

#[test]
fn write_all_from_copies_a_source() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("copy.pcap");
    let mut g = Generator::new(GenConfig {
        seed: 9,
        max_packets: Some(500),
        ..GenConfig::default()
    })
    .unwrap();
    let mut w = PcapWriter::create(&path).unwrap();
    assert_eq!(w.write_all_from(&mut g).unwrap(), 500);
    w.finish().unwrap();
    let mut r = PcapReader::open(&path).unwrap();
    let mut n = 0;
    while let Some(p) = r.next_packet().unwrap() {
        assert!(p.data.len() >= 64);
        n += 1;
    }
    assert_eq!(n, 500);
    assert_eq!(r.packets_read(), 500);
    // Exhausted stays exhausted.
    assert!(r.next_packet().unwrap().is_none());
}

fn write_with_pcap_file(path: &std::path::Path, header: PcapHeader, pkts: &[(Duration, Vec<u8>)]) {
    let mut w =
        pcap_file::pcap::PcapWriter::with_header(File::create(path).unwrap(), header).unwrap();
    for (ts, data) in pkts {
        w.write_packet(&PcapPacket::new(*ts, data.len() as u32, data))
            .unwrap();
    }
}

#[test]
fn reads_microsecond_files_as_ns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usec.pcap");
    let frames: Vec<(Duration, Vec<u8>)> = generated(50)
        .into_iter()
        .enumerate()
        .map(|(i, (_, d))| (Duration::new(1_700_000_000 + i as u64, 123_456_000), d))
        .collect();
    let header = PcapHeader {
        ts_resolution: TsResolution::MicroSecond,
        datalink: DataLink::ETHERNET,
        ..PcapHeader::default()
    };
    write_with_pcap_file(&path, header, &frames);

    let r = PcapReader::open(&path).unwrap();
    assert!(!r.is_nanosecond());
    let back = read_all(&path).unwrap();
    assert_eq!(back.len(), frames.len());
    for ((ts, data), (d, orig)) in back.iter().zip(&frames) {
        assert_eq!(*ts, d.as_nanos() as u64);
        assert_eq!(*ts % 1_000_000_000, 123_456_000);
        assert_eq!(data, orig);
    }
}

#[test]
fn reads_big_endian_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("be.pcap");
    let frames = vec![(Duration::new(5, 7), vec![0xAB; 60])];
    let header = PcapHeader {
        ts_resolution: TsResolution::NanoSecond,
        endianness: pcap_file::Endianness::Big,
        ..PcapHeader::default()
    };
    write_with_pcap_file(&path, header, &frames);
    assert_eq!(
        read_all(&path).unwrap(),
        vec![(5_000_000_007, vec![0xAB; 60])]
    );
}

#[test]
fn non_ethernet_linktype_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw-ip.pcap");
    let header = PcapHeader {
        datalink: DataLink::RAW,
        ..PcapHeader::default()
    };
    write_with_pcap_file(&path, header, &[(Duration::ZERO, vec![0x45; 40])]);
    let err = PcapReader::open(&path).unwrap_err();
    assert!(
        matches!(err, PcapError::LinkType { linktype: 101, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("raw-ip.pcap"), "{msg}");
    assert!(msg.contains("101"), "{msg}");
}

#[test]
fn truncated_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.pcap");
    let mut w = PcapWriter::create(&full).unwrap();
    for (ts, d) in generated(10) {
        w.write(ts, &d).unwrap();
    }
    w.finish().unwrap();
    let bytes = std::fs::read(&full).unwrap();

    // Cut inside the last record's data, inside a record header, and inside
    // the global header.
    let last_len = {
        let pkts = read_all(&full).unwrap();
        pkts.last().unwrap().1.len()
    };
    for (name, cut) in [
        ("cut-data.pcap", bytes.len() - last_len / 2),
        ("cut-header.pcap", bytes.len() - last_len - 8),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let mut r = PcapReader::open(&path).unwrap();
        let mut n = 0;
        let err = loop {
            match r.next_packet() {
                Ok(Some(_)) => n += 1,
                Ok(None) => panic!("{name}: truncation not reported"),
                Err(e) => break e,
            }
        };
        assert_eq!(n, 9, "{name}");
        assert!(
            matches!(
                err,
                SourceError::Pcap(PcapError::Truncated { index: 9, .. })
            ),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains(name), "{err}");
        // After an error the reader is exhausted.
        assert!(r.next_packet().unwrap().is_none());
    }

    let path = dir.path().join("cut-global.pcap");
    std::fs::write(&path, &bytes[..10]).unwrap();
    let err = PcapReader::open(&path).unwrap_err();
    assert!(matches!(err, PcapError::BadHeader { .. }), "{err:?}");
    assert!(err.to_string().contains("cut-global.pcap"), "{err}");
}

#[test]
fn garbage_and_missing_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.pcap");
    File::create(&path)
        .unwrap()
        .write_all(&[0x55; 100])
        .unwrap();
    let err = PcapReader::open(&path).unwrap_err();
    assert!(matches!(err, PcapError::BadHeader { .. }), "{err:?}");
    assert!(err.to_string().contains("garbage.pcap"), "{err}");

    let missing = dir.path().join("missing.pcap");
    let err = PcapReader::open(&missing).unwrap_err();
    assert!(matches!(err, PcapError::Open { .. }), "{err:?}");
    assert!(err.to_string().contains("missing.pcap"), "{err}");

    let err = PcapWriter::create(dir.path().join("no-such-dir/out.pcap")).unwrap_err();
    assert!(matches!(err, PcapError::Create { .. }), "{err:?}");
    assert!(err.to_string().contains("out.pcap"), "{err}");
}

#[test]
fn bogus_record_length_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bogus.pcap");
    let mut w = PcapWriter::create(&path).unwrap();
    w.write(1, &[0u8; 64]).unwrap();
    w.finish().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    // incl_len of record 0 (offset 24 + 8) set far above the snap length.
    bytes[32..36].copy_from_slice(&0x7fff_ffffu32.to_ne_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let err = read_all(&path).unwrap_err();
    assert!(
        matches!(
            err,
            PcapError::BadRecord { index: 0, .. } | PcapError::Truncated { index: 0, .. }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("bogus.pcap"), "{err}");
}

#[test]
fn writer_refuses_oversized_frames_and_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.pcap");
    let mut w = PcapWriter::create(&path).unwrap();
    let err = w.write(0, &vec![0u8; 70_000]).unwrap_err();
    assert!(
        matches!(err, PcapError::Unwritable { index: 0, .. }),
        "{err:?}"
    );
    let err = w.write(u64::MAX, &[0u8; 64]).unwrap_err();
    assert!(err.to_string().contains("w.pcap"), "{err}");
    w.write(0, &[0u8; 64]).unwrap();
    w.finish().unwrap();
    assert_eq!(read_all(&path).unwrap().len(), 1);
}
