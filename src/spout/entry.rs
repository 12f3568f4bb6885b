//! The progress entries of a lock file, in Apache Storm's own format, so
//! that Storm's HdfsSpout and leasefs can take over each other's lock
//! files (docs/SEMANTICS.md, "Spout").
//!
//! Storm writes `<epoch-millis>,<spout-id>,<offset>`, a newline *before*
//! every entry but the first (so its last entry ends without one), with
//! the offset `0` for the first entry and `{char=C:line=L:}` after that:
//! the characters (UTF-16 code units, as Java counts them) and the lines
//! consumed. Storm's reader takes the text after `=` of the first two
//! `:`-separated parts and ignores the rest, so leasefs writes
//! `{char=C:line=L:byte=B:}`: Storm resumes at C characters, leasefs at B
//! bytes, which are the same place. Entries of Storm (no `byte=`) are
//! resumed at line L, or at character C if that is earlier; bare byte
//! offsets, which earlier leasefs versions wrote, are still read.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::error::ReadError;

/// Reading at most this much of a lock file's end finds its last entry.
const TAIL_BYTES: u64 = 64 * 1024;

/// A place in a data file: how much of it was consumed, in the three
/// measures the two formats use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    pub bytes: u64,
    /// Newlines consumed (a last line without one is not counted, as in
    /// Storm).
    pub lines: u64,
    /// UTF-16 code units consumed (Java's characters).
    pub chars: u64,
}

/// UTF-16 code units of UTF-8 text (of valid UTF-8; a reader checks that).
pub fn utf16_units(text: &[u8]) -> u64 {
    text.iter()
        .map(|&b| match b {
            0x80..=0xBF => 0, // continuation byte
            0xF0..=0xFF => 2, // a character outside the BMP: a surrogate pair
            _ => 1,
        })
        .sum()
}

impl Position {
    /// Moves past `bytes` (whole lines, or a last line without newline).
    pub fn advance(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        self.lines += bytes.iter().filter(|&&b| b == b'\n').count() as u64;
        self.chars += utf16_units(bytes);
    }
}

/// The offset field of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offset {
    /// `0`: the start of the file (every first entry).
    Start,
    /// A bare byte offset (lock files of earlier leasefs versions).
    Bytes(u64),
    /// Storm's `{char=C:line=L:}`; `bytes` when leasefs wrote it.
    Text {
        chars: u64,
        lines: u64,
        bytes: Option<u64>,
    },
}

impl Offset {
    /// How leasefs records `p`.
    pub fn of(p: Position) -> Offset {
        if p.bytes == 0 {
            Offset::Start
        } else {
            Offset::Text {
                chars: p.chars,
                lines: p.lines,
                bytes: Some(p.bytes),
            }
        }
    }

    fn parse(s: &str) -> Option<Offset> {
        if s == "0" {
            return Some(Offset::Start);
        }
        if let Some(body) = s.strip_prefix('{') {
            // Complete only with its closing brace: a cut-short entry must
            // not pass for an earlier offset.
            let body = body.strip_suffix('}')?;
            let (mut chars, mut lines, mut bytes) = (None, None, None);
            for part in body.split(':').filter(|p| !p.is_empty()) {
                let (k, v) = part.split_once('=')?;
                let v: u64 = v.parse().ok()?;
                match k {
                    "char" => chars = Some(v),
                    "line" => lines = Some(v),
                    "byte" => bytes = Some(v),
                    _ => {}
                }
            }
            return Some(Offset::Text {
                chars: chars?,
                lines: lines?,
                bytes,
            });
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return s.parse().ok().map(Offset::Bytes);
        }
        None
    }

    fn field(&self) -> String {
        match self {
            Offset::Start => "0".into(),
            Offset::Bytes(b) => b.to_string(),
            Offset::Text {
                chars,
                lines,
                bytes: Some(b),
            } => format!("{{char={chars}:line={lines}:byte={b}:}}"),
            Offset::Text {
                chars,
                lines,
                bytes: None,
            } => format!("{{char={chars}:line={lines}:}}"),
        }
    }

    /// The byte offset, when the entry says it.
    pub fn bytes(&self) -> Option<u64> {
        match self {
            Offset::Start => Some(0),
            Offset::Bytes(b) => Some(*b),
            Offset::Text { bytes, .. } => *bytes,
        }
    }

    /// Written whole: a Storm entry is its last line without a newline, so
    /// such a line counts only if it could not be the start of a longer
    /// entry cut short.
    fn complete_without_newline(&self) -> bool {
        !matches!(self, Offset::Bytes(_))
    }
}

impl std::fmt::Display for Offset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.field())
    }
}

/// One progress entry of a lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// When it was written, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The spout instance that wrote it.
    pub spout_id: String,
    /// Up to where every record was emitted (and acknowledged).
    pub offset: Offset,
}

impl LogEntry {
    /// Parses `<epoch-millis>,<spout-id>,<offset>` as Storm does: split at
    /// the first two commas (an id cannot hold one).
    pub fn parse(line: &str) -> Option<LogEntry> {
        let line = line.trim_end_matches('\r');
        let mut f = line.splitn(3, ',');
        let time_ms = f.next()?.trim().parse().ok()?;
        let spout_id = f.next()?.to_string();
        let offset = Offset::parse(f.next()?.trim())?;
        Some(LogEntry {
            time_ms,
            spout_id,
            offset,
        })
    }

