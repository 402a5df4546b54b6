//! Classic pcap files: [`PcapReader`] replays one as a [`PacketSource`],
//! [`PcapWriter`] writes one.
//!
//! The reader accepts microsecond and nanosecond files in either byte order and
//! converts timestamps to nanoseconds. It accepts only link type Ethernet
//! (`LINKTYPE_ETHERNET`, 1): Buffet's dispatcher parses Ethernet II frames, so
//! any other link type is reported as [`PcapError::LinkType`] when the file is
//! opened, not discovered packet by packet. pcapng is not read: a pcapng file is
//! recognised by its magic number and refused as such ([`PcapError::Pcapng`], saying how
//! to convert it).
//!
//! The writer always writes nanosecond-resolution, native-byte-order files with
//! link type Ethernet and a snap length of 65535.
//!
//! Records cut short by the capture's snap length (captured length below the
//! original length, as `tcpdump -s` or `editcap -s` write them) are valid: the frame
//! is what was captured, and the reader counts them ([`PcapCounters`]). The reader
//! parses record headers itself, so it can check a captured length (against the
//! file's snap length and [`MAX_RECORD_LEN`]) before reading the frame.
//!
//! Every error names the file it is about. A truncated or corrupt file is an
//! error ([`PcapError::Truncated`], [`PcapError::BadRecord`] naming the record
//! index), never a panic.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pcap_file::pcap::PcapHeader;
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::{PacketSource, RawPacket, SourceError};

/// Link type number of Ethernet (`LINKTYPE_ETHERNET`).
pub const LINKTYPE_ETHERNET: u32 = 1;

/// Snap length written in the header of files made by [`PcapWriter`]; longer
/// frames are refused.
pub const WRITER_SNAPLEN: u32 = 65_535;

/// Errors reading or writing a pcap file. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PcapError {
    /// The file could not be opened for reading.
    #[error("cannot open pcap file {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The file could not be created for writing.
    #[error("cannot create pcap file {}: {source}", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The file does not start with a valid pcap global header.
    #[error("{} is not a pcap file: {reason}", path.display())]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong with the header.
        reason: String,
    },
    /// The file is pcapng (its first block is a Section Header Block), which the reader
    /// does not read.
    #[error(
        "{} is a pcapng file, which buffet does not read; convert it with \
         `editcap -F pcap {} out.pcap`",
        path.display(),
        path.display()
    )]
    Pcapng {
        /// The file.
        path: PathBuf,
    },
    /// The file's link type is not Ethernet.
    #[error(
        "{}: link type {linktype} is not supported (only Ethernet, link type 1)",
        path.display()
    )]
    LinkType {
        /// The file.
        path: PathBuf,
        /// The link type number found in the header.
        linktype: u32,
    },
    /// The file ends in the middle of a record.
    #[error("{}: file is truncated in record {index} (counting from 0)", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Index of the record that is cut short.
        index: u64,
    },
    /// A record header is invalid (e.g. captured length above the snap length).
    #[error("{}: invalid record {index} (counting from 0): {reason}", path.display())]
    BadRecord {
        /// The file.
        path: PathBuf,
        /// Index of the bad record.
        index: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading failed.
    #[error("{}: read error in record {index}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Index of the record being read.
        index: u64,
        /// What the OS said.
        source: io::Error,
    },
    /// Writing failed.
    #[error("{}: write error: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// A packet given to [`PcapWriter::write`] cannot be stored in the file.
    #[error("{}: cannot write packet {index}: {reason}", path.display())]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// Index of the packet (counting from 0).
        index: u64,
        /// Why (frame too long, timestamp out of range).
        reason: String,
    },
}

/// A capture format, told by a file's magic number ([`capture_kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureKind {
    /// Classic pcap (microsecond or nanosecond, either byte order): what
    /// [`PcapReader`] reads.
    Pcap,
    /// pcapng (a Section Header Block, type `0x0A0D0D0A`).
    Pcapng,
}

/// The capture format `head`, a file's first bytes, starts with, or `None` when its first
/// four bytes are no capture's magic number.
pub fn capture_kind(head: &[u8]) -> Option<CaptureKind> {
    let magic: [u8; 4] = head.get(..4)?.try_into().ok()?;
    match u32::from_be_bytes(magic) {
        0x0A0D_0D0A => Some(CaptureKind::Pcapng),
        0xA1B2_C3D4 | 0xD4C3_B2A1 | 0xA1B2_3C4D | 0x4D3C_B2A1 => Some(CaptureKind::Pcap),
        _ => None,
    }
}

