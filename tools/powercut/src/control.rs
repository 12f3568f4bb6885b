//! The control socket: one command line in, one reply line out
//! (`ok ...` or `error ...`). Commands: `cut [subset SEED]`, `fail DIR ERRNO [sync]`,
//! `slow DIR MILLIS`, `heal [DIR]`, `commit-namespace`, `status`.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::nodes::Shared;

/// Errors a fault may inject, by name.
const ERRNOS: &[(&str, i32)] = &[
    ("ENOSPC", libc::ENOSPC),
    ("EIO", libc::EIO),
    ("EDQUOT", libc::EDQUOT),
    ("EROFS", libc::EROFS),
];

/// Serves `sock` on a thread of its own until the process ends.
pub fn serve(sock: &Path, shared: Arc<Shared>) -> io::Result<()> {
    let _ = std::fs::remove_file(sock);
    let listener = UnixListener::bind(sock)?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                if let Err(e) = answer(conn, &shared) {
                    eprintln!("powercut: control connection: {e}");
                }
            }
        })?;
    Ok(())
}

fn answer(conn: UnixStream, shared: &Shared) -> io::Result<()> {
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let reply = run(line.trim(), shared);
    (&conn).write_all(format!("{reply}\n").as_bytes())
}

fn run(cmd: &str, shared: &Shared) -> String {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    match words.as_slice() {
        ["cut"] | ["cut", "subset", _] => {
            let subset = match words.get(2).map(|w| w.parse::<u64>()) {
                None => None,
                Some(Ok(seed)) => Some(crate::journal::Subset::new(seed)),
                Some(Err(_)) => return format!("error bad seed {:?}", words[2]),
            };
            let r = shared.cut(subset);
            let mut msg = format!(
                "dropped {} namespace changes and the unsynced data of {} files ({} durable bytes put back)",
                r.namespace_changes, r.files, r.bytes_restored
            );
            if let Some(seed) = words.get(2) {
                msg.push_str(&format!(
                    "; {} pending sectors kept (subset {seed})",
                    r.sectors_kept
                ));
            }
            eprintln!("powercut: power cut: {msg}");
            if r.errors.is_empty() {
                format!("ok {msg}")
            } else {
                format!("error {msg}; {}", r.errors.join("; "))
            }
        }
        ["fail", dir, name, rest @ ..] if rest.is_empty() || rest == ["sync"] => {
            match ERRNOS.iter().find(|(n, _)| n == name) {
                Some((_, e)) => {
                    let only_sync = !rest.is_empty();
                    shared
                        .faults
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(OsString::from(dir), (*e, only_sync));
                    let what = if only_sync { "fsyncs" } else { "changes" };
                    format!("ok {what} under {dir} fail with {name}")
                }
                None => format!("error unknown errno {name}"),
            }
        }
        ["slow", dir, ms] => match ms.parse::<u64>() {
            Ok(ms) => {
                shared
                    .slow
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(OsString::from(dir), Duration::from_millis(ms));
                format!("ok writes under {dir} are answered {ms} ms late")
            }
            Err(_) => format!("error bad milliseconds {ms}"),
        },
        ["commit-namespace"] => {
            let n = shared.journal.commit_namespace();
            format!("ok {n} namespace changes made durable")
        }
        ["heal"] => {
            shared
                .faults
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
            shared
                .slow
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
            "ok no faults".into()
        }
        ["heal", dir] => {
            let dir = OsString::from(dir);
            shared
                .faults
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&dir);
            shared
                .slow
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&dir);
            format!("ok {} healed", dir.to_string_lossy())
        }
        ["status"] => {
            let (ops, files) = shared.journal.status();
            let cut = *shared.cut.read().unwrap_or_else(|e| e.into_inner());
            format!(
                "ok power {} pending {ops} namespace changes, {files} files with unsynced data",
                if cut { "cut" } else { "on" }
            )
        }
        _ => format!("error unknown command '{cmd}'"),
    }
}

/// Sends one command to the daemon at `sock`; returns its reply line.
pub fn send(sock: &Path, cmd: &str) -> io::Result<String> {
    let conn = UnixStream::connect(sock)?;
    (&conn).write_all(format!("{cmd}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    Ok(line.trim_end().to_string())
}
