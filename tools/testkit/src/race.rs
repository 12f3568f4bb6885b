//! Writers that start at the same instant, released by a barrier rather
//! than a clock, so that they race however loaded the machine is:
//!
//! - `testkit racer PATH ID`: says `ready`, waits for the end of its
//!   standard input (the test closes every racer's at once), opens PATH
//!   for append, writes 1 MiB of its two-digit ID in 64 KiB writes, closes.
//!   Says `ok ID T_OPEN T_CLOSE` (CLOCK_MONOTONIC seconds just after the
//!   open and just before the close) or `err ERRNO_NAME` if the open fails.
//! - `testkit hold-open N --hold-ms MS`: forks N processes; once every one
//!   exists they are released together, and child `i` opens `fNNN`
//!   (`O_TRUNC`), writes `file i`, holds it MS, closes, and says `ok i
//!   START OPENED CLOSING DONE` (CLOCK_MONOTONIC seconds; START is when
//!   they were released) or `err i ERRNO_NAME`. Exits 1 if any child failed.

use std::io::{self, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::sys;

pub fn racer(path: &Path, id: u32) -> ExitCode {
    let mut out = io::stdout().lock();
    let ready = writeln!(out, "ready").and_then(|()| out.flush());
    let mut rest = Vec::new();
    if ready
        .and_then(|()| io::stdin().read_to_end(&mut rest))
        .is_err()
    {
        return ExitCode::from(2);
    }
    let chunk = format!("{id:02}").repeat(32768);
    let mut f = match sys::open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND) {
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(out, "err {}", sys::errno_name(&e));
            return ExitCode::SUCCESS;
        }
    };
    let t_open = sys::monotonic_secs();
    let written = (0..16).try_for_each(|_| f.write_all(chunk.as_bytes()));
    let t_close = sys::monotonic_secs();
    if let Err(e) = written.and_then(|()| sys::close(f)) {
        eprintln!("testkit racer {id}: {e}");
        return ExitCode::FAILURE;
    }
    let _ = writeln!(out, "ok {id} {t_open:.6} {t_close:.6}");
    ExitCode::SUCCESS
}

/// Writes one whole line to standard output with one write(2): the lines
/// of many processes on one pipe never interleave.
fn line(s: &str) {
    // SAFETY: writes `s.len()` bytes of `s`, alive across the call.
    unsafe { libc::write(1, s.as_ptr().cast(), s.len()) };
}

fn child(i: usize, start: f64, hold: Duration) -> i32 {
    let r = (|| -> io::Result<(f64, f64, f64)> {
        let name = format!("f{i:03}");
        let mut f = sys::open(
            Path::new(&name),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        )?;
        let opened = sys::monotonic_secs();
        f.write_all(format!("file {i}\n").as_bytes())?;
        std::thread::sleep(hold);
        let closing = sys::monotonic_secs();
        sys::close(f)?;
        Ok((opened, closing, sys::monotonic_secs()))
    })();
    match r {
        Ok((opened, closing, done)) => {
            line(&format!(
                "ok {i} {start:.6} {opened:.6} {closing:.6} {done:.6}\n"
            ));
            0
        }
        Err(e) => {
            line(&format!("err {i} {}\n", sys::errno_name(&e)));
            1
        }
    }
}

/// Reads exactly `buf.len()` bytes from descriptor `fd`.
fn read_exact(fd: i32, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reads into the unfilled rest of `buf`.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        match n {
            n if n > 0 => got += n as usize,
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return false,
        }
    }
    true
}

pub fn hold_open(n: usize, hold: Duration) -> ExitCode {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two descriptors of `fds`.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } < 0 {
        eprintln!("testkit hold-open: pipe: {}", io::Error::last_os_error());
        return ExitCode::from(2);
    }
    let [rd, wr] = fds;
    let mut pids = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: this process has one thread; the child only makes
        // system calls and formats its line before `_exit`.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: the child's own copies of the pipe's descriptors.
                unsafe { libc::close(wr) };
                let mut start = [0u8; 8];
                let code = if read_exact(rd, &mut start) {
                    child(i, f64::from_le_bytes(start), hold)
                } else {
                    2
                };
                // SAFETY: ends the child without running the parent's
                // exit handlers or flushing its buffers a second time.
                unsafe { libc::_exit(code) }
            }
            pid if pid > 0 => pids.push(pid),
            _ => {
                eprintln!("testkit hold-open: fork: {}", io::Error::last_os_error());
                break;
            }
        }
    }
    // Released together: every child reads its copy of the start time.
    let start = sys::monotonic_secs().to_le_bytes().repeat(pids.len());
    for chunk in start.chunks(libc::PIPE_BUF / 8 * 8) {
        // SAFETY: writes the chunk, alive across the call, to our pipe.
        unsafe { libc::write(wr, chunk.as_ptr().cast(), chunk.len()) };
    }
    // SAFETY: the parent's descriptors of the pipe, closed once.
    unsafe {
        libc::close(wr);
        libc::close(rd);
    }
    let mut failed = pids.len() < n;
    for pid in pids {
        let mut st = 0;
        // SAFETY: waits for a child this process forked.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        failed |= r < 0 || !libc::WIFEXITED(st) || libc::WEXITSTATUS(st) != 0;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