    /// The entry as written, without any newline.
    pub fn to_line(&self) -> String {
        format!("{},{},{}", self.time_ms, self.spout_id, self.offset)
    }
}

/// The last well-formed entry of a lock file's contents. Lines that do not
/// parse are skipped (an empty or wholly garbled lock file has no entry:
/// Storm crashed on that, STORM-2356), and so is a last line without its
/// newline unless it is complete ([`Offset::complete_without_newline`]).
pub fn parse_last_entry(bytes: &[u8]) -> Option<LogEntry> {
    let ends_with_newline = bytes.last() == Some(&b'\n');
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if ends_with_newline {
        lines.pop();
    }
    let last = lines.len().checked_sub(1)?;
    lines.iter().enumerate().rev().find_map(|(i, l)| {
        let e = LogEntry::parse(std::str::from_utf8(l).ok()?)?;
        let whole = i < last || ends_with_newline || e.offset.complete_without_newline();
        whole.then_some(e)
    })
}

/// Reads the last entry of a lock file through a read-only descriptor,
/// which leasefs never delays: the visible length covers every
/// acknowledged (fsynced) entry of a writer that still holds the file.
pub fn read_last_entry(path: &Path) -> std::io::Result<Option<LogEntry>> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    if start > 0 {
        // Started inside a line: drop its tail, it could parse wrongly.
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                buf.drain(..=i);
            }
            None => return Ok(None),
        }
    }
    Ok(parse_last_entry(&buf))
}

