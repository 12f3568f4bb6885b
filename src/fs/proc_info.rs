//! Facts about the process behind a request, read from /proc: the lease
//! holder's identity, whether a waiting opener has a signal pending
//! (fuser does not pass FUSE_INTERRUPT on, so Ctrl-C is noticed here), and
//! the credentials that decide whether setuid and setgid bits survive a
//! change (fuser does not pass SETATTR's `FATTR_KILL_SUIDGID` on, and FUSE
//! carries no supplementary groups).

/// Who a request comes from, as the lease holder is recorded.
#[derive(Debug, Clone, Default)]
pub struct Ident {
    /// Thread-group id: the process, whichever of its threads asked.
    pub tgid: u32,
    pub comm: String,
    /// Process group and session (election fencing); 0 when unknown.
    pub pgid: u32,
    pub sid: u32,
}

/// `/proc/<tid>/status` in one read: the file is about 1.5 KiB, and
/// `read_to_string` would read it in doubling pieces, eight system calls on
/// every write open. (Cheaper-looking ways for a main thread, pidfd_open
/// plus getpgid plus `comm`, measured 25 µs slower per open here.)
fn read_status(tid: u32) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(format!("/proc/{tid}/status")).ok()?;
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(n * 2, 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    buf.truncate(n);
    String::from_utf8(buf).ok()
}

/// How long a thread's identity is reused without reading /proc again.
const IDENT_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Recently read identities by thread id.
static IDENTS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<u32, (Ident, std::time::Instant)>>,
> = std::sync::LazyLock::new(Default::default);

/// Identity of thread `tid`. Generating `/proc/<tid>/status` was a third of
/// a write open's time in profiles, and a program opens many files in a
/// row: an identity read less than a second ago is reused as long as the
/// thread's process group is unchanged (one `getpgid`, a tenth of a
/// microsecond), since fencing goes by process group. A thread's process
/// never changes, and its id is not reused within a second; what may go
/// stale for that second is only the name a thread gives itself.
pub fn identity(tid: u32) -> Ident {
    let pgid = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(tid as i32)))
        .map(|p| p.as_raw() as u32)
        .ok();
    let mut cache = crate::sync::lock(&IDENTS);
    if let Some((id, at)) = cache.get(&tid)
        && at.elapsed() < IDENT_TTL
        && pgid == Some(id.pgid)
    {
        return id.clone();
    }
    drop(cache);
    let id = identity_from_status(tid);
    cache = crate::sync::lock(&IDENTS);
    if cache.len() >= 4096 {
        cache.retain(|_, (_, at)| at.elapsed() < IDENT_TTL);
        if cache.len() >= 4096 {
            cache.clear();
        }
    }
    if pgid.is_some() {
        cache.insert(tid, (id.clone(), std::time::Instant::now()));
    }
    id
}

/// Identity of thread `tid`, from one read of `/proc/<tid>/status`.
fn identity_from_status(tid: u32) -> Ident {
    let status = read_status(tid).unwrap_or_default();
    let mut id = Ident {
        tgid: tid,
        ..Ident::default()
    };
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("Tgid:") {
            id.tgid = v.trim().parse().unwrap_or(tid);
        } else if let Some(v) = line.strip_prefix("Name:") {
            id.comm = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("NSpgid:") {
            id.pgid = first_ns_value(v);
        } else if let Some(v) = line.strip_prefix("NSsid:") {
            id.sid = first_ns_value(v);
        }
    }
    id
}

/// The first of the values of an `NS...:` line: one per pid namespace,
/// ours (the outermost here) first.
fn first_ns_value(v: &str) -> u32 {
    v.split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// The credentials of a thread that the kernel's setgid rules look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Creds {
    /// Filesystem group id and supplementary groups.
    pub fsgid: u32,
    pub groups: Vec<u32>,
    /// CAP_FSETID in the effective set: the caller may keep setuid and
    /// setgid bits through changes.
    pub cap_fsetid: bool,
}

impl Creds {
    pub fn in_group(&self, gid: u32) -> bool {
        self.fsgid == gid || self.groups.contains(&gid)
    }
}

/// `CAP_FSETID` of linux/capability.h.
const CAP_FSETID: u32 = 4;

