//! Where records go, and when they count as delivered. The spout hands
//! each record to an [`Emitter`] and records an offset in a lock file only
//! for records the emitter says were delivered ([`Emitter::acknowledged`]):
//! a record reaches its consumer before the offset that covers it is
//! recorded, which is what makes delivery at-least-once.
//!
//! Writers (stdout, a file, a closure) deliver what they flushed. An
//! `--exec` command ([`ExecEmitter`]) delivers what it acknowledged: it
//! runs once per file, and exits 0 after reading the file's last record to
//! acknowledge the whole file; while it runs it may acknowledge the
//! records handled so far by writing their count on file descriptor 3
//! (`$LEASEFS_ACK_FD`), one decimal number per line, as Storm's bolts ack
//! tuples. A command that fails, stops reading, or dies acknowledged only
//! what it counted: the rest is emitted again by whoever takes the file.

use std::io::Write;

use super::error::EmitError;
use super::watch::Watch;

/// A consumer of records.
pub trait Emitter {
    /// A file begins: the records from here on are counted from 0 for
    /// [`Emitter::acknowledged`].
    fn begin_file(&mut self, _name: &std::ffi::OsStr) -> Result<(), EmitError> {
        Ok(())
    }
    /// Takes one record (a line without its newline). May buffer it.
    fn emit(&mut self, record: &[u8]) -> Result<(), EmitError>;
    /// Hands on everything emitted so far; called before each commit.
    fn flush(&mut self) -> Result<(), EmitError>;
    /// How many of this file's records were delivered for good, after a
    /// [`Emitter::flush`]; `None`: every record flushed is.
    fn acknowledged(&mut self) -> Result<Option<u64>, EmitError> {
        Ok(None)
    }
    /// The file's records end here (its end, or the spout stops in it):
    /// `Ok` once every record emitted for it was delivered.
    fn end_file(&mut self) -> Result<(), EmitError> {
        self.flush()
    }
    /// No more records for this file: hand on what is left and let the
    /// consumer see the end (an `--exec` command gets EOF), without waiting
    /// for it; [`Emitter::end_file`] follows.
    fn close_input(&mut self) -> Result<(), EmitError> {
        self.flush()
    }
    /// Drops records emitted but not delivered: their file was taken over
    /// by another instance, which emits them again from the last commit.
    fn discard(&mut self) {}
    /// The run is over: flush and finish.
    fn finish(&mut self) -> Result<(), EmitError> {
        self.flush()
    }
    /// Hands the emitter the run's [`Watch`] (stop request, consumer
    /// progress). `true` when the emitter itself reports its consumer's
    /// progress there; otherwise the run counts every record the emitter
    /// took as progress.
    fn watch(&mut self, _w: &Watch) -> bool {
        false
    }
    /// Whether the consumer of the current file still runs and may
    /// acknowledge more (an `--exec` command); writers have no such state.
    fn consumer_running(&mut self) -> bool {
        false
    }
    /// Kills the consumer of the current file (its whole process tree) and
    /// drops what it did not acknowledge: it stalled, or the file is given
    /// up. By default the same as [`Emitter::discard`].
    fn abort(&mut self) {
        self.discard()
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
pub(super) struct LineBuffer {
    pub(super) buf: Vec<u8>,
}

const BUFFER: usize = 64 * 1024;

impl LineBuffer {
    pub(super) fn new() -> Self {
        LineBuffer {
            buf: Vec::with_capacity(BUFFER + 1024),
        }
    }

    /// Adds a line; true when the buffer should be written out.
    pub(super) fn push(&mut self, record: &[u8]) -> bool {
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
    /// Standard output when it is a pipe or a socket: written directly, a
    /// few lines at a time once `poll` says there is room, so that a stop
    /// request or a stall is seen even when nobody reads.
    watched_fd: Option<std::os::fd::RawFd>,
    watch: Option<Watch>,
    /// Records of the current file written out whole.
    delivered: u64,
}

/// Records as lines on standard output.
pub type StdoutEmitter = WriteEmitter<std::io::Stdout>;

/// At most this much per write to a pipe: a write no larger than
/// `PIPE_BUF` into a pipe `poll` says is writable does not block.
const PIPE_CHUNK: usize = libc::PIPE_BUF;

impl StdoutEmitter {
    pub fn stdout() -> Self {
        let mut e = WriteEmitter::new(std::io::stdout());
        let is_pipe = nix::sys::stat::fstat(std::io::stdout()).is_ok_and(|st| {
            let kind = st.st_mode & libc::S_IFMT;
            kind == libc::S_IFIFO || kind == libc::S_IFSOCK
        });
        if is_pipe {
            e.watched_fd = Some(libc::STDOUT_FILENO);
        }
        e
    }
}

impl<W: Write> WriteEmitter<W> {
    pub fn new(out: W) -> Self {
        WriteEmitter {
            out,
            lines: LineBuffer::new(),
            watched_fd: None,
            watch: None,
            delivered: 0,
        }
    }

    /// Writes the buffer to `fd` whole lines at a time (a line longer than
    /// a chunk whole), each once there is room, giving up when the spout
    /// stops or the reader stalls: what was written are whole lines.
    fn write_watched(&mut self, fd: std::os::fd::RawFd, w: &Watch) -> Result<(), EmitError> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        // SAFETY: standard output stays open for the life of the process.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        while !self.lines.buf.is_empty() {
            let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
            let ready = poll(&mut fds, PollTimeout::from(20u16)).is_ok_and(|n| n > 0);
            if !ready {
                if w.stop_requested() {
                    self.lines.buf.clear();
                    return Err(EmitError::Stopped {
                        cmd: "standard output".into(),
                        acked: self.delivered,
                    });
                }
                if w.stalled() {
                    self.lines.buf.clear();
                    return Err(EmitError::Stalled {
                        cmd: "standard output".into(),
                        quiet_ms: w.quiet_for().as_millis() as u64,
                        acked: self.delivered,
                    });
                }
                continue;
            }
            let buf = &self.lines.buf;
            let cap = buf.len().min(PIPE_CHUNK);
            let end = match buf[..cap].iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => buf
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(buf.len(), |i| i + 1),
            };
            match nix::unistd::write(fd, &buf[..end]) {
                Ok(n) => {
                    self.delivered += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
                    self.lines.buf.drain(..n);
                    w.beat();
                }
                Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(EmitError::Stdout(e.into())),
            }
        }
        Ok(())
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write> Emitter for WriteEmitter<W> {
    fn begin_file(&mut self, _name: &std::ffi::OsStr) -> Result<(), EmitError> {
        self.delivered = 0;
        Ok(())
    }
    fn emit(&mut self, record: &[u8]) -> Result<(), EmitError> {
        if self.lines.push(record) {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), EmitError> {
        if let (Some(fd), Some(w)) = (self.watched_fd, self.watch.clone()) {
            return self.write_watched(fd, &w);
        }
        self.lines
            .write_to(&mut self.out)
            .map_err(EmitError::Stdout)
    }
    fn discard(&mut self) {
        self.lines.buf.clear();
    }
    fn watch(&mut self, w: &Watch) -> bool {
        self.watch = Some(w.clone());
        // Writes to a watched pipe report progress themselves; any other
        // writer's progress is counted by the run, record by record.
        self.watched_fd.is_some()
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
}
