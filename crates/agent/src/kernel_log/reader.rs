//! Reads kernel-log records, new ones only, bounded. Two sources behind one path:
//! - a character device (`/dev/kmsg`): opened once, non-blocking, kept open; the first read
//!   returns what the kernel's ring buffer still holds (since boot, as far as it reaches), later
//!   ones what was logged since. Records the ring overwrote before the agent read them are lost
//!   (`EPIPE`), counted, and reading goes on.
//! - a plain file (tests, the sandbox): read from where the last read stopped; a file replaced or
//!   shortened is read again from its start.
//!
//! Whatever the source, a record is delivered once: one at or before the last delivered (by the
//! kernel's sequence number, or by time for a `dmesg`-style line, which has none) is dropped.
//! Each read takes at most [`MAX_READ_BYTES`]; the rest waits for the next read.

use std::{
    fs::File,
    io::{ErrorKind, Read, Seek, SeekFrom},
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use super::parse::{KernelXid, Skipped, parse_record, parse_xid};

/// The most one read takes from the source.
pub const MAX_READ_BYTES: usize = 1 << 20;

/// An XID record: when it was logged (microseconds since boot) and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedXid {
    /// Microseconds since boot.
    pub micros_since_boot: u64,
    /// The line's fields.
    pub xid: KernelXid,
}

/// Why the kernel log cannot be read: a detector fault, never a GPU's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel log {path} cannot be read: {message}")]
pub struct KernelLogError {
    /// The path.
    pub path: String,
    /// What went wrong.
    pub message: String,
}

/// What is open.
enum Source {
    /// `/dev/kmsg`: one record per `read`.
    Device(File),
    /// A plain file: its inode and how far it was read.
    Plain { inode: u64, offset: u64 },
}

/// Counts of what reading skipped, for the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkipCounts {
    /// Lines over the length bound.
    pub too_long: u64,
    /// Lines (or XID texts) in no known shape.
    pub malformed: u64,
    /// Records the kernel's ring overwrote before they were read.
    pub lost: u64,
}

/// Reads one kernel log.
pub struct KernelLogReader {
    path: PathBuf,
    source: Option<Source>,
    last_sequence: Option<u64>,
    last_micros: Option<u64>,
    skipped: SkipCounts,
}

impl KernelLogReader {
    /// A reader of `path` (opened at the first read).
    #[must_use]
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            source: None,
            last_sequence: None,
            last_micros: None,
            skipped: SkipCounts::default(),
        }
    }

    /// The path read.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What was skipped so far.
    #[must_use]
    pub fn skipped(&self) -> SkipCounts {
        self.skipped
    }

    fn error(&self, err: &std::io::Error) -> KernelLogError {
        let hint = if err.kind() == ErrorKind::PermissionDenied {
            " (reading the kernel log needs CAP_SYSLOG where kernel.dmesg_restrict=1)"
        } else {
            ""
        };
        KernelLogError {
            path: self.path.display().to_string(),
            message: format!("{err}{hint}"),
        }
    }

    /// The XID records logged since the last read.
    pub fn read(&mut self) -> Result<Vec<LoggedXid>, KernelLogError> {
        let lines = match self.read_lines() {
            Ok(lines) => lines,
            Err(err) => {
                // Opened again at the next read; delivered records stay delivered.
                self.source = None;
                return Err(self.error(&err));
            }
        };
        let mut xids = Vec::new();
        for line in lines.lines() {
            match self.take(line) {
                Ok(Some(xid)) => xids.push(xid),
                Ok(None) => {}
                Err(Skipped::TooLong) => self.skipped.too_long += 1,
                Err(Skipped::Malformed) => self.skipped.malformed += 1,
            }
        }
        Ok(xids)
    }

    /// One line: an XID not delivered before, or nothing.
    fn take(&mut self, line: &str) -> Result<Option<LoggedXid>, Skipped> {
        let Some(record) = parse_record(line)? else {
            return Ok(None);
        };
        let fresh = match record.sequence {
            Some(sequence) => self.last_sequence.is_none_or(|last| sequence > last),
            None => self
                .last_micros
                .is_none_or(|last| record.micros_since_boot > last),
        };
        if !fresh {
            return Ok(None);
        }
        match record.sequence {
            Some(sequence) => self.last_sequence = Some(sequence),
            None => self.last_micros = Some(record.micros_since_boot),
        }
        Ok(parse_xid(record.text)?.map(|xid| LoggedXid {
            micros_since_boot: record.micros_since_boot,
            xid,
        }))
    }

    /// The text of the records since the last read, at most [`MAX_READ_BYTES`] of it.
    fn read_lines(&mut self) -> std::io::Result<String> {
        if self.source.is_none() {
            let metadata = std::fs::metadata(&self.path)?;
            self.source = Some(if metadata.file_type().is_char_device() {
                Source::Device(
                    File::options()
                        .read(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&self.path)?,
                )
            } else {
                Source::Plain {
                    inode: metadata.ino(),
                    offset: 0,
                }
            });
        }
        match self.source.as_mut() {
            Some(Source::Device(file)) => read_device(file, &mut self.skipped),
            Some(Source::Plain { inode, offset }) => read_plain(&self.path, inode, offset),
            None => Ok(String::new()),
        }
    }
}