/// The largest captured length of a record the reader accepts, whatever the file's
/// snap length says (libpcap's limit for Ethernet).
pub const MAX_RECORD_LEN: u32 = 262_144;

/// Counts of a [`PcapReader`] that stay readable after the reader is moved into a port:
/// a cheap handle ([`PcapReader::counters`]) shared with the reader.
#[derive(Clone, Debug, Default)]
pub struct PcapCounters {
    truncated: Arc<AtomicU64>,
}

impl PcapCounters {
    /// Records whose captured length is below their original length: the capture cut
    /// them at its snap length (`editcap -s`, `tcpdump -s`). They are replayed as
    /// captured.
    pub fn truncated(&self) -> u64 {
        self.truncated.load(Ordering::Relaxed)
    }
}

/// Replays a classic pcap file as a [`PacketSource`].
///
/// Reading is buffered; packets are handed out as slices of the reader's
/// buffer (no allocation per packet). A record cut short by the capture's snap
/// length (captured length below the original length) is handed out as captured and
/// counted ([`PcapCounters::truncated`]). A record whose captured length exceeds the
/// file's snap length or [`MAX_RECORD_LEN`], or its original length, is an error
/// naming the record.
pub struct PcapReader {
    path: PathBuf,
    inner: BufReader<File>,
    header: PcapHeader,
    /// The frame of the last record read.
    buf: Vec<u8>,
    /// Index of the next record.
    index: u64,
    counters: PcapCounters,
    /// Set after the end of the file or an error.
    done: bool,
}

