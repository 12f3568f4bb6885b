//! Where records go. The spout hands each record to an [`Emitter`] and,
//! before it records an offset in a lock file, calls [`Emitter::flush`]:
//! a record is written out before the offset that covers it is recorded,
//! which is what makes delivery at-least-once.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};

use super::error::EmitError;

/// A consumer of records.
pub trait Emitter {
    /// Takes one record (a line without its newline). May buffer it.
    fn emit(&mut self, record: &[u8]) -> Result<(), EmitError>;
    /// Hands on everything emitted so far; called before each commit.
    fn flush(&mut self) -> Result<(), EmitError>;
    /// Drops records emitted but not flushed: their file was taken over by
    /// another instance, which emits them again from the last commit.
    fn discard(&mut self) {}
    /// The run is over: flush and finish (an `--exec` command gets EOF and
    /// is waited for).
    fn finish(&mut self) -> Result<(), EmitError> {
        self.flush()
    }
}

/// A closure is an emitter that hands on every record at once.
impl<F: FnMut(&[u8]) -> Result<(), EmitError>> Emitter for F {
    fn emit(&mut self, record: &[u8]) -> Result<(), EmitError> {
        self(record)
    }
    fn flush(&mut self) -> Result<(), EmitError> {
        Ok(())
    }
}

/// Buffers lines (record + `\n`) for a writer, up to 64 KiB at a time.
#[derive(Debug)]
struct LineBuffer {
    buf: Vec<u8>,
}

const BUFFER: usize = 64 * 1024;

impl LineBuffer {
    fn new() -> Self {
        LineBuffer {
            buf: Vec::with_capacity(BUFFER + 1024),
        }
    }

    /// Adds a line; true when the buffer should be written out.
    fn push(&mut self, record: &[u8]) -> bool {
        self.buf.extend_from_slice(record);
        self.buf.push(b'\n');
        self.buf.len() >= BUFFER
    }

    fn write_to(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            w.write_all(&self.buf)?;
            self.buf.clear();
        }
        w.flush()
    }
}

/// Records as lines on a writer; [`StdoutEmitter`] is this on stdout.
#[derive(Debug)]
pub struct WriteEmitter<W: Write> {
    out: W,
    lines: LineBuffer,
}

/// Records as lines on standard output.
pub type StdoutEmitter = WriteEmitter<std::io::Stdout>;

impl StdoutEmitter {
    pub fn stdout() -> Self {
        WriteEmitter::new(std::io::stdout())
    }
}

impl<W: Write> WriteEmitter<W> {
    pub fn new(out: W) -> Self {
        WriteEmitter {
            out,
            lines: LineBuffer::new(),
        }
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write> Emitter for WriteEmitter<W> {
    fn emit(&mut self, record: &[u8]) -> Result<(), EmitError> {
        if self.lines.push(record) {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), EmitError> {
        self.lines
            .write_to(&mut self.out)
            .map_err(EmitError::Stdout)
    }
    fn discard(&mut self) {
        self.lines.buf.clear();
    }
}

/// Records as lines on the standard input of `sh -c CMD`. The command runs
/// in its own process group, so a Ctrl-C meant for the spout (which then
/// finishes its record, commits and stops) does not kill the consumer
/// first; it gets EOF when the spout is done and the spout waits for it.
#[derive(Debug)]
pub struct ExecEmitter {
    cmd: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: LineBuffer,
}

impl ExecEmitter {
    pub fn spawn(cmd: &str) -> Result<Self, EmitError> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .stdin(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|source| EmitError::Spawn {
                cmd: cmd.to_string(),
                source,
            })?;
        let stdin = child.stdin.take();
        Ok(ExecEmitter {
            cmd: cmd.to_string(),
            child,
            stdin,
            lines: LineBuffer::new(),
        })
    }

    /// The command's pid (its process group id too).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn gone(&mut self, source: std::io::Error) -> EmitError {
        // If it has exited, say how: that is what the user needs.
        if let Ok(Some(status)) = self.child.try_wait()
            && !status.success()
        {
            return EmitError::CommandFailed {
                cmd: self.cmd.clone(),
                status,
            };
        }
        EmitError::CommandGone {
            cmd: self.cmd.clone(),
            source,
        }
    }
}

impl Emitter for ExecEmitter {
    fn emit(&mut self, record: &[u8]) -> Result<(), EmitError> {
        if self.lines.push(record) {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), EmitError> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(self.gone(std::io::Error::from(std::io::ErrorKind::BrokenPipe)));
        };
        match self.lines.write_to(stdin) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stdin = None;
                Err(self.gone(e))
            }
        }
    }

    fn discard(&mut self) {
        self.lines.buf.clear();
    }

    fn finish(&mut self) -> Result<(), EmitError> {
        let flushed = self.flush();
        self.stdin = None;
        let status = self.child.wait().map_err(|source| EmitError::CommandGone {
            cmd: self.cmd.clone(),
            source,
        })?;
        flushed?;
        if !status.success() {
            return Err(EmitError::CommandFailed {
                cmd: self.cmd.clone(),
                status,
            });
        }
        Ok(())
    }
}

impl Drop for ExecEmitter {
    fn drop(&mut self) {
        // EOF, then reap: never leave a zombie or an orphaned consumer
        // waiting for input.
        self.stdin = None;
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_reach_the_writer_on_flush() {
        let mut e = WriteEmitter::new(Vec::new());
        e.emit(b"a").unwrap();
        e.emit(b"b").unwrap();
        assert!(e.out.is_empty(), "buffered until flush");
        e.flush().unwrap();
        e.emit(b"lost").unwrap();
        e.discard();
        e.finish().unwrap();
        assert_eq!(e.into_inner(), b"a\nb\n");
    }

    #[test]
    fn exec_emitter_feeds_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut e = ExecEmitter::spawn(&format!("cat > '{}'", out.display())).unwrap();
        for i in 0..10_000 {
            e.emit(format!("line {i}").as_bytes()).unwrap();
        }
        e.finish().unwrap();
        let got = std::fs::read_to_string(&out).unwrap();
        assert_eq!(got.lines().count(), 10_000);
        assert_eq!(got.lines().last(), Some("line 9999"));
    }

    #[test]
    fn dead_command_is_an_error() {
        let mut e = ExecEmitter::spawn("exit 3").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut r = Ok(());
        for _ in 0..100 {
            r = e.emit(&[b'x'; 4096]);
            if r.is_err() {
                break;
            }
        }
        match r.and_then(|_| e.finish()) {
            Err(EmitError::CommandFailed { status, .. }) => assert_eq!(status.code(), Some(3)),
            other => panic!("{other:?}"),
        }
    }
}
