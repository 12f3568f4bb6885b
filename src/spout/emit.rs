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

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};

use super::error::EmitError;

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
    /// Drops records emitted but not delivered: their file was taken over
    /// by another instance, which emits them again from the last commit.
    fn discard(&mut self) {}
    /// The run is over: flush and finish.
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

/// Records as lines on the standard input of `sh -c CMD`, one command per
/// file (see the module's notes on acknowledgement). The command runs in
/// its own process group, so a Ctrl-C meant for the spout (which then
/// finishes its record, commits and stops) does not kill the consumer
/// first; it gets EOF at the end of its file, or when the spout stops, and
/// the spout waits for it.
#[derive(Debug)]
pub struct ExecEmitter {
    cmd: String,
    run: Option<Consumer>,
    lines: LineBuffer,
}

/// The command consuming one file.
#[derive(Debug)]
struct Consumer {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Read end of the command's file descriptor 3 (non-blocking).
    acks: std::fs::File,
    /// Bytes of an acknowledgement line not complete yet.
    partial: Vec<u8>,
    emitted: u64,
    acked: u64,
}

impl ExecEmitter {
    /// An emitter that runs `sh -c CMD` for each file.
    pub fn new(cmd: &str) -> Self {
        ExecEmitter {
            cmd: cmd.to_string(),
            run: None,
            lines: LineBuffer::new(),
        }
    }

    /// The running command's pid (its process group id too), if any.
    pub fn pid(&self) -> Option<u32> {
        self.run.as_ref().map(|r| r.child.id())
    }

    fn spawn(&self, name: &std::ffi::OsStr) -> Result<Consumer, EmitError> {
        let spawn_err = |source| EmitError::Spawn {
            cmd: self.cmd.clone(),
            source,
        };
        let (ack_r, ack_w): (OwnedFd, OwnedFd) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| spawn_err(e.into()))?;
        let ack_fd = ack_w.as_raw_fd();
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(&self.cmd)
            .env("LEASEFS_ACK_FD", "3")
            .env("LEASEFS_SPOUT_FILE", name)
            .stdin(Stdio::piped())
            .process_group(0);
        // SAFETY: dup2 and fcntl are async-signal-safe; `ack_fd` is open in
        // the parent (and so in the child) until the spawn returns.
        unsafe {
            c.pre_exec(move || {
                if libc::dup2(ack_fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // dup2 onto itself keeps close-on-exec: clear it either way.
                libc::fcntl(3, libc::F_SETFD, 0);
                Ok(())
            });
        }
        let mut child = c.spawn().map_err(spawn_err)?;
        drop(ack_w);
        let acks = std::fs::File::from(ack_r);
        set_nonblocking(&acks);
        let stdin = child.stdin.take();
        Ok(Consumer {
            child,
            stdin,
            acks,
            partial: Vec::new(),
            emitted: 0,
            acked: 0,
        })
    }

    fn gone(&mut self, source: std::io::Error) -> EmitError {
        // If it has exited, say how: that is what the user needs.
        if let Some(r) = self.run.as_mut()
            && let Ok(Some(status)) = r.child.try_wait()
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

    /// Waits for the file's command after its EOF.
    fn wait(&mut self) -> Result<std::process::ExitStatus, EmitError> {
        let Some(mut r) = self.run.take() else {
            return Err(EmitError::CommandGone {
                cmd: self.cmd.clone(),
                source: std::io::ErrorKind::NotConnected.into(),
            });
        };
        r.stdin = None;
        r.child.wait().map_err(|source| EmitError::CommandGone {
            cmd: self.cmd.clone(),
            source,
        })
    }
}

impl Consumer {
    /// Reads what the command acknowledged since (cumulative counts; the
    /// largest one counts, capped by what was emitted).
    fn read_acks(&mut self) {
        let mut buf = [0u8; 4096];
        loop {
            match self.acks.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break, // EAGAIN: nothing more for now
            }
        }
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            match std::str::from_utf8(&line)
                .ok()
                .and_then(|l| l.trim().parse::<u64>().ok())
            {
                Some(n) => self.acked = self.acked.max(n.min(self.emitted)),
                None => tracing::warn!(
                    "ignored an acknowledgement that is not a count: {:?}",
                    String::from_utf8_lossy(&line)
                ),
            }
        }
    }
}

fn set_nonblocking(f: &std::fs::File) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    if let Ok(bits) = fcntl(f, FcntlArg::F_GETFL) {
        let _ = fcntl(
            f,
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(bits) | OFlag::O_NONBLOCK),
        );
    }
}

