//! [`ExecEmitter`]: records as lines on the standard input of `sh -c CMD`,
//! one command per file, and what it acknowledged (see [`super::emit`]).
//!
//! The command's stdin is a pipe of which the spout keeps a read end it
//! never reads from: once the command has exited, whatever is still in the
//! pipe is what it did not read, so a command that exits 0 before reading
//! its file's last record (`head -n 3`) has not taken the file, however
//! small. The same read end means writes never fail with `EPIPE`: they are
//! made without blocking and stop once the command has exited.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::emit::{Emitter, LineBuffer};
use super::error::EmitError;
use super::tree::kill_tree;
use super::watch::Watch;

/// How long a command is given, once the spout was asked to stop, to
/// finish the records it was given (it got EOF) before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// How often the waits look at the command, its acknowledgements and the
/// watch.
const POLL: Duration = Duration::from_millis(20);

/// Records as lines on the standard input of `sh -c CMD`, one command per
/// file. The command runs in its own process group, so a Ctrl-C meant for
/// the spout (which then finishes its record, commits and stops) does not
/// kill the consumer first; it gets EOF at the end of its file, or when
/// the spout stops, and the spout waits for it.
#[derive(Debug)]
pub struct ExecEmitter {
    cmd: String,
    run: Option<Consumer>,
    lines: LineBuffer,
    watch: Option<Watch>,
    /// When the stop request was first seen by a wait.
    stop_seen: Option<Instant>,
}

/// Why writing to the command's stdin stopped.
enum WriteFail {
    Io(std::io::Error),
    /// No progress for the progress timeout.
    Stalled,
    /// The spout is stopping: the rest is not handed on.
    Stopping,
}

/// The command consuming one file.
#[derive(Debug)]
struct Consumer {
    child: Child,
    /// The write end of the command's stdin (non-blocking); `None` once
    /// closed (EOF).
    stdin: Option<File>,
    /// A read end of the same pipe, never read: what is left in the pipe
    /// after the command exited is what it did not take.
    probe: OwnedFd,
    /// Read end of the command's file descriptor 3 (non-blocking).
    acks: File,
    /// Bytes of an acknowledgement line not complete yet.
    partial: Vec<u8>,
    emitted: u64,
    acked: u64,
    /// Bytes left in the pipe at the last look: less means it read.
    unread: usize,
    /// Records of its file were not handed on (the spout stopped): an
    /// exit 0 does not acknowledge the file, only the whole lines it read.
    short: bool,
    /// What went into the pipe, to tell those lines.
    handed: Handed,
}

/// The lines written into the command's stdin pipe, and the bytes written
/// last that may still be in it (the pipe's capacity), so that once the
/// command exited the whole lines it read are those written minus those
/// it left in the pipe (which the spout's read end counts).
#[derive(Debug)]
struct Handed {
    lines: u64,
    tail: Vec<u8>,
    cap: usize,
}

impl Handed {
    fn new(cap: usize) -> Handed {
        Handed {
            lines: 0,
            tail: Vec::new(),
            cap,
        }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        self.lines += bytes.iter().filter(|&&b| b == b'\n').count() as u64;
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 2 * self.cap {
            let cut = self.tail.len() - self.cap;
            self.tail.drain(..cut);
        }
    }

    /// Whole lines read, `left` bytes being still in the pipe; `None` when
    /// that is more than the pipe can hold (its size changed: unknown).
    fn taken(&self, left: usize) -> Option<u64> {
        let unread = self.tail.get(self.tail.len().checked_sub(left)?..)?;
        let unread_lines = unread.iter().filter(|&&b| b == b'\n').count() as u64;
        Some(self.lines - unread_lines)
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

fn set_nonblocking(fd: impl AsFd) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    if let Ok(bits) = fcntl(&fd, FcntlArg::F_GETFL) {
        let _ = fcntl(
            &fd,
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(bits) | OFlag::O_NONBLOCK),
        );
    }
}

/// Bytes waiting in the pipe of `fd`.
fn unread(fd: &OwnedFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD on an open pipe descriptor writes one int.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 { 0 } else { n.max(0) as usize }
}

impl ExecEmitter {
    /// An emitter that runs `sh -c CMD` for each file.
    pub fn new(cmd: &str) -> Self {
        ExecEmitter {
            cmd: cmd.to_string(),
            run: None,
            lines: LineBuffer::new(),
            watch: None,
            stop_seen: None,
        }
    }

    /// The running command's pid (its process group id too), if any.
    pub fn pid(&self) -> Option<u32> {
        self.run.as_ref().map(|r| r.child.id())
    }

