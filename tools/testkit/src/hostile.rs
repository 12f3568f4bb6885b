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
