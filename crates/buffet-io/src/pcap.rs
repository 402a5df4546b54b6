//! Classic pcap files: [`PcapReader`] replays one as a [`PacketSource`],
//! [`PcapWriter`] writes one.
//!
//! The reader accepts microsecond and nanosecond files in either byte order and
//! converts timestamps to nanoseconds. It accepts only link type Ethernet
//! (`LINKTYPE_ETHERNET`, 1): Buffet's dispatcher parses Ethernet II frames, so
//! any other link type is reported as [`PcapError::LinkType`] when the file is
//! opened, not discovered packet by packet. pcapng is not supported.
//!
//! The writer always writes nanosecond-resolution, native-byte-order files with
//! link type Ethernet and a snap length of 65535.
//!
//! Every error names the file it is about. A truncated or corrupt file is an
//! error ([`PcapError::Truncated`], [`PcapError::BadRecord`]), never a panic.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};

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

/// Replays a classic pcap file as a [`PacketSource`].
///
/// Reading is buffered; packets are handed out as slices of the reader's
/// buffer (no allocation per packet).
pub struct PcapReader {
    path: PathBuf,
    inner: pcap_file::pcap::PcapReader<File>,
    ts_resolution: TsResolution,
    /// Index of the next record.
    index: u64,
    /// Set after the end of the file or an error.
    done: bool,
}

impl std::fmt::Debug for PcapReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapReader")
            .field("path", &self.path)
            .field("ts_resolution", &self.ts_resolution)
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
        let inner = match pcap_file::pcap::PcapReader::new(file) {
            Ok(r) => r,
            Err(e) => {
                let reason = match e {
                    pcap_file::PcapError::IoError(ref io)
                        if io.kind() == ErrorKind::UnexpectedEof =>
                    {
                        "shorter than the 24-byte pcap global header".to_string()
                    }
                    pcap_file::PcapError::InvalidField(_) => {
                        "unknown magic number (pcapng is not supported)".to_string()
                    }
                    other => other.to_string(),
                };
                return Err(PcapError::BadHeader { path, reason });
            }
        };
        let header = inner.header();
        let linktype = u32::from(header.datalink);
        if linktype != LINKTYPE_ETHERNET {
            return Err(PcapError::LinkType { path, linktype });
        }
        Ok(Self {
            path,
            ts_resolution: header.ts_resolution,
            inner,
            index: 0,
            done: false,
        })
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file has nanosecond (rather than microsecond) timestamps.
    pub fn is_nanosecond(&self) -> bool {
        self.ts_resolution == TsResolution::NanoSecond
    }

    /// Number of packets returned so far.
    pub fn packets_read(&self) -> u64 {
        self.index
    }

    /// Reads the next packet. Same as [`PacketSource::next_packet`] with the
    /// error type narrowed to [`PcapError`].
    pub fn read_packet(&mut self) -> Result<Option<RawPacket<'_>>, PcapError> {
        if self.done {
            return Ok(None);
        }
        let index = self.index;
        let pkt = match self.inner.next_packet() {
            None => {
                self.done = true;
                return Ok(None);
            }
            Some(Ok(pkt)) => pkt,
            Some(Err(e)) => {
                self.done = true;
                let path = self.path.clone();
                return Err(match e {
                    pcap_file::PcapError::IoError(io) if io.kind() == ErrorKind::UnexpectedEof => {
                        PcapError::Truncated { path, index }
                    }
                    pcap_file::PcapError::IoError(source) => PcapError::Read {
                        path,
                        index,
                        source,
                    },
                    pcap_file::PcapError::IncompleteBuffer => PcapError::Truncated { path, index },
                    other => PcapError::BadRecord {
                        path,
                        index,
                        reason: other.to_string(),
                    },
                });
            }
        };
        self.index += 1;
        let ts_ns = pkt.timestamp.as_nanos() as u64;
        match pkt.data {
            Cow::Borrowed(data) => Ok(Some(RawPacket { ts_ns, data })),
            // pcap-file's reader always lends from its buffer; handled anyway.
            Cow::Owned(_) => {
                self.done = true;
                Err(PcapError::BadRecord {
                    path: self.path.clone(),
                    index,
                    reason: "pcap reader returned an owned buffer".to_string(),
                })
            }
        }
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