/// The position in data file `path` that `offset` names, found by reading
/// the file up to it. A byte offset must be at the start of a line (or the
/// end); Storm's entries are resumed at their line, or at their character
/// if that is earlier (Storm itself resumes by character): never later
/// than either, so nothing is skipped.
pub fn locate(path: &Path, offset: Offset) -> Result<Position, ReadError> {
    let invalid = |reason| ReadError::Invalid {
        offset: offset.bytes().unwrap_or(0),
        reason,
    };
    if offset == Offset::Start {
        return Ok(Position::default());
    }
    let mut r = BufReader::with_capacity(256 * 1024, File::open(path)?);
    let mut pos = Position::default();
    let mut line = Vec::new();
    loop {
        let done = match offset {
            Offset::Start => true,
            Offset::Bytes(b) | Offset::Text { bytes: Some(b), .. } => pos.bytes >= b,
            Offset::Text {
                chars,
                lines,
                bytes: None,
            } => pos.lines >= lines || pos.chars >= chars,
        };
        if done {
            break;
        }
        line.clear();
        let n = r.read_until(b'\n', &mut line)? as u64;
        if n == 0 {
            return Err(invalid("recorded offset is past the end of the file"));
        }
        match offset {
            Offset::Text {
                chars, bytes: None, ..
            } if pos.chars + utf16_units(&line) > chars => break, // inside this line
            _ => {}
        }
        if offset.bytes().is_some_and(|b| pos.bytes + n > b) {
            return Err(invalid("recorded offset is not at the start of a line"));
        }
        pos.advance(&line);
    }
    if let Offset::Text {
        chars,
        lines,
        bytes: None,
    } = offset
        && (pos.chars, pos.lines) != (chars, lines)
    {
        tracing::warn!(
            "a Storm lock entry says {{char={chars}:line={lines}:}} but line {lines} starts at character {}: resuming at line {} (the earlier of the two)",
            pos.chars,
            pos.lines
        );
    }
    Ok(pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Storm's `TextFileReader.Offset(String)` makes of an offset
    /// field: `0`, or the numbers after `=` in the first two `:`-separated
    /// parts; `None` where it throws.
    fn storm_offset(field: &str) -> Option<(u64, u64)> {
        if field.eq_ignore_ascii_case("0") {
            return Some((0, 0));
        }
        let parts: Vec<&str> = field.split(':').collect();
        let value = |p: &str| p.split('=').nth(1)?.parse::<u64>().ok();
        Some((value(parts.first()?)?, value(parts.get(1)?)?))
    }

    /// Storm's `FileLock.getLastEntry`: the last line of the file (as a
    /// `BufferedReader` reads lines), split in three at the first two
    /// commas.
    fn storm_last_entry(file: &str) -> Option<(u64, String, String)> {
        let last = file.lines().last()?;
        let mut f = last.splitn(3, ',');
        Some((
            f.next()?.parse().ok()?,
            f.next()?.to_string(),
            f.next()?.to_string(),
        ))
    }

    fn entry(offset: Offset) -> LogEntry {
        LogEntry {
            time_ms: 1_700_000_000_123,
            spout_id: "host:12".into(),
            offset,
        }
    }

    #[test]
    fn leasefs_entries_are_what_storm_reads() {
        let p = Position {
            bytes: 4096,
            lines: 60,
            chars: 4090,
        };
        // As a lock file holds them: a newline before each but the first.
        let file = format!(
            "{}\n{}",
            entry(Offset::Start).to_line(),
            entry(Offset::of(p)).to_line()
        );
        let (time, id, field) = storm_last_entry(&file).expect("Storm reads an entry");
        assert_eq!((time, id.as_str()), (1_700_000_000_123, "host:12"));
        assert_eq!(storm_offset(&field), Some((4090, 60)));
        let (_, _, first) = storm_last_entry(&entry(Offset::Start).to_line()).expect("first");
        assert_eq!(storm_offset(&first), Some((0, 0)));
        // And leasefs reads it back.
        let e = parse_last_entry(file.as_bytes()).expect("entry");
        assert_eq!(e.offset.bytes(), Some(4096));
        assert_eq!(e.offset, Offset::of(p));
        // A bare byte offset is what Storm throws on.
        assert_eq!(storm_offset("4096"), None);
    }

    #[test]
    fn storm_entries_are_read() {
        let b = b"1000,storm-7,0\n2000,storm-7,{char=480:line=60:}";
        let e = parse_last_entry(b).expect("the last, newline-less entry");
        assert_eq!(
            e.offset,
            Offset::Text {
                chars: 480,
                lines: 60,
                bytes: None
            }
        );
        assert_eq!(e.spout_id, "storm-7");
        // Cut short: not taken for an earlier offset.
        let b = b"1000,storm-7,0\n2000,storm-7,{char=480:line=6";
        assert_eq!(parse_last_entry(b).expect("entry").offset, Offset::Start);
    }

    #[test]
    fn earlier_leasefs_entries_are_read() {
        let e = LogEntry::parse("1700000000123,spout-a,4096").unwrap();
        assert_eq!(
            (e.time_ms, e.offset),
            (1_700_000_000_123, Offset::Bytes(4096))
        );
        // A bare number at the end without a newline may have been cut.
        let e = parse_last_entry(b"1,a,0\n2,a,10\n3,b,2").unwrap();
        assert_eq!((e.time_ms, e.offset), (2, Offset::Bytes(10)));
        assert_eq!(
            parse_last_entry(b"1,a,0\n2,a,10\n3,b,20\n").unwrap().offset,
            Offset::Bytes(20)
        );
    }

    #[test]
    fn malformed_entries_and_files() {
        for l in [
            "",
            "abc",
            "1,2",
            "x,id,3",
            "1,id,",
            "1,id,-5",
            "1,id,{char=5:line=1",
            "1,id,{line=1:}",
        ] {
            assert_eq!(LogEntry::parse(l), None, "{l:?}");
        }
        assert_eq!(parse_last_entry(b""), None);
        assert_eq!(parse_last_entry(b"\0\0\0\n"), None);
        assert_eq!(parse_last_entry(b"garbage\n"), None);
        let b = b"1,a,0\n2,a,10\n\xff\xfe\n\n";
        assert_eq!(parse_last_entry(b).unwrap().offset, Offset::Bytes(10));
    }

    #[test]
    fn positions_count_java_characters() {
        let mut p = Position::default();
        p.advance("a\u{e9}\u{1F600}\r\n".as_bytes());
        // a, é, a surrogate pair, \r, \n
        assert_eq!((p.bytes, p.lines, p.chars), (9, 1, 6));
    }

    #[test]
    fn locate_finds_lines_characters_and_checks_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, "r\u{e9}c 0\nr\u{e9}c 1\nr\u{e9}c 2\n").unwrap();
        // Each line: 7 bytes, 6 characters.
        let at_line = locate(
            &path,
            Offset::Text {
                chars: 12,
                lines: 2,
                bytes: None,
            },
        )
        .unwrap();
        assert_eq!(
            at_line,
            Position {
                bytes: 14,
                lines: 2,
                chars: 12
            }
        );
        // Storm's character is earlier than its line: the earlier wins.
        let early = locate(
            &path,
            Offset::Text {
                chars: 6,
                lines: 2,
                bytes: None,
            },
        )
        .unwrap();
        assert_eq!(early.bytes, 7);
        assert_eq!(locate(&path, Offset::Bytes(7)).unwrap().chars, 6);
        assert!(matches!(
            locate(&path, Offset::Bytes(8)),
            Err(ReadError::Invalid { .. })
        ));
        assert!(matches!(
            locate(
                &path,
                Offset::Text {
                    chars: 99,
                    lines: 9,
                    bytes: None
                }
            ),
            Err(ReadError::Invalid { .. })
        ));
    }

    #[test]
    fn read_last_entry_of_a_long_log_reads_only_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let mut s = entry(Offset::Start).to_line();
        for i in 1..10_000u64 {
            s.push('\n');
            s.push_str(
                &entry(Offset::of(Position {
                    bytes: i * 10,
                    lines: i,
                    chars: i * 10,
                }))
                .to_line(),
            );
        }
        std::fs::write(&p, &s).unwrap();
        let e = read_last_entry(&p).unwrap().unwrap();
        assert_eq!(e.offset.bytes(), Some(99_990));
        std::fs::write(&p, "").unwrap();
        assert_eq!(read_last_entry(&p).unwrap(), None);
    }
}