    fn spawn(&self, name: &OsStr) -> Result<Consumer, EmitError> {
        let spawn_err = |source| EmitError::Spawn {
            cmd: self.cmd.clone(),
            source,
        };
        let (in_r, in_w) = pipe().map_err(spawn_err)?;
        let probe = in_r.try_clone().map_err(spawn_err)?;
        let (ack_r, ack_w) = pipe().map_err(spawn_err)?;
        let ack_fd = ack_w.as_raw_fd();
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(&self.cmd)
            .env("LEASEFS_ACK_FD", "3")
            .env("LEASEFS_SPOUT_FILE", name)
            .stdin(Stdio::from(in_r))
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
        let child = c.spawn().map_err(spawn_err)?;
        drop(ack_w);
        let stdin = File::from(in_w);
        set_nonblocking(&stdin);
        let cap = nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_GETPIPE_SZ)
            .map_or(1 << 20, |n| n.max(0) as usize);
        let acks = File::from(ack_r);
        set_nonblocking(&acks);
        Ok(Consumer {
            child,
            stdin: Some(stdin),
            probe,
            acks,
            partial: Vec::new(),
            emitted: 0,
            acked: 0,
            unread: 0,
            short: false,
            handed: Handed::new(cap),
        })
    }

    /// The command stopped taking its input: say how it ended, if it did.
    fn gone(&mut self, source: std::io::Error) -> EmitError {
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

    /// Whether a command that is still running must be given up: stalled
    /// (no progress for the progress timeout), or still busy `STOP_GRACE`
    /// after the spout was asked to stop.
    fn judge(&mut self, r: &Consumer) -> Option<EmitError> {
        let w = self.watch.as_ref()?;
        if w.stalled() {
            return Some(EmitError::Stalled {
                cmd: self.cmd.clone(),
                quiet_ms: w.quiet_for().as_millis() as u64,
                acked: r.acked,
            });
        }
        if w.stop_requested() {
            let seen = *self.stop_seen.get_or_insert_with(Instant::now);
            if seen.elapsed() >= STOP_GRACE {
                return Some(EmitError::Stopped {
                    cmd: self.cmd.clone(),
                    acked: r.acked,
                });
            }
        }
        None
    }

    /// EOF for the file's command, then its exit; `Err` if it left input
    /// unread, or if it had to be killed (see [`ExecEmitter::judge`]).
    fn wait(&mut self) -> Result<ExitStatus, EmitError> {
        let Some(mut r) = self.run.take() else {
            return Err(EmitError::CommandGone {
                cmd: self.cmd.clone(),
                source: std::io::ErrorKind::NotConnected.into(),
            });
        };
        r.stdin = None;
        let status = loop {
            match r.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(source) => {
                    return Err(EmitError::CommandGone {
                        cmd: self.cmd.clone(),
                        source,
                    });
                }
            }
            let watch = self.watch.as_ref();
            r.read_acks(watch);
            r.note_reading(watch);
            if let Some(e) = self.judge(&r) {
                give_up(&mut r);
                return Err(e);
            }
            std::thread::sleep(POLL);
        };
        r.read_acks(None);
        if r.short {
            // Lines were held back by the stop: an exit 0 acknowledges the
            // whole lines it read, anything else what it counted on fd 3.
            let read = status
                .success()
                .then(|| r.handed.taken(unread(&r.probe)))
                .flatten();
            return Err(EmitError::Stopped {
                cmd: self.cmd.clone(),
                acked: read.map_or(r.acked, |n| r.acked.max(n.min(r.emitted))),
            });
        }
        let left = unread(&r.probe);
        if status.success() && left > 0 {
            return Err(EmitError::CommandGone {
                cmd: self.cmd.clone(),
                source: std::io::Error::other(format!(
                    "it exited without reading the last {left} bytes of its input"
                )),
            });
        }
        Ok(status)
    }
}

/// Kills the command's whole tree and reaps it.
fn give_up(r: &mut Consumer) {
    r.stdin = None;
    kill_tree(r.child.id());
    let _ = r.child.wait();
    r.read_acks(None);
}

