//! What a hostile local user runs against a root mount
//! (docs/SEMANTICS.md, "Threat model"), as real processes of that user:
//!
//! - `testkit swap A B SECS`: renames A to B and back, as fast as it can,
//!   for SECS seconds; prints `swaps N`.
//! - `testkit create-race PATH SECS`: opens PATH with
//!   `O_RDWR|O_APPEND|O_CREAT` (no `O_EXCL`) again and again for SECS
//!   seconds; when an open hands it a file of another user it reads it,
//!   appends `breach` and prints `breach CONTENT`; at the end it prints
//!   `opened N` and the count of each errno (`EACCES 3 ESTALE 1`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::sys;

pub fn swap(a: &Path, b: &Path, secs: u64) -> ExitCode {
    let end = Instant::now() + Duration::from_secs(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        if std::fs::rename(a, b).is_ok() && std::fs::rename(b, a).is_ok() {
            n += 1;
        }
    }
    println!("swaps {n}");
    ExitCode::SUCCESS
}

pub fn create_race(path: &Path, secs: u64) -> ExitCode {
    let me = nix::unistd::getuid().as_raw();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut opened = 0u64;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    while Instant::now() < end {
        let flags = libc::O_RDWR | libc::O_APPEND | libc::O_CREAT;
        match sys::open_mode(path, flags, 0o600) {
            Ok(mut f) => {
                opened += 1;
                let theirs = f.metadata().is_ok_and(|m| m.uid() != me);
                if theirs {
                    let mut text = String::new();
                    let _ = f.read_to_string(&mut text);
                    let _ = f.write_all(b"breach\n");
                    let _ = sys::close(f);
                    println!("breach {}", text.trim());
                    return ExitCode::SUCCESS;
                }
                let _ = sys::close(f);
            }
            Err(e) => *errors.entry(sys::errno_name(&e)).or_default() += 1,
        }
    }
    let counts: Vec<String> = errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("opened {opened} {}", counts.join(" "));
    ExitCode::SUCCESS
}

/// `testkit hold-and-ask LEADER SOCK N TEMPLATE`: takes LEADER's write
/// lease (as an elector does: `O_WRONLY|O_APPEND|O_CREAT|O_NONBLOCK`),
/// then sends the control request TEMPLATE to SOCK N times, each on a
/// connection of its own, with `{epoch}` (the lease's epoch), `{pid}`
/// (this process), `{i}` (the request's number), `{child}` (a new child
/// process leading a session of its own, killed at the end) and `{pad:K}`
/// (K bytes of `x`) filled in. Prints how many answers began alike
/// (`COUNT ANSWER` per kind, the answer cut at 100 bytes), then `done`.
pub fn hold_and_ask(leader: &Path, sock: &Path, n: usize, template: &str) -> ExitCode {
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_NONBLOCK;
    let f = match sys::open_mode(leader, flags, 0o644) {
        Ok(f) => f,
        Err(e) => {
            println!("open {}", sys::errno_name(&e));
            return ExitCode::FAILURE;
        }
    };
    let epoch = match sys::ioctl_u64(&f, sys::IOC_EPOCH) {
        Ok(e) => e,
        Err(e) => {
            println!("epoch {}", sys::errno_name(&e));
            return ExitCode::FAILURE;
        }
    };
    let mut children = Vec::new();
    let mut answers: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..n {
        let mut req = template
            .replace("{epoch}", &epoch.to_string())
            .replace("{pid}", &std::process::id().to_string())
            .replace("{i}", &i.to_string());
        while let Some(at) = req.find("{pad:") {
            let end = req[at..].find('}').map_or(req.len(), |e| at + e);
            let k: usize = req[at + 5..end].parse().unwrap_or(0);
            req.replace_range(at..=end.min(req.len() - 1), &"x".repeat(k));
        }
        if req.contains("{child}") {
            match Command::new("setsid")
                .args(["sleep", "120"])
                .stdin(Stdio::null())
                .spawn()
            {
                Ok(c) => {
                    // `setsid` makes the session before it becomes sleep.
                    let pid = c.id();
                    let t0 = Instant::now();
                    while !leads_session(pid) && t0.elapsed() < Duration::from_secs(2) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    req = req.replace("{child}", &pid.to_string());
                    children.push(c);
                }
                Err(e) => {
                    println!("spawn {e}");
                    break;
                }
            }
        }
        let ask = || {
            UnixStream::connect(sock).and_then(|mut c| {
                c.write_all(format!("{req}\n").as_bytes())?;
                let mut line = String::new();
                BufReader::new(c).read_line(&mut line)?;
                Ok(line)
            })
        };
        // The daemon counts a connection of this user until it has seen
        // it end; one after another, faster than it notices, can meet the
        // bound of 4 at once. `leasefs` asks again then (cli::client), and
        // so does this caller: it tests the other bounds, not that one.
        let mut answer = ask();
        let mut tries = 0;
        while tries < 50
            && answer
                .as_ref()
                .is_ok_and(|l| l.contains("too many control connections"))
        {
            tries += 1;
            std::thread::sleep(Duration::from_millis(100));
            answer = ask();
        }
        let a = match answer {
            Ok(l) => l.trim().chars().take(100).collect(),
            Err(e) => format!("io {e}"),
        };
        *answers.entry(a).or_default() += 1;
    }
    for (a, count) in &answers {
        println!("{count} {a}");
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    drop(f);
    println!("done");
    ExitCode::SUCCESS
}

/// Whether process `pid` leads its own session (field 6 of its stat).
fn leads_session(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(3).map(str::to_string))
            .is_some_and(|sid| sid == pid.to_string())
    })
}

