//! The files a run writes (`--output`, `--stats-json`): checked and opened before the
//! run starts, written to a temporary file beside the destination, and renamed over it
//! only when the run succeeded.
//!
//! * [`refuse_same_files`] refuses an output that is one of the run's inputs (or another
//!   output), compared by device and inode, so symlinks and other spellings of the same
//!   path are caught; nothing has been opened for writing when it fails.
//! * [`OutputFile::create`] checks that the destination's directory exists and is
//!   writable by creating the temporary file there. A destination that exists and is
//!   not a regular file (`/dev/null`, `/dev/full`, a FIFO) is opened and written in
//!   place instead: it cannot be renamed over.
//! * [`OutputFile::commit`] renames the temporary file over the destination; an
//!   `OutputFile` dropped without `commit` removes its temporary file, so a failed run
//!   leaves the destination as it was.
//!
//! What this module does not do: it does not write contents (the pcap writer and the
//! JSON serialiser do) and it does not `fsync`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Why an output file cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The output is an input of the run (or another output).
    #[error(
        "{flag} {} is the same file as {other_flag} {}: refusing to overwrite it",
        path.display(),
        other.display()
    )]
    SameFile {
        /// The output's flag (`--output`).
        flag: &'static str,
        /// The output as given.
        path: PathBuf,
        /// The other file's flag (`--input`).
        other_flag: &'static str,
        /// The other file as given.
        other: PathBuf,
    },
    /// The destination's directory does not exist.
    #[error("{flag} {}: directory {} does not exist", path.display(), dir.display())]
    NoDirectory {
        /// The output's flag.
        flag: &'static str,
        /// The output as given.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
    /// The destination is a directory.
    #[error("{flag} {}: is a directory", path.display())]
    IsDirectory {
        /// The output's flag.
        flag: &'static str,
        /// The output as given.
        path: PathBuf,
    },
    /// The destination (or a temporary file beside it) cannot be created or opened.
    #[error("{flag} {}: cannot create the file", path.display())]
    Create {
        /// The output's flag.
        flag: &'static str,
        /// The output as given.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Writing the output failed.
    #[error("{flag} {}: write error", path.display())]
    Write {
        /// The output's flag.
        flag: &'static str,
        /// The output as given.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The finished temporary file could not replace the destination.
    #[error("{flag} {}: cannot rename {} over it", path.display(), tmp.display())]
    Rename {
        /// The output's flag.
        flag: &'static str,
        /// The output as given.
        path: PathBuf,
        /// The temporary file (removed after this error).
        tmp: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

/// What names one file: an existing regular file's device and inode, or, for a file
/// that does not exist yet, its directory (resolved) and name.
#[derive(PartialEq, Eq)]
enum FileId {
    Existing(u64, u64),
    New(PathBuf),
}

fn file_id(p: &Path) -> Option<FileId> {
    match std::fs::metadata(p) {
        Ok(m) if m.file_type().is_file() => Some(FileId::Existing(m.dev(), m.ino())),
        Ok(_) => None,
        Err(_) => {
            let name = p.file_name()?;
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            Some(FileId::New(std::fs::canonicalize(dir).ok()?.join(name)))
        }
    }
}

/// Refuses any output (`(flag, path)`) that is the same regular file as an input or as
/// another output, also when the file does not exist yet (two outputs naming one new
/// file). Files that do not exist yet are nobody's input.
pub fn refuse_same_files(
    inputs: &[(&'static str, &Path)],
    outputs: &[(&'static str, &Path)],
) -> Result<(), OutputError> {
    for (i, &(flag, path)) in outputs.iter().enumerate() {
        let Some(out) = file_id(path) else { continue };
        let same = |p: &Path, may_be_new: bool| match file_id(p) {
            Some(FileId::New(_)) if !may_be_new => false,
            id => id.as_ref() == Some(&out),
        };
        let clash = inputs
            .iter()
            .find(|(_, p)| same(p, false))
            .or_else(|| outputs[..i].iter().find(|(_, p)| same(p, true)));
        if let Some(&(other_flag, other)) = clash {
            return Err(OutputError::SameFile {
                flag,
                path: path.to_owned(),
                other_flag,
                other: other.to_owned(),
            });
        }
    }
    Ok(())
}

/// Distinguishes temporary files of one process.
static TMP_SEQ: AtomicU32 = AtomicU32::new(0);

/// An output opened before the run: a temporary file beside the destination (renamed
/// over it by [`commit`](Self::commit)), or the destination itself when that is not a
/// regular file.
#[derive(Debug)]
pub struct OutputFile {
    flag: &'static str,
    path: PathBuf,
    /// Where the temporary file goes on commit (`path` with symlinks resolved).
    target: PathBuf,
    /// The temporary file, while it exists.
    tmp: Option<PathBuf>,
    file: Option<File>,
}

impl OutputFile {
    /// Checks `path` (given with `flag`) and opens what the run will write.
    pub fn create(flag: &'static str, path: &Path) -> Result<OutputFile, OutputError> {
        let err_create = |source| OutputError::Create {
            flag,
            path: path.to_owned(),
            source,
        };
        let existing = std::fs::metadata(path).ok();
        if let Some(m) = &existing {
            let ft = m.file_type();
            if ft.is_dir() {
                return Err(OutputError::IsDirectory {
                    flag,
                    path: path.to_owned(),
                });
            }
            if ft.is_char_device() || ft.is_fifo() || ft.is_block_device() || ft.is_socket() {
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(err_create)?;
                return Ok(OutputFile {
                    flag,
                    path: path.to_owned(),
                    target: path.to_owned(),
                    tmp: None,
                    file: Some(file),
                });
            }
        }
        // Write through a symlink to the file it names, not over the link.
        let target = match &existing {
            Some(_) => std::fs::canonicalize(path).map_err(err_create)?,
            None => path.to_owned(),
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(OutputError::NoDirectory {
                flag,
                path: path.to_owned(),
                dir,
            });
        }
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".to_owned());
        let tmp = dir.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(err_create)?;
        if let Some(m) = &existing {
            // Keep the destination's permissions; failing to is not worth refusing.
            let _ = file.set_permissions(m.permissions());
        }
        Ok(OutputFile {
            flag,
            path: path.to_owned(),
            target,
            tmp: Some(tmp),
            file: Some(file),
        })
    }

    /// The output as given on the command line.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file to write (once; later calls get `None`).
    pub fn take_file(&mut self) -> Option<File> {
        self.file.take()
    }

    /// A write error on this output.
    pub fn write_error(&self, source: io::Error) -> OutputError {
        OutputError::Write {
            flag: self.flag,
            path: self.path.clone(),
            source,
        }
    }

    /// Puts the written file in place of the destination.
    pub fn commit(mut self) -> Result<(), OutputError> {
        drop(self.file.take());
        let Some(tmp) = self.tmp.take() else {
            return Ok(());
        };
        std::fs::rename(&tmp, &self.target).map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            OutputError::Rename {
                flag: self.flag,
                path: self.path.clone(),
                tmp: tmp.clone(),
                source,
            }
        })
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_file_is_refused_through_links_and_spellings() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.pcap");
        std::fs::write(&input, b"x").unwrap();
        let link = dir.path().join("link.pcap");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let hard = dir.path().join("hard.pcap");
        std::fs::hard_link(&input, &hard).unwrap();
        let dotted = dir.path().join(".").join("in.pcap");
        for out in [&input, &link, &hard, &dotted] {
            let e = refuse_same_files(&[("--input", &input)], &[("--output", out)]).unwrap_err();
            assert!(matches!(e, OutputError::SameFile { .. }), "{e}");
        }
        let e =
            refuse_same_files(&[], &[("--output", &input), ("--stats-json", &link)]).unwrap_err();
        assert!(e.to_string().starts_with("--stats-json"), "{e}");
        let other = dir.path().join("out.pcap");
        refuse_same_files(&[("--input", &input)], &[("--output", &other)]).unwrap();
        refuse_same_files(
            &[("--input", &input)],
            &[("--output", Path::new("/dev/null"))],
        )
        .unwrap();
        // Two outputs naming one file that does not exist yet, by two spellings.
        let new = dir.path().join("new.out");
        let spelt = dir.path().join(".").join("new.out");
        let e =
            refuse_same_files(&[], &[("--output", &new), ("--stats-json", &spelt)]).unwrap_err();
        assert!(e.to_string().starts_with("--stats-json"), "{e}");
        assert!(!new.exists());
        // A new output is nobody's input, and two different new files are fine.
        refuse_same_files(&[("--input", &new)], &[("--output", &new)]).unwrap();
        refuse_same_files(&[], &[("--output", &new), ("--stats-json", &other)]).unwrap();
    }

    #[test]
    fn a_file_replaces_the_destination_only_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.json");
        std::fs::write(&dest, b"old").unwrap();
        let mut o = OutputFile::create("--stats-json", &dest).unwrap();
        use std::io::Write;
        o.take_file().unwrap().write_all(b"new").unwrap();
        drop(o);
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let mut o = OutputFile::create("--stats-json", &dest).unwrap();
        o.take_file().unwrap().write_all(b"new").unwrap();
        o.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let e = OutputFile::create("--output", &dir.path().join("no/out.pcap")).unwrap_err();
        assert!(matches!(e, OutputError::NoDirectory { .. }), "{e}");
        let e = OutputFile::create("--output", dir.path()).unwrap_err();
        assert!(matches!(e, OutputError::IsDirectory { .. }), "{e}");
    }
}