/// Credentials of thread `tid` (which is blocked in the request's system
/// call, so they cannot change meanwhile). A thread that is gone is in no
/// group and has no capability.
pub fn creds(tid: u32) -> Creds {
    let status = read_status(tid).unwrap_or_default();
    let mut c = Creds {
        fsgid: u32::MAX,
        ..Creds::default()
    };
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("Gid:") {
            // real, effective, saved, filesystem
            c.fsgid = v
                .split_whitespace()
                .nth(3)
                .and_then(|g| g.parse().ok())
                .unwrap_or(u32::MAX);
        } else if let Some(v) = line.strip_prefix("Groups:") {
            c.groups = v
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect();
        } else if let Some(v) = line.strip_prefix("CapEff:") {
            let caps = u64::from_str_radix(v.trim(), 16).unwrap_or(0);
            c.cap_fsetid = caps & (1 << CAP_FSETID) != 0;
        }
    }
    c
}

/// Signals whose default action neither ends the process nor interrupts
/// anything: a pending one of these does not cancel a waiting open unless
/// the program catches it (job control, SIGCHLD, SIGWINCH, SIGURG).
const HARMLESS_BY_DEFAULT: &[i32] = &[
    libc::SIGCHLD,
    libc::SIGCONT,
    libc::SIGSTOP,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGURG,
    libc::SIGWINCH,
];

/// True when thread `tid` has a pending signal that would interrupt a
/// blocking system call (one it catches, or one that kills it by default),
/// not blocked and not ignored; or when the thread is gone.
pub fn signal_pending(tid: u32) -> bool {
    let Some(status) = read_status(tid) else {
        return true;
    };
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let live = (field("SigPnd:") | field("ShdPnd:")) & !field("SigBlk:") & !field("SigIgn:");
    let harmless: u64 = HARMLESS_BY_DEFAULT.iter().map(|s| 1u64 << (s - 1)).sum();
    let interrupting = live & (field("SigCgt:") | !harmless);
    interrupting != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_of_another_thread_names_its_process() {
        let me = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::Builder::new()
            .name("idtest".into())
            .spawn(move || {
                tx.send(nix::unistd::gettid().as_raw() as u32).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(200));
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        assert_ne!(tid, me);
        let id = identity(tid);
        assert_eq!(id.tgid, me);
        assert_eq!(id.comm, "idtest");
        assert_eq!(id.pgid, nix::unistd::getpgrp().as_raw() as u32);
        t.join().unwrap();
    }

    #[test]
    fn a_cached_identity_follows_a_process_group_change() {
        // A child that moves to a group of its own between two lookups.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import os, time; time.sleep(0.3); os.setpgid(0, 0); time.sleep(5)",
            ])
            .spawn()
            .unwrap();
        let pid = child.id();
        let before = identity(pid);
        assert_eq!(before.pgid, nix::unistd::getpgrp().as_raw() as u32);
        assert_eq!(identity(pid).pgid, before.pgid);
        let p = nix::unistd::Pid::from_raw(pid as i32);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while nix::unistd::getpgid(Some(p)).unwrap() != p {
            assert!(std::time::Instant::now() < deadline, "child never moved");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let after = identity(pid);
        assert_eq!((after.pgid, after.tgid), (pid, pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn identity_of_this_process() {
        let id = identity(std::process::id());
        assert_eq!(id.tgid, std::process::id());
        assert!(!id.comm.is_empty());
        assert_eq!(id.pgid, nix::unistd::getpgrp().as_raw() as u32);
        let sid = nix::unistd::getsid(None).expect("getsid").as_raw() as u32;
        assert_eq!(id.sid, sid);
    }

    #[test]
    fn creds_of_this_process() {
        let c = creds(std::process::id());
        assert_eq!(c.fsgid, nix::unistd::getegid().as_raw());
        for g in nix::unistd::getgroups().unwrap() {
            assert!(c.in_group(g.as_raw()));
        }
        // CI runs as root, with every capability.
        assert_eq!(c.cap_fsetid, nix::unistd::geteuid().is_root());
        let gone = creds(u32::MAX - 7);
        assert!(!gone.in_group(0) && !gone.cap_fsetid);
    }

    #[test]
    fn own_thread_has_no_interrupting_signal() {
        assert!(!signal_pending(std::process::id()));
    }

    #[test]
    fn gone_thread_counts_as_interrupted() {
        assert!(signal_pending(u32::MAX - 7));
    }
}