/// Pins the calling thread (and the threads it starts afterwards) to `cpu`:
/// over io_uring, FUSE queues a request on the ring of the caller's CPU.
fn pin(cpu: usize) -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(|e| format!("cpu {cpu}: {e}"))?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("pin to cpu {cpu}: {e}"))
}

/// `testkit pile PATH N CPU SECS`: N threads on CPU each open PATH for
/// appending (a file another writer holds: each open waits for the lease
/// as long as the mount lets it) and keep what they got for SECS seconds;
/// prints `opened K waiting W` and the count of each errno.
pub fn pile(path: &Path, n: usize, cpu: usize, secs: u64) -> ExitCode {
    if let Err(e) = pin(cpu) {
        eprintln!("testkit pile: {e}");
        return ExitCode::FAILURE;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..n {
        let (tx, path) = (tx.clone(), path.to_path_buf());
        let spawned = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                let r = sys::open_mode(&path, libc::O_WRONLY | libc::O_APPEND, 0o600);
                let _ = tx.send(r.as_ref().map(|_| ()).map_err(sys::errno_name));
                // Kept (open or not) until the process ends.
                std::thread::sleep(Duration::from_secs(3600));
                drop(r);
            });
        if let Err(e) = spawned {
            eprintln!("testkit pile: thread: {e}");
            return ExitCode::FAILURE;
        }
    }
    let end = Instant::now() + Duration::from_secs(secs);
    let (mut opened, mut answered) = (0usize, 0usize);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    while let Ok(r) = rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
        answered += 1;
        match r {
            Ok(()) => opened += 1,
            Err(e) => *errors.entry(e).or_default() += 1,
        }
    }
    let counts: Vec<String> = errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "opened {opened} waiting {} {}",
        n - answered,
        counts.join(" ")
    );
    let _ = std::io::stdout().flush();
    // Threads still in open(2) end with the process.
    std::process::exit(0)
}

/// `testkit probe DIR N CPU`: N lookups of names DIR does not have (each
/// a request the daemon must answer), one every 20 ms from CPU; prints
/// the slowest answer as `slowest_us U`.
pub fn probe(dir: &Path, n: usize, cpu: usize) -> ExitCode {
    if let Err(e) = pin(cpu) {
        eprintln!("testkit probe: {e}");
        return ExitCode::FAILURE;
    }
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let name = dir.join(format!(".probe-{}-{i}", std::process::id()));
        let t = Instant::now();
        let _ = std::fs::symlink_metadata(&name);
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("slowest_us {}", slowest.as_micros());
    ExitCode::SUCCESS
}

/// `testkit fsyncer PATH SECS`: the legitimate user beside an attack:
/// appends a numbered line and fsyncs it, again and again for SECS
/// seconds, through one descriptor; prints `lines N p50_us A p99_us B
/// max_us C` (each fsync's time).
pub fn fsyncer(path: &Path, secs: u64) -> ExitCode {
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT;
    let mut f = match sys::open_mode(path, flags, 0o600) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("testkit fsyncer: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let end = Instant::now() + Duration::from_secs(secs);
    let mut took = Vec::new();
    while Instant::now() < end {
        let line = format!("line {:08} {}\n", took.len(), "x".repeat(80));
        if let Err(e) = f.write_all(line.as_bytes()) {
            eprintln!("testkit fsyncer: write: {e}");
            return ExitCode::FAILURE;
        }
        let t = Instant::now();
        if let Err(e) = f.sync_all() {
            eprintln!("testkit fsyncer: fsync: {e}");
            return ExitCode::FAILURE;
        }
        took.push(t.elapsed());
    }
    if let Err(e) = sys::close(f) {
        eprintln!("testkit fsyncer: close: {e}");
        return ExitCode::FAILURE;
    }
    let n = took.len();
    took.sort();
    let at = |q: f64| took.get(((n as f64 * q) as usize).min(n.saturating_sub(1)));
    let us = |d: Option<&Duration>| d.map_or(0, |d| d.as_micros());
    println!(
        "lines {n} p50_us {} p99_us {} max_us {}",
        us(at(0.5)),
        us(at(0.99)),
        us(took.last())
    );
    ExitCode::SUCCESS
}