impl Emitter for ExecEmitter {
    fn begin_file(&mut self, name: &std::ffi::OsStr) -> Result<(), EmitError> {
        // A command still running belongs to an earlier file that ended
        // without `end_file` (an error): it gets EOF first.
        if self.run.is_some() {
            let _ = self.wait();
        }
        self.lines.buf.clear();
        self.run = Some(self.spawn(name)?);
        Ok(())
    }

    fn emit(&mut self, record: &[u8]) -> Result<(), EmitError> {
        if let Some(r) = self.run.as_mut() {
            r.emitted += 1;
        }
        if self.lines.push(record) {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), EmitError> {
        let Some(stdin) = self.run.as_mut().and_then(|r| r.stdin.as_mut()) else {
            return Err(self.gone(std::io::Error::from(std::io::ErrorKind::BrokenPipe)));
        };
        match self.lines.write_to(stdin) {
            Ok(()) => Ok(()),
            Err(e) => {
                if let Some(r) = self.run.as_mut() {
                    r.stdin = None;
                }
                Err(self.gone(e))
            }
        }
    }

    fn acknowledged(&mut self) -> Result<Option<u64>, EmitError> {
        Ok(self.run.as_mut().map(|r| {
            r.read_acks();
            r.acked
        }))
    }

    fn end_file(&mut self) -> Result<(), EmitError> {
        let flushed = self.flush();
        let status = self.wait()?;
        flushed?;
        if !status.success() {
            return Err(EmitError::CommandFailed {
                cmd: self.cmd.clone(),
                status,
            });
        }
        Ok(())
    }

    fn discard(&mut self) {
        self.lines.buf.clear();
        // EOF: the command finishes what it got (duplicates of what the
        // new owner emits again, never a loss).
        let _ = self.wait();
    }

    fn finish(&mut self) -> Result<(), EmitError> {
        if self.run.is_some() {
            return self.end_file();
        }
        Ok(())
    }
}

impl Drop for ExecEmitter {
    fn drop(&mut self) {
        // EOF, then reap: never leave a zombie or an orphaned consumer
        // waiting for input.
        if let Some(mut r) = self.run.take() {
            r.stdin = None;
            let _ = r.child.wait();
        }
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
    fn exec_emitter_runs_one_command_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut e = ExecEmitter::new(&format!("cat >> '{}'", out.display()));
        for f in 0..2 {
            e.begin_file(std::ffi::OsStr::new("f")).unwrap();
            for i in 0..10_000 {
                e.emit(format!("{f} line {i}").as_bytes()).unwrap();
            }
            e.flush().unwrap();
            e.end_file().unwrap();
        }
        e.finish().unwrap();
        let got = std::fs::read_to_string(&out).unwrap();
        assert_eq!(got.lines().count(), 20_000);
        assert_eq!(got.lines().last(), Some("1 line 9999"));
    }

    #[test]
    fn acknowledgements_count_records_on_descriptor_3() {
        // Acknowledges every record it reads; the spout asks in between.
        let mut e = ExecEmitter::new("n=0; while read -r l; do n=$((n+1)); echo $n >&3; done");
        e.begin_file(std::ffi::OsStr::new("f")).unwrap();
        for i in 0..5 {
            e.emit(format!("r{i}").as_bytes()).unwrap();
        }
        e.flush().unwrap();
        let mut acked = Some(0);
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while acked != Some(5) && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(10));
            acked = e.acknowledged().unwrap();
        }
        assert_eq!(acked, Some(5));
        e.end_file().unwrap();
    }

    #[test]
    fn a_command_that_stops_reading_has_not_taken_the_file() {
        let mut e = ExecEmitter::new("head -n 3 > /dev/null");
        e.begin_file(std::ffi::OsStr::new("f")).unwrap();
        let mut r = Ok(());
        for i in 0..200_000 {
            r = e.emit(format!("line {i}").as_bytes());
            if r.is_err() {
                break;
            }
        }
        let r = r.and_then(|_| e.end_file());
        assert!(matches!(r, Err(EmitError::CommandGone { .. })), "{r:?}");
        assert!(
            e.acknowledged().unwrap().unwrap_or(0) == 0,
            "nothing was acknowledged"
        );
    }

    #[test]
    fn dead_command_is_an_error() {
        let mut e = ExecEmitter::new("exit 3");
        e.begin_file(std::ffi::OsStr::new("f")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut r = Ok(());
        for _ in 0..100 {
            r = e.emit(&[b'x'; 4096]);
            if r.is_err() {
                break;
            }
        }
        match r.and_then(|_| e.end_file()) {
            Err(EmitError::CommandFailed { status, .. }) => assert_eq!(status.code(), Some(3)),
            other => panic!("{other:?}"),
        }
    }
}
