//! `testkit term JOURNAL`: a leader's command for the election tests
//! (run by `leasefs elect`, which gives it `LEASEFS_EPOCH` and
//! `LEASEFS_ID`). It appends `EPOCH ID` to the shared JOURNAL on the mount
//! every 50 ms, opening it for each line and retrying every 10 ms on
//! `EBUSY` (the previous term's command may still be closing it), forever
//! or `--lines N` times.
//!
//! - `--own DIR`: it also keeps `DIR/own-ID-EPOCH` open for the whole term
//!   and writes to it before each line: the old descriptor that fencing
//!   must stop.
//! - `--status FILE` (outside the mount): any other error is appended
//!   there as `EPOCH ID ERRNO_NAME`, and the command exits with status 3.
//! - `--events FILE` (outside the mount): `start ID EPOCH PID NS` when it
//!   starts, `tick ID EPOCH PID NS` after each line it got into the
//!   journal, `error ID EPOCH PID NS ERRNO_NAME` before exiting with 3;
//!   NS is CLOCK_MONOTONIC, common to every process of the machine.
//!
//! A close of the journal that fails ends it with status 1, unrecorded.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::sys;

pub struct Term {
    pub journal: PathBuf,
    pub lines: u64,
    pub own: Option<PathBuf>,
    pub status: Option<PathBuf>,
    pub events: Option<PathBuf>,
}

fn append_open(path: &Path) -> io::Result<std::fs::File> {
    sys::open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND)
}

/// Appends one line to a file outside the mount, opened for it.
fn append_line(path: &Path, line: &str) {
    if let Err(e) = append_open(path).and_then(|mut f| f.write_all(line.as_bytes())) {
        eprintln!("testkit term: {}: {e}", path.display());
    }
}

struct Ctx<'a> {
    t: &'a Term,
    epoch: String,
    id: String,
}

impl Ctx<'_> {
    fn event(&self, kind: &str, extra: &str) {
        if let Some(p) = &self.t.events {
            let line = format!(
                "{kind} {} {} {} {}{extra}\n",
                self.id,
                self.epoch,
                std::process::id(),
                sys::monotonic_ns()
            );
            append_line(p, &line);
        }
    }

    fn fail(&self, e: &io::Error) -> ExitCode {
        let name = sys::errno_name(e);
        self.event("error", &format!(" {name}"));
        if let Some(p) = &self.t.status {
            append_line(p, &format!("{} {} {name}\n", self.epoch, self.id));
        }
        ExitCode::from(3)
    }
}

pub fn run(t: &Term) -> ExitCode {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let c = Ctx {
        t,
        epoch: var("LEASEFS_EPOCH"),
        id: var("LEASEFS_ID"),
    };
    c.event("start", "");
    let mut own = match &t.own {
        Some(dir) => match append_open(&dir.join(format!("own-{}-{}", c.id, c.epoch))) {
            Ok(f) => Some(f),
            Err(e) => return c.fail(&e),
        },
        None => None,
    };
    let line = format!("{} {}\n", c.epoch, c.id);
    let mut n = 0;
    while t.lines == 0 || n < t.lines {
        if let Some(Err(e)) = own.as_mut().map(|f| f.write_all(b"x\n")) {
            return c.fail(&e);
        }
        let mut f = match append_open(&t.journal) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => return c.fail(&e),
        };
        if let Err(e) = f.write_all(line.as_bytes()) {
            drop(f);
            return c.fail(&e);
        }
        if let Err(e) = sys::close(f) {
            eprintln!("testkit term: close {}: {e}", t.journal.display());
            return ExitCode::FAILURE;
        }
        n += 1;
        c.event("tick", "");
        std::thread::sleep(Duration::from_millis(50));
    }
    ExitCode::SUCCESS
}