impl std::fmt::Debug for PcapReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapReader")
            .field("path", &self.path)
            .field("ts_resolution", &self.header.ts_resolution)
            .field("snaplen", &self.header.snaplen)
            .field("index", &self.index)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl PcapReader {
    /// Opens `path` and checks its global header: magic number (µs or ns, either
    /// byte order) and link type (must be Ethernet).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, PcapError> {
        let path = path.as_ref().to_path_buf();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(source) => return Err(PcapError::Open { path, source }),
        };
        let mut inner = BufReader::with_capacity(1 << 20, file);
        let mut raw = [0u8; 24];
        if let Err(e) = inner.read_exact(&mut raw) {
            return Err(match e.kind() {
                ErrorKind::UnexpectedEof => PcapError::BadHeader {
                    path,
                    reason: "shorter than the 24-byte pcap global header".to_string(),
                },
                _ => PcapError::Read {
                    path,
                    index: 0,
                    source: e,
                },
            });
        }
        let header = match PcapHeader::from_slice(&raw) {
            Ok((_, h)) => h,
            Err(pcap_file::PcapError::InvalidField(_)) => {
                return Err(match capture_kind(&raw) {
                    Some(CaptureKind::Pcapng) => PcapError::Pcapng { path },
                    _ => PcapError::BadHeader {
                        path,
                        reason: "unknown magic number".to_string(),
                    },
                })
            }
            Err(other) => {
                return Err(PcapError::BadHeader {
                    path,
                    reason: other.to_string(),
                })
            }
        };
        let linktype = u32::from(header.datalink);
        if linktype != LINKTYPE_ETHERNET {
            return Err(PcapError::LinkType { path, linktype });
        }
        Ok(Self {
            path,
            inner,
            header,
            buf: Vec::with_capacity(2048),
            index: 0,
            counters: PcapCounters::default(),
            done: false,
        })
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file has nanosecond (rather than microsecond) timestamps.
    pub fn is_nanosecond(&self) -> bool {
        self.header.ts_resolution == TsResolution::NanoSecond
    }

    /// The snap length in the file's global header.
    pub fn snaplen(&self) -> u32 {
        self.header.snaplen
    }

    /// Number of packets returned so far.
    pub fn packets_read(&self) -> u64 {
        self.index
    }

    /// A handle on the reader's counts, readable after the reader has moved.
    pub fn counters(&self) -> PcapCounters {
        self.counters.clone()
    }

    /// Whether no record follows (for a file just opened: it holds only its global
    /// header). Reads ahead without consuming anything.
    pub fn is_at_end(&mut self) -> Result<bool, PcapError> {
        if self.done {
            return Ok(true);
        }
        match self.inner.fill_buf() {
            Ok(b) => Ok(b.is_empty()),
            Err(source) => Err(PcapError::Read {
                path: self.path.clone(),
                index: self.index,
                source,
            }),
        }
    }

    fn u32_at(&self, b: &[u8; 16], at: usize) -> u32 {
        let v = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        match self.header.endianness {
            Endianness::Big => u32::from_be_bytes(v),
            Endianness::Little => u32::from_le_bytes(v),
        }
    }

    fn bad_record(&mut self, reason: String) -> PcapError {
        self.done = true;
        PcapError::BadRecord {
            path: self.path.clone(),
            index: self.index,
            reason,
        }
    }

    fn read_error(&mut self, e: io::Error) -> PcapError {
        self.done = true;
        let (path, index) = (self.path.clone(), self.index);
        if e.kind() == ErrorKind::UnexpectedEof {
            PcapError::Truncated { path, index }
        } else {
            PcapError::Read {
                path,
                index,
                source: e,
            }
        }
    }

    /// Reads the next packet. Same as [`PacketSource::next_packet`] with the
    /// error type narrowed to [`PcapError`].
    pub fn read_packet(&mut self) -> Result<Option<RawPacket<'_>>, PcapError> {
        if self.is_at_end()? {
            self.done = true;
            return Ok(None);
        }
        let mut rec = [0u8; 16];
        if let Err(e) = self.inner.read_exact(&mut rec) {
            return Err(self.read_error(e));
        }
        let (secs, frac) = (self.u32_at(&rec, 0), self.u32_at(&rec, 4));
        let (incl_len, orig_len) = (self.u32_at(&rec, 8), self.u32_at(&rec, 12));
        let snaplen = self.header.snaplen;
        if incl_len > MAX_RECORD_LEN {
            return Err(self.bad_record(format!(
                "captured length {incl_len} exceeds the maximum of {MAX_RECORD_LEN} bytes"
            )));
        }
        // A snap length of 0 is written by some tools for "unlimited".
        if snaplen != 0 && incl_len > snaplen {
            return Err(self.bad_record(format!(
                "captured length {incl_len} exceeds the file's snap length {snaplen}"
            )));
        }
        if incl_len > orig_len {
            return Err(self.bad_record(format!(
                "captured length {incl_len} exceeds the original length {orig_len}"
            )));
        }
        let nanos = match self.header.ts_resolution {
            TsResolution::MicroSecond => u64::from(frac) * 1_000,
            TsResolution::NanoSecond => u64::from(frac),
        };
        if nanos >= 1_000_000_000 {
            return Err(self.bad_record(format!("timestamp fraction {frac} is a second or more")));
        }
        self.buf.resize(incl_len as usize, 0);
        if let Err(e) = self.inner.read_exact(&mut self.buf) {
            return Err(self.read_error(e));
        }
        if incl_len < orig_len {
            self.counters.truncated.fetch_add(1, Ordering::Relaxed);
        }
        self.index += 1;
        let ts_ns = u64::from(secs) * 1_000_000_000 + nanos;
        Ok(Some(RawPacket {
            ts_ns,
            data: &self.buf,
        }))
    }
}

impl PacketSource for PcapReader {
    fn next_packet(&mut self) -> Result<Option<RawPacket<'_>>, SourceError> {
        self.read_packet().map_err(SourceError::from)
    }
}

/// Writes a classic pcap file: nanosecond timestamps, link type Ethernet,
/// native byte order, snap length [`WRITER_SNAPLEN`]. Buffered: call
/// [`finish`](Self::finish) (or [`flush`](Self::flush)) to see write errors;
/// dropping the writer flushes but swallows errors.
///
/// The format is simple enough that records are written directly (a 16-byte
/// record header, then the frame); the global header comes from pcap-file.
pub struct PcapWriter {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
}