impl Consumer {
    /// Writes all of `data`, waiting for room while the command lives,
    /// takes input and the spout is not stopping.
    fn write_all(&mut self, mut data: &[u8], watch: Option<&Watch>) -> Result<(), WriteFail> {
        while !data.is_empty() {
            let Some(w) = self.stdin.as_mut() else {
                return Err(WriteFail::Io(std::io::ErrorKind::BrokenPipe.into()));
            };
            match w.write(data) {
                Ok(n) => {
                    self.handed.wrote(&data[..n]);
                    data = &data[n..];
                    if let Some(w) = watch {
                        w.beat();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if self.child.try_wait().map_err(WriteFail::Io)?.is_some() {
                        return Err(WriteFail::Io(std::io::Error::new(
                            std::io::ErrorKind::BrokenPipe,
                            "the command exited before reading all its input",
                        )));
                    }
                    self.read_acks(watch);
                    if let Some(w) = watch {
                        if w.stop_requested() {
                            self.short = true;
                            return Err(WriteFail::Stopping);
                        }
                        if w.stalled() {
                            return Err(WriteFail::Stalled);
                        }
                    }
                    let Some(w) = self.stdin.as_ref() else {
                        continue;
                    };
                    let mut fds = [nix::poll::PollFd::new(
                        w.as_fd(),
                        nix::poll::PollFlags::POLLOUT,
                    )];
                    let _ = nix::poll::poll(
                        &mut fds,
                        nix::poll::PollTimeout::from(POLL.as_millis() as u16),
                    );
                }
                Err(e) => return Err(WriteFail::Io(e)),
            }
        }
        Ok(())
    }

    /// Progress by reading: fewer bytes left in the pipe than at the last
    /// look.
    fn note_reading(&mut self, watch: Option<&Watch>) {
        let left = unread(&self.probe);
        if left < self.unread
            && let Some(w) = watch
        {
            w.beat();
        }
        self.unread = left;
    }

    /// Reads what the command acknowledged since (cumulative counts; the
    /// largest one counts, capped by what was emitted); a larger count is
    /// progress.
    fn read_acks(&mut self, watch: Option<&Watch>) {
        let before = self.acked;
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
        if self.acked > before
            && let Some(w) = watch
        {
            w.beat();
        }
    }
}

impl Emitter for ExecEmitter {
    fn begin_file(&mut self, name: &OsStr) -> Result<(), EmitError> {
        // A command still running belongs to an earlier file that ended
        // without `end_file` (an error): it gets EOF first.
        if self.run.is_some() {
            let _ = self.wait();
        }
        self.lines.buf.clear();
        self.stop_seen = None;
        self.run = Some(self.spawn(name)?);
        if let Some(w) = &self.watch {
            w.beat();
        }
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
        let r = match self.run.as_mut() {
            Some(r) => r.write_all(&self.lines.buf, self.watch.as_ref()),
            None => Err(WriteFail::Io(std::io::ErrorKind::BrokenPipe.into())),
        };
        match r {
            Ok(()) => {
                self.lines.buf.clear();
                Ok(())
            }
            // What is left is not handed on; the command gets EOF and the
            // grace to finish the rest (see `wait`).
            Err(WriteFail::Stopping) => {
                self.lines.buf.clear();
                Ok(())
            }
            Err(WriteFail::Stalled) => {
                self.lines.buf.clear();
                let Some(mut r) = self.run.take() else {
                    return Err(self.gone(std::io::ErrorKind::BrokenPipe.into()));
                };
                give_up(&mut r);
                Err(EmitError::Stalled {
                    cmd: self.cmd.clone(),
                    quiet_ms: self
                        .watch
                        .as_ref()
                        .map_or(0, |w| w.quiet_for().as_millis() as u64),
                    acked: r.acked,
                })
            }
            Err(WriteFail::Io(e)) => {
                if let Some(r) = self.run.as_mut() {
                    r.stdin = None;
                }
                Err(self.gone(e))
            }
        }
    }

    fn acknowledged(&mut self) -> Result<Option<u64>, EmitError> {
        let watch = self.watch.as_ref();
        Ok(self.run.as_mut().map(|r| {
            r.read_acks(watch);
            r.note_reading(watch);
            r.acked
        }))
    }

    fn close_input(&mut self) -> Result<(), EmitError> {
        self.flush()?;
        if let Some(r) = self.run.as_mut() {
            r.stdin = None;
        }
        Ok(())
    }

    fn watch(&mut self, w: &Watch) -> bool {
        self.watch = Some(w.clone());
        true
    }

    fn consumer_running(&mut self) -> bool {
        self.run
            .as_mut()
            .is_some_and(|r| matches!(r.child.try_wait(), Ok(None)))
    }

    fn abort(&mut self) {
        self.lines.buf.clear();
        if let Some(mut r) = self.run.take() {
            give_up(&mut r);
        }
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
            if self.watch.as_ref().is_some_and(|w| w.stop_requested()) {
                kill_tree(r.child.id());
            }
            let _ = r.child.wait();
        }
    }
}

