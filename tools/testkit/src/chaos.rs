//! The processes of the pause-and-partition suite (tests/multi_daemon_chaos.rs).
//!
//! - `testkit tick EVENTS`: a leader's command that acts only outside the
//!   mount: `start ID EPOCH PID NS` once, then `tick ID EPOCH PID NS` every
//!   `--every-ms`, appended to EVENTS (NS: CLOCK_MONOTONIC, common to
//!   every process of the machine). Two terms' ticks must never overlap.
//!   `--ignore-term`: SIGTERM is ignored, so only the SIGKILL at the end
//!   of the grace stops it (the slowest command a leader can have).
//! - `testkit lines PATH ID --side FILE`: a writer of numbered lines
//!   `ID SEQ EPOCH` (fixed width), each appended with `O_APPEND`, then
//!   `fsync`ed; once the fsync succeeded it notes `ack ID SEQ OFFSET LEN
//!   EPOCH NS` in FILE (outside the mount). It reopens the file every few
//!   lines (from `--seed`), so that writers on several daemons take turns;
//!   `EBUSY` is retried, any other error noted (`fail ID SEQ ERRNO NS`) and
//!   the file opened again. A line starts a fresh line of the file: if
//!   the file does not end in `\n` (a fenced writer's torn tail), one is
//!   written first. Runs for `--for-ms`.

use std::fs::File;
use std::io::{self, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::sys;

fn append(path: &Path) -> io::Result<File> {
    sys::open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND)
}

pub fn tick(events: &Path, every: Duration, ignore_term: bool) -> ExitCode {
    if ignore_term {
        // SAFETY: installing SIG_IGN has no handler to be unsafe in.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let (id, epoch, pid) = (var("LEASEFS_ID"), var("LEASEFS_EPOCH"), std::process::id());
    let mut f = match append(events) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("testkit tick: {}: {e}", events.display());
            return ExitCode::from(2);
        }
    };
    let mut kind = "start";
    loop {
        // One write per line: lines of several processes never mix.
        let line = format!("{kind} {id} {epoch} {pid} {}\n", sys::monotonic_ns());
        if let Err(e) = f.write_all(line.as_bytes()) {
            eprintln!("testkit tick: {e}");
            return ExitCode::from(2);
        }
        kind = "tick";
        std::thread::sleep(every);
    }
}

/// A small xorshift generator: the writer's pace follows its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

pub struct Lines<'a> {
    pub path: &'a Path,
    pub id: &'a str,
    pub side: &'a Path,
    pub for_ms: u64,
    pub seed: u64,
}

pub fn lines(a: &Lines<'_>) -> ExitCode {
    let mut side = match append(a.side) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("testkit lines: {}: {e}", a.side.display());
            return ExitCode::from(2);
        }
    };
    let mut note = |s: String| {
        let _ = side.write_all(format!("{s} {}\n", sys::monotonic_ns()).as_bytes());
    };
    let mut rng = Rng(a.seed | 1);
    let end = Instant::now() + Duration::from_millis(a.for_ms);
    let mut seq: u64 = 0;
    while Instant::now() < end {
        let f = match sys::open(
            a.path,
            libc::O_RDWR | libc::O_CREAT | libc::O_APPEND | libc::O_NONBLOCK,
        ) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(5 + rng.below(20)));
                continue;
            }
            Err(e) => {
                note(format!("fail {} {seq} {}", a.id, sys::errno_name(&e)));
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let epoch = match sys::ioctl_u64(&f, sys::IOC_EPOCH) {
            Ok(e) => e,
            Err(e) => {
                note(format!("fail {} {seq} {}", a.id, sys::errno_name(&e)));
                let _ = sys::close(f);
                continue;
            }
        };
        note(format!("grant {} {epoch}", a.id));
        let turn = 1 + rng.below(12);
        let r = write_turn(&f, a.id, epoch, &mut seq, turn, end, &mut note, &mut rng);
        if let Err(e) = r {
            note(format!("fail {} {seq} {}", a.id, sys::errno_name(&e)));
        }
        if let Err(e) = sys::close(f) {
            note(format!("close {} {seq} {}", a.id, sys::errno_name(&e)));
        }
        std::thread::sleep(Duration::from_millis(rng.below(30)));
    }
    ExitCode::SUCCESS
}

/// Up to `turn` lines under one grant.
#[allow(clippy::too_many_arguments)]
fn write_turn(
    f: &File,
    id: &str,
    epoch: u64,
    seq: &mut u64,
    turn: u64,
    end: Instant,
    note: &mut dyn FnMut(String),
    rng: &mut Rng,
) -> io::Result<()> {
    let size = f.metadata()?.len();
    if size > 0 {
        let mut last = [0u8; 1];
        f.read_exact_at(&mut last, size - 1)?;
        if last[0] != b'\n' {
            (&*f).write_all(b"\n")?;
        }
    }
    for _ in 0..turn {
        if Instant::now() >= end {
            break;
        }
        *seq += 1;
        let line = format!("{id} {:08} {epoch:020}\n", *seq);
        (&*f).write_all(line.as_bytes())?;
        f.sync_all()?;
        // O_APPEND leaves the position at the end of what it wrote.
        let pos = (&*f).stream_position()?;
        let off = pos - line.len() as u64;
        note(format!("ack {id} {} {off} {} {epoch}", *seq, line.len()));
        std::thread::sleep(Duration::from_millis(rng.below(15)));
    }
    Ok(())
}