impl std::fmt::Debug for PcapWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapWriter")
            .field("path", &self.path)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl PcapWriter {
    /// Creates (or truncates) `path` and writes the global header.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, PcapError> {
        let path = path.as_ref().to_path_buf();
        let file = match File::create(&path) {
            Ok(f) => f,
            Err(source) => return Err(PcapError::Create { path, source }),
        };
        Self::new(file, path)
    }

    /// Writes the global header to `file`, already open for writing (e.g. a temporary
    /// file renamed into place later); errors name `path`.
    pub fn new(file: File, path: impl AsRef<Path>) -> Result<Self, PcapError> {
        let path = path.as_ref().to_path_buf();
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: WRITER_SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::native(),
        };
        let mut out = BufWriter::with_capacity(1 << 20, file);
        if let Err(e) = header.write_to(&mut out) {
            let source = match e {
                pcap_file::PcapError::IoError(io) => io,
                other => io::Error::other(other.to_string()),
            };
            return Err(PcapError::Write { path, source });
        }
        Ok(Self {
            path,
            out,
            written: 0,
        })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of packets written so far.
    pub fn packets_written(&self) -> u64 {
        self.written
    }

    /// Appends one frame with timestamp `ts_ns` (nanoseconds). Fails for frames
    /// longer than [`WRITER_SNAPLEN`] and timestamps past the year 2106 (the
    /// format's 32-bit seconds field); nothing is written then.
    pub fn write(&mut self, ts_ns: u64, data: &[u8]) -> Result<(), PcapError> {
        let index = self.written;
        if data.len() > WRITER_SNAPLEN as usize {
            return Err(PcapError::Unwritable {
                path: self.path.clone(),
                index,
                reason: format!(
                    "frame of {} bytes exceeds the snap length {WRITER_SNAPLEN}",
                    data.len()
                ),
            });
        }
        let Ok(secs) = u32::try_from(ts_ns / 1_000_000_000) else {
            return Err(PcapError::Unwritable {
                path: self.path.clone(),
                index,
                reason: format!("timestamp {ts_ns} ns does not fit the 32-bit seconds field"),
            });
        };
        let nanos = (ts_ns % 1_000_000_000) as u32;
        let len = data.len() as u32;
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&secs.to_ne_bytes());
        rec[4..8].copy_from_slice(&nanos.to_ne_bytes());
        rec[8..12].copy_from_slice(&len.to_ne_bytes());
        rec[12..16].copy_from_slice(&len.to_ne_bytes());
        let res = self
            .out
            .write_all(&rec)
            .and_then(|()| self.out.write_all(data));
        match res {
            Ok(()) => {
                self.written += 1;
                Ok(())
            }
            Err(source) => Err(PcapError::Write {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Copies every packet of `source` into the file; returns how many were
    /// written. Stops at the first error of either side.
    pub fn write_all_from<S: PacketSource + ?Sized>(
        &mut self,
        source: &mut S,
    ) -> Result<u64, SourceError> {
        let mut n = 0;
        while let Some(pkt) = source.next_packet()? {
            self.write(pkt.ts_ns, pkt.data)?;
            n += 1;
        }
        Ok(n)
    }

    /// Flushes buffered packets to the OS.
    pub fn flush(&mut self) -> Result<(), PcapError> {
        self.out.flush().map_err(|source| PcapError::Write {
            path: self.path.clone(),
            source,
        })
    }

    /// Flushes and closes the file, reporting any error. (It does not fsync.)
    pub fn finish(mut self) -> Result<(), PcapError> {
        self.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little-endian microsecond pcap with snap length `snaplen` and records
    /// `(incl bytes, orig_len)`.
    fn pcap(snaplen: u32, records: &[(&[u8], u32)]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        v.extend_from_slice(&2u16.to_le_bytes());
        v.extend_from_slice(&4u16.to_le_bytes());
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(&snaplen.to_le_bytes());
        v.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        for (i, (data, orig)) in records.iter().enumerate() {
            v.extend_from_slice(&(i as u32).to_le_bytes());
            v.extend_from_slice(&7u32.to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&orig.to_le_bytes());
            v.extend_from_slice(data);
        }
        v
    }

    /// Every record `(ts_ns, frame)`, or the error that stopped the reader.
    type Records = Result<Vec<(u64, Vec<u8>)>, PcapError>;

    /// Reads `bytes` as a file; the records and the truncated count.
    fn read(bytes: &[u8]) -> (Records, u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.pcap");
        std::fs::write(&path, bytes).unwrap();
        let mut r = PcapReader::open(&path).unwrap();
        let counters = r.counters();
        let mut out = Vec::new();
        let res = loop {
            match r.read_packet() {
                Ok(Some(p)) => out.push((p.ts_ns, p.data.to_vec())),
                Ok(None) => break Ok(out),
                Err(e) => break Err(e),
            }
        };
        (res, counters.truncated())
    }

    #[test]
    fn a_pcapng_file_is_named_as_such_and_anything_else_is_not_a_pcap() {
        let dir = tempfile::tempdir().unwrap();
        // A pcapng Section Header Block (little-endian, 28 bytes), then nothing.
        let mut shb = Vec::new();
        shb.extend_from_slice(&0x0A0D_0D0Au32.to_le_bytes());
        shb.extend_from_slice(&28u32.to_le_bytes());
        shb.extend_from_slice(&0x1A2B_3C4Du32.to_le_bytes());
        shb.extend_from_slice(&1u16.to_le_bytes());
        shb.extend_from_slice(&0u16.to_le_bytes());
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        shb.extend_from_slice(&28u32.to_le_bytes());
        let ng = dir.path().join("in.pcapng");
        std::fs::write(&ng, &shb).unwrap();
        let e = PcapReader::open(&ng).unwrap_err();
        assert!(matches!(e, PcapError::Pcapng { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("in.pcapng is a pcapng file"), "{text}");
        assert!(text.contains("editcap -F pcap"), "{text}");
        let toml = dir.path().join("t.toml");
        std::fs::write(&toml, "[[tenant]]\nid = 1\nrules = [ { vlan = 1 } ]\n").unwrap();
        let text = PcapReader::open(&toml).unwrap_err().to_string();
        assert!(
            text.ends_with("t.toml is not a pcap file: unknown magic number"),
            "{text}"
        );
        assert!(!text.contains("pcapng"), "{text}");
        assert_eq!(capture_kind(&shb), Some(CaptureKind::Pcapng));
        assert_eq!(
            capture_kind(&pcap(64, &[])),
            Some(CaptureKind::Pcap),
            "microsecond, little-endian"
        );
        assert_eq!(capture_kind(b"0,1\n"), None);
        assert_eq!(capture_kind(b"ab"), None);
    }

    #[test]
    fn snaplen_truncated_records_are_read_as_captured_and_counted() {
        let frame = [0xabu8; 100];
        let bytes = pcap(
            40,
            &[
                (&frame[..40], 100),
                (&frame[..30], 30),
                (&frame[..40], 1514),
            ],
        );
        let (res, truncated) = read(&bytes);
        let pkts = res.unwrap();
        assert_eq!(pkts.len(), 3);
        assert_eq!(pkts[0], (7_000, frame[..40].to_vec()));
        assert_eq!(pkts[1].1.len(), 30);
        assert_eq!(pkts[2].0, 2_000_007_000);
        assert_eq!(truncated, 2);
    }

    #[test]
    fn impossible_captured_lengths_name_the_record() {
        let frame = [0u8; 64];
        let (res, _) = read(&pcap(40, &[(&frame[..40], 64), (&frame[..41], 64)]));
        let e = res.unwrap_err();
        assert!(matches!(e, PcapError::BadRecord { index: 1, .. }), "{e:?}");
        assert!(e.to_string().contains("snap length 40"), "{e}");
        let (res, _) = read(&pcap(65535, &[(&frame, 60)]));
        let e = res.unwrap_err();
        assert!(matches!(e, PcapError::BadRecord { index: 0, .. }), "{e:?}");
        assert!(e.to_string().contains("original length 60"), "{e}");
        // A captured length above any sane maximum is refused before it is read.
        let mut bytes = pcap(0, &[(&frame, 64)]);
        bytes[24 + 8..24 + 12].copy_from_slice(&(MAX_RECORD_LEN + 1).to_le_bytes());
        bytes[24 + 12..24 + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = read(&bytes).0.unwrap_err();
        assert!(matches!(e, PcapError::BadRecord { index: 0, .. }), "{e:?}");
        assert!(e.to_string().contains("maximum of 262144"), "{e}");
    }

    #[test]
    fn a_header_only_file_is_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.pcap");
        std::fs::write(&path, pcap(65535, &[])).unwrap();
        let mut r = PcapReader::open(&path).unwrap();
        assert!(r.is_at_end().unwrap());
        assert!(r.read_packet().unwrap().is_none());
        std::fs::write(&path, pcap(65535, &[(&[0u8; 60], 60)])).unwrap();
        let mut r = PcapReader::open(&path).unwrap();
        assert!(!r.is_at_end().unwrap());
        assert_eq!(r.read_packet().unwrap().unwrap().data.len(), 60);
    }
}