/// Waits up to `max` for `f`.
#[cfg(test)]
fn eventually(max: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + max;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn file() -> &'static OsStr {
        OsStr::new("f")
    }

    #[test]
    fn one_command_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut e = ExecEmitter::new(&format!("cat >> '{}'", out.display()));
        for f in 0..2 {
            e.begin_file(file()).unwrap();
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
        let mut e = ExecEmitter::new("n=0; while read -r l; do n=$((n+1)); echo $n >&3; done");
        e.begin_file(file()).unwrap();
        for i in 0..5 {
            e.emit(format!("r{i}").as_bytes()).unwrap();
        }
        e.flush().unwrap();
        assert!(eventually(Duration::from_secs(10), || e
            .acknowledged()
            .unwrap()
            == Some(5)));
        e.end_file().unwrap();
    }

    #[test]
    fn a_command_that_exits_0_without_reading_everything_took_nothing() {
        // Small enough for the pipe: no write ever fails. (The shell reads
        // its input a byte at a time; `head` would read a whole buffer, and
        // what a command read counts as taken.)
        let mut e = ExecEmitter::new("read -r l; exit 0");
        e.begin_file(file()).unwrap();
        for i in 0..100 {
            e.emit(format!("line {i}").as_bytes()).unwrap();
        }
        e.flush().unwrap();
        // Let it read its one line and leave.
        std::thread::sleep(Duration::from_millis(200));
        let r = e.end_file();
        assert!(matches!(r, Err(EmitError::CommandGone { .. })), "{r:?}");
        // A big file: the writes themselves stop.
        e.begin_file(file()).unwrap();
        let mut r = Ok(());
        for i in 0..200_000 {
            r = e.emit(format!("line {i}").as_bytes());
            if r.is_err() {
                break;
            }
        }
        assert!(r.and_then(|_| e.end_file()).is_err());
    }

    /// Stopped while the pipe is full (lines held back), a command that
    /// reads a line at a time and exits 0 acknowledged exactly the lines
    /// it read: the spout commits there, and a takeover neither loses nor
    /// repeats a line. Before, only fd 3 counted: it acknowledged none.
    ///
    /// The command reads nothing until the test says so, and the stop
    /// comes once more than the pipe holds was emitted, so lines are held
    /// back whatever the scheduler does. (A
    /// stop on a timer, against a command reading all along, found the
    /// pipe with room now and then: nothing held back, and the test
    /// failed on a loaded machine.)
    #[test]
    fn stopped_with_lines_held_back_an_exit_0_acknowledges_what_it_read() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let go = dir.path().join("go");
        let mut e = ExecEmitter::new(&format!(
            "while [ ! -e '{}' ]; do sleep 0.01; done; \
             while IFS= read -r l; do printf '%s\\n' \"$l\"; done > '{}'",
            go.display(),
            out.display()
        ));
        let w = Watch::new(None);
        e.watch(&w);
        e.begin_file(file()).unwrap();
        let given = Arc::new(AtomicU64::new(0));
        let stopper = {
            let (w, given) = (w.clone(), given.clone());
            std::thread::spawn(move || {
                // The spout's first write is of 64 KiB and a line, more
                // than the pipe holds (64 KiB at most by default): the
                // loop stays in that write, which sees the stop, until
                // the command reads.
                while given.load(Ordering::Relaxed) < 64 * 1024 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                w.request_stop();
            })
        };
        let mut n = 0u64;
        while !w.stop_requested() {
            let line = format!("line {n:08}");
            given.fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
            e.emit(line.as_bytes()).unwrap();
            n += 1;
        }
        stopper.join().unwrap();
        // What the spout still buffers meets the full pipe: held back.
        e.flush().unwrap();
        std::fs::write(&go, b"").unwrap();
        let acked = match e.end_file() {
            Err(EmitError::Stopped { acked, .. }) => acked,
            other => panic!("lines were held back, yet: {other:?}"),
        };
        let got = std::fs::read_to_string(&out).unwrap();
        let lines = got.lines().count() as u64;
        assert!(lines > 0 && lines < n, "{lines} of {n}");
        assert_eq!(
            acked, lines,
            "acknowledged {acked}, the command wrote {lines}"
        );
    }

    #[test]
    fn dead_command_is_an_error() {
        let mut e = ExecEmitter::new("exit 3");
        e.begin_file(file()).unwrap();
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
