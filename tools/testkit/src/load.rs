//! Many writer threads in one process:
//!
//! - `testkit writers N MIB`: N threads, each appending MIB MiB in 64 KiB
//!   writes (the bytes 0..=255 over and over) to a file of its own,
//!   `wNNN`; says `ok`, or the first error.
//! - `testkit contend PATH TAG THREADS GRANTS`: THREADS threads contending
//!   for one file, each looping: open PATH for append (a wait in the open
//!   with `lease_wait`; `EBUSY` or `EINTR`: try again after up to 0.2 ms),
//!   append one line `TAG`, close; they stop once PATH holds GRANTS lines
//!   (or after 90 s). Says how many opens this process won; another error
//!   ends it with status 1.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::sys;

fn append_open(path: &Path) -> io::Result<std::fs::File> {
    sys::open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND)
}

pub fn writers(n: usize, mib: usize) -> ExitCode {
    let buf: Vec<u8> = (0..=255u8).cycle().take(65536).collect();
    let first_error = Mutex::new(None::<String>);
    std::thread::scope(|s| {
        for i in 0..n {
            let (buf, first_error) = (&buf, &first_error);
            s.spawn(move || {
                let name = format!("w{i:03}");
                let r = append_open(Path::new(&name)).and_then(|mut f| {
                    (0..mib * 16).try_for_each(|_| f.write_all(buf))?;
                    sys::close(f)
                });
                if let Err(e) = r {
                    let mut g = first_error.lock().unwrap_or_else(|e| e.into_inner());
                    g.get_or_insert(format!("{name}: {e}"));
                }
            });
        }
    });
    let said = first_error
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or_else(|| "ok".into());
    println!("{said}");
    ExitCode::SUCCESS
}

/// A pause of up to 0.2 ms, different in each thread and each time.
fn backoff(state: &mut u64) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    std::thread::sleep(Duration::from_nanos(*state % 200_000));
}

pub fn contend(path: &Path, tag: &str, threads: usize, grants: u64) -> ExitCode {
    let line = format!("{tag}\n");
    let wins = AtomicUsize::new(0);
    let failure = Mutex::new(None::<String>);
    let deadline = Instant::now() + Duration::from_secs(90);
    let done = || {
        Instant::now() > deadline
            || std::fs::metadata(path).is_ok_and(|m| m.len() >= grants * line.len() as u64)
    };
    std::thread::scope(|s| {
        for t in 0..threads {
            let (line, wins, failure, done) = (&line, &wins, &failure, &done);
            s.spawn(move || {
                let mut state =
                    (sys::monotonic_ns() ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
                while !done() && lock(failure).is_none() {
                    let mut f = match append_open(path) {
                        Ok(f) => f,
                        Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EINTR)) => {
                            backoff(&mut state);
                            continue;
                        }
                        Err(e) => {
                            lock(failure).get_or_insert(format!("open: {e}"));
                            return;
                        }
                    };
                    let r = f.write_all(line.as_bytes());
                    if let Err(e) = r.and_then(|()| sys::close(f)) {
                        lock(failure).get_or_insert(format!("append: {e}"));
                        return;
                    }
                    wins.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    if let Some(why) = lock(&failure).take() {
        eprintln!("testkit contend {}: {why}", path.display());
        return ExitCode::FAILURE;
    }
    println!("{}", wins.load(Ordering::Relaxed));
    ExitCode::SUCCESS
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
