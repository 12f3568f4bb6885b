//! Facts about the process behind a request, read from /proc: the lease
//! holder's identity, and whether a waiting opener has a signal pending
//! (fuser does not pass FUSE_INTERRUPT on, so Ctrl-C is noticed here).

/// Thread-group id and process name of the thread `tid`.
pub fn identity(tid: u32) -> (u32, String) {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
    let mut tgid = tid;
    let mut comm = String::new();
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("Tgid:") {
            tgid = v.trim().parse().unwrap_or(tid);
        } else if let Some(v) = line.strip_prefix("Name:") {
            comm = v.trim().to_string();
        }
    }
    (tgid, comm)
}

/// Process group of `pid` (0 when unknown).
pub fn pgid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised name: state ppid pgrp ...
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// True when thread `tid` has an unblocked signal pending, or is gone.
pub fn signal_pending(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true;
    };
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = field("SigPnd:") | field("ShdPnd:");
    pending & !field("SigBlk:") != 0
}