/// Reads whole records from `/dev/kmsg` until none is left (or the bound).
fn read_device(file: &mut File, skipped: &mut SkipCounts) -> std::io::Result<String> {
    // A record is at most about 1 KiB of text plus its prefix; a shorter buffer fails the read.
    let mut buffer = vec![0_u8; 8192];
    let mut text = String::new();
    while text.len() < MAX_READ_BYTES {
        match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => {
                text.push_str(&String::from_utf8_lossy(&buffer[..read]));
                if !text.ends_with('\n') {
                    text.push('\n');
                }
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => break,
            // Overwritten before it was read: the next read returns the oldest record left.
            Err(err) if err.kind() == ErrorKind::BrokenPipe => skipped.lost += 1,
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(text)
}

/// Reads whole lines of a plain file from `offset`, from its start if it was replaced or shortened.
fn read_plain(path: &Path, inode: &mut u64, offset: &mut u64) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let metadata = file.metadata()?;
    if metadata.ino() != *inode || metadata.len() < *offset {
        (*inode, *offset) = (metadata.ino(), 0);
    }
    file.seek(SeekFrom::Start(*offset))?;
    let mut bytes = Vec::new();
    file.take(MAX_READ_BYTES as u64).read_to_end(&mut bytes)?;
    // Only whole lines: a line being written is read next time.
    let whole = bytes
        .iter()
        .rposition(|byte| *byte == b'\n')
        .map_or(0, |at| at + 1);
    bytes.truncate(whole);
    *offset += whole as u64;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn temp_file(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpu-health-agent-kmsg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        path
    }

    fn append(path: &Path, text: &str) {
        let mut file = File::options().create(true).append(true).open(path).unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }

    fn codes(xids: &[LoggedXid]) -> Vec<u64> {
        xids.iter().map(|logged| logged.xid.xid).collect()
    }

    #[test]
    fn each_xid_record_is_delivered_once_and_other_lines_are_passed_over() {
        let path = temp_file("once");
        append(
            &path,
            "6,1,100,-;usb 1-1: new device\n3,2,200,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n SUBSYSTEM=pci\n",
        );
        let mut reader = KernelLogReader::new(&path);
        let first = reader.read().unwrap();
        assert_eq!(codes(&first), vec![79]);
        assert_eq!(first[0].micros_since_boot, 200);
        assert_eq!(reader.read().unwrap(), vec![]);
        append(&path, "3,3,300,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics");
        assert_eq!(reader.read().unwrap(), vec![], "half a line waits");
        append(&path, " Exception\n");
        assert_eq!(codes(&reader.read().unwrap()), vec![13]);
        assert_eq!(reader.skipped(), SkipCounts::default());
    }

    #[test]
    fn a_replaced_file_is_read_again_without_repeating_what_was_delivered() {
        let path = temp_file("replaced");
        append(
            &path,
            "3,7,700,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n",
        );
        let mut reader = KernelLogReader::new(&path);
        assert_eq!(codes(&reader.read().unwrap()), vec![79]);
        let replacement = path.with_extension("new");
        std::fs::write(
            &replacement,
            "3,7,700,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n3,8,800,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE\n",
        )
        .unwrap();
        std::fs::rename(&replacement, &path).unwrap();
        assert_eq!(codes(&reader.read().unwrap()), vec![48]);
    }

    #[test]
    fn junk_and_over_long_lines_are_counted_and_reading_goes_on() {
        let path = temp_file("junk");
        let long = format!("3,2,20,-;{}\n", "x".repeat(super::super::parse::MAX_RECORD_BYTES));
        append(
            &path,
            &format!(
                "garbage\n{long}3,3,30,-;NVRM: Xid (PCI:0000:3b:00 bogus): 79, x\n[5.000001] NVRM: Xid (PCI:0000:3b:00): 94, pid=2, Contained\n"
            ),
        );
        let mut reader = KernelLogReader::new(&path);
        assert_eq!(codes(&reader.read().unwrap()), vec![94]);
        assert_eq!(
            reader.skipped(),
            SkipCounts {
                too_long: 1,
                malformed: 2,
                lost: 0
            }
        );
    }

    #[test]
    fn a_missing_log_is_an_error_that_names_it() {
        let path = temp_file("absent");
        let err = KernelLogReader::new(&path).read().unwrap_err();
        assert_eq!(err.path, path.display().to_string());
        assert!(err.to_string().contains("cannot be read"), "{err}");
    }

    #[test]
    fn an_unreadable_log_says_what_permission_it_needs() {
        let err =
            KernelLogReader::new(Path::new("/x")).error(&std::io::Error::from(ErrorKind::PermissionDenied));
        assert!(err.message.contains("CAP_SYSLOG"), "{err}");
    }
}
