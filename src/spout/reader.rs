//! Records of a data file: lines of UTF-8 text, read from a byte offset.
//!
//! A record is a line without its `\n` (bytes are passed on unchanged, a
//! `\r` included); a last line without a newline is a record too. Offsets
//! are byte offsets, so the offset after a record is exactly where the
//! next one starts and a lock file's entry says where to resume; the
//! reader also counts lines and Java characters, Storm's measures. A file
//! that is not UTF-8 text, holds a NUL byte, or whose recorded offset is
//! not at a record boundary cannot be read as records and goes to the bad
//! directory.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::entry::Position;
pub use super::error::ReadError;

/// A record longer than this is taken for a binary file, not a line: it
/// would otherwise be buffered whole in memory.
pub const MAX_RECORD: u64 = 64 * 1024 * 1024;

/// Why a record is not valid text, if it is not.
fn invalid(record: &[u8]) -> Option<&'static str> {
    if record.contains(&0) {
        return Some("NUL byte");
    }
    if std::str::from_utf8(record).is_err() {
        return Some("invalid UTF-8");
    }
    None
}

/// Reads records one by one from a start position.
#[derive(Debug)]
pub struct RecordReader<R> {
    inner: BufReader<R>,
    pos: Position,
    buf: Vec<u8>,
}

impl RecordReader<File> {
    /// Opens `path` to read records from `start`, whose byte offset must
    /// be 0, the file's length, or just after a newline (where a record
    /// starts).
    pub fn open(path: &Path, start: Position) -> Result<Self, ReadError> {
        let offset = start.bytes;
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        if offset > len {
            return Err(ReadError::Invalid {
                offset,
                reason: "recorded offset is past the end of the file",
            });
        }
        if offset > 0 && offset < len {
            f.seek(SeekFrom::Start(offset - 1))?;
            let mut b = [0u8; 1];
            f.read_exact(&mut b)?;
            if b[0] != b'\n' {
                return Err(ReadError::Invalid {
                    offset,
                    reason: "recorded offset is not at the start of a line",
                });
            }
        } else {
            f.seek(SeekFrom::Start(offset))?;
        }
        Ok(Self::new(f, start))
    }
}

impl<R: Read> RecordReader<R> {
    /// Reads from `inner`, which is positioned at `start` of its file.
    pub fn new(inner: R, start: Position) -> Self {
        RecordReader {
            inner: BufReader::with_capacity(256 * 1024, inner),
            pos: start,
            buf: Vec::new(),
        }
    }

    /// The byte offset just after the last record returned.
    pub fn offset(&self) -> u64 {
        self.pos.bytes
    }

    /// The position just after the last record returned.
    pub fn position(&self) -> Position {
        self.pos
    }

    /// The next record, without its newline; `None` at the end.
    pub fn next_record(&mut self) -> Result<Option<&[u8]>, ReadError> {
        self.buf.clear();
        let n = (&mut self.inner)
            .take(MAX_RECORD + 1)
            .read_until(b'\n', &mut self.buf)? as u64;
        if n == 0 {
            return Ok(None);
        }
        let record_len = if self.buf.last() == Some(&b'\n') {
            self.buf.len() - 1
        } else if n > MAX_RECORD {
            return Err(ReadError::Invalid {
                offset: self.pos.bytes,
                reason: "line longer than 64 MiB",
            });
        } else {
            self.buf.len()
        };
        if let Some(reason) = invalid(&self.buf[..record_len]) {
            return Err(ReadError::Invalid {
                offset: self.pos.bytes,
                reason,
            });
        }
        self.pos.advance(&self.buf);
        Ok(Some(&self.buf[..record_len]))
    }

    /// Reads to the end, checking every record; returns how many there are.
    pub fn validate(mut self) -> Result<u64, ReadError> {
        let mut n = 0;
        while self.next_record()?.is_some() {
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(bytes: u64) -> Position {
        Position {
            bytes,
            ..Position::default()
        }
    }

    fn all(bytes: &[u8], from: u64) -> Result<Vec<(String, u64)>, ReadError> {
        let mut r = RecordReader::new(&bytes[from as usize..], at(from));
        let mut out = Vec::new();
        while let Some(rec) = r.next_record()? {
            let s = String::from_utf8(rec.to_vec()).unwrap();
            out.push((s, r.offset()));
        }
        Ok(out)
    }

    #[test]
    fn lines_with_offsets_after_each() {
        let got = all(b"a\nbb\n\nccc", 0).unwrap();
        let want = [("a", 2), ("bb", 5), ("", 6), ("ccc", 9)];
        assert_eq!(got, want.map(|(s, o)| (s.to_string(), o)));
    }

    #[test]
    fn resumes_from_an_offset() {
        let got = all(b"a\nbb\nccc\n", 5).unwrap();
        assert_eq!(got, vec![("ccc".to_string(), 9)]);
    }

    #[test]
    fn empty_input_has_no_record() {
        assert!(all(b"", 0).unwrap().is_empty());
    }

    #[test]
    fn carriage_returns_are_kept() {
        assert_eq!(all(b"x\r\n", 0).unwrap(), vec![("x\r".to_string(), 3)]);
    }

    #[test]
    fn nul_byte_is_invalid_with_its_record_offset() {
        match all(b"ok\nba\0d\nmore\n", 0) {
            Err(ReadError::Invalid { offset: 3, reason }) => assert_eq!(reason, "NUL byte"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn invalid_utf8_is_invalid() {
        match all(b"ok\n\xc3\x28\n", 0) {
            Err(ReadError::Invalid { offset: 3, reason }) => assert_eq!(reason, "invalid UTF-8"),
            other => panic!("{other:?}"),
        }
        // A multi-byte character is fine.
        assert_eq!(all("héllo\n".as_bytes(), 0).unwrap().len(), 1);
    }

    #[test]
    fn validate_counts_records() {
        assert_eq!(
            RecordReader::new(&b"1\n2\n3"[..], at(0))
                .validate()
                .unwrap(),
            3
        );
        assert!(
            RecordReader::new(&b"1\n\xff\n"[..], at(0))
                .validate()
                .is_err()
        );
    }

    #[test]
    fn open_checks_the_resume_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "ab\ncd\nef").unwrap();
        for ok in [0, 3, 6, 8] {
            assert!(RecordReader::open(&p, at(ok)).is_ok(), "offset {ok}");
        }
        for bad in [1, 4, 9] {
            assert!(
                matches!(
                    RecordReader::open(&p, at(bad)),
                    Err(ReadError::Invalid { .. })
                ),
                "offset {bad}"
            );
        }
        let mut r = RecordReader::open(&p, at(3)).unwrap();
        assert_eq!(r.next_record().unwrap(), Some(&b"cd"[..]));
        assert_eq!(r.offset(), 6);
        assert_eq!(r.next_record().unwrap(), Some(&b"ef"[..]));
        // Storm's measures: a last line without newline is no line.
        assert_eq!((r.position().lines, r.position().chars), (1, 5));
    }
}
