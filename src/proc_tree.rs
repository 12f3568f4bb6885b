//! The process tree of an election term's command: its session, and a
//! cgroup (v2) of its own where the machine allows one. How to find every
//! process of such a tree, signal them all, and tell when none is left.
//!
//! The elector starts the command as a session leader (`setsid`), so that
//! whatever it forks, even a child that makes a process group of its own
//! (a job-control shell), stays in the session; where it can, it also moves
//! the command into a fresh cgroup, which even a process that leaves the
//! session (`setsid`, daemonizing) cannot leave without privileges. The
//! daemon stops what is left of a term whose elector died, with the same
//! code (docs/SEMANTICS.md, "Fencing").
//!
//! Process numbers are reused: a session id names the command's tree only
//! while some process of it lives. [`Tree::is_ours`] is the rule that
//! tells a tree from a later one that reuses the number, and every signal
//! goes through a pidfd of the process found (see `Tree::signal_members`),
//! so that the daemon, which runs as root, never signals a process that
//! took a member's number after `/proc` was read.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Prefix of the cgroups made for commands; a fence request naming any
/// other cgroup is refused, so that the daemon only ever kills these.
pub const CGROUP_PREFIX: &str = "leasefs-elect.";

/// What `/proc/PID/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pgid: u32,
    pub sid: u32,
    /// Clock ticks after boot at which the process started.
    pub start_ticks: u64,
    /// Exited but not reaped: it can do nothing more.
    pub zombie: bool,
    /// Stopped (SIGSTOP, or traced).
    pub stopped: bool,
}

/// `/proc/PID/stat`, or `None` if there is no such process.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<Stat> {
    // The command name may hold spaces and parentheses: fields start
    // after the last ')'. Field 3 is the state; pgid, sid and starttime
    // are fields 5, 6 and 22.
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = *f.first()?;
    Some(Stat {
        zombie: state == "Z",
        stopped: state == "T" || state == "t",
        pgid: f.get(2)?.parse().ok()?,
        sid: f.get(3)?.parse().ok()?,
        start_ticks: f.get(19)?.parse().ok()?,
    })
}

/// This boot's id: process numbers and start times mean nothing across
/// reboots.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The cgroup (v2) of a process, as `/proc/PID/cgroup` names it
/// (`/a/b`, relative to the cgroup2 mount).
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// Where cgroup2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on hybrid hosts), if anywhere.
pub fn cgroup2_root() -> Option<&'static Path> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        info.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            if right.split(' ').next()? != "cgroup2" {
                return None;
            }
            left.split(' ').nth(4).map(PathBuf::from)
        })
    })
    .as_deref()
}

/// The directory of cgroup `rel` (as `/proc/PID/cgroup` names it).
fn cgroup_dir(rel: &str) -> Option<PathBuf> {
    Some(cgroup2_root()?.join(rel.trim_start_matches('/')))
}

/// Whether `rel` names a cgroup made for a command: only those are killed.
pub fn is_command_cgroup(rel: &str) -> bool {
    rel.rsplit('/')
        .next()
        .is_some_and(|last| last.starts_with(CGROUP_PREFIX))
        && !rel.split('/').any(|c| c == "..")
}

/// Makes a cgroup `NAME` under this process's own cgroup, for a command;
/// `None` (and the reason, for the log) where cgroup2 is missing or not
/// writable here.
pub fn create_cgroup(name: &str) -> Result<String, String> {
    let root = cgroup2_root().ok_or("no cgroup2 mount")?;
    let own = cgroup_of(std::process::id()).ok_or("no cgroup2 membership")?;
    let rel = format!("{}/{name}", own.trim_end_matches('/'));
    let dir = root.join(rel.trim_start_matches('/'));
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(rel)
}

/// Moves process `pid` into cgroup `rel`.
pub fn move_to_cgroup(rel: &str, pid: u32) -> io::Result<()> {
    let dir = cgroup_dir(rel).ok_or_else(|| io::Error::other("no cgroup2 mount"))?;
    std::fs::write(dir.join("cgroup.procs"), pid.to_string())
}

/// Removes the (empty) cgroup `rel`; a cgroup that is gone already is fine.
pub fn remove_cgroup(rel: &str) -> io::Result<()> {
    let Some(dir) = cgroup_dir(rel) else {
        return Ok(());
    };
    match std::fs::remove_dir(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Removes the empty command cgroups of electors that are gone (killed
/// along with their daemon, so that nobody removed them), beside this
/// process's own cgroup.
pub fn remove_stale_cgroups() {
    let (Some(root), Some(own)) = (cgroup2_root(), cgroup_of(std::process::id())) else {
        return;
    };
    let Ok(dir) = std::fs::read_dir(root.join(own.trim_start_matches('/'))) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(CGROUP_PREFIX)) else {
            continue;
        };
        let elector = rest.split('.').next().and_then(|p| p.parse::<u32>().ok());
        if elector.is_some_and(|p| stat(p).is_none_or(|s| s.zombie)) {
            // Fails (EBUSY) while a process is left in it: then it stays.
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// Every live process in `/proc` whose session is `sid`.
fn session_members(sid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|s| s.sid == sid && !s.zombie))
        .collect()
}

/// A process held by a pidfd: a signal sent through it reaches that very
/// process, or nobody once it has exited, never a later process that took
/// its number. (nix has no pidfd calls: the system calls themselves.)
struct Pinned(std::os::fd::OwnedFd);

impl Pinned {
    fn open(pid: u32) -> nix::Result<Pinned> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open(2) takes a pid and flags (none) and returns a
        // new descriptor or -1 with errno set; nothing is borrowed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(nix::errno::Errno::last());
        }
        // SAFETY: a descriptor the kernel just made, owned by nobody else.
        Ok(Pinned(unsafe {
            std::os::fd::OwnedFd::from_raw_fd(fd as i32)
        }))
    }

    fn signal(&self, sig: nix::sys::signal::Signal) -> nix::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal(2) on a pidfd this value owns, with a
        // valid signal number, no siginfo (null, as kill(2) would send)
        // and no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig as libc::c_int,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return Err(nix::errno::Errno::last());
        }
        Ok(())
    }
}

/// One term's command and everything it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// The command's pid: its process group and its session.
    pub leader: u32,
    /// The leader's start time ([`Stat::start_ticks`]).
    pub start_ticks: u64,
    /// Its cgroup, if it got one.
    pub cgroup: Option<String>,
}

impl Tree {
    /// Whether the session `leader` still is this tree's, and not a later
    /// session that reuses the number. A live leader must be the same
    /// process (same start time). Without a leader, processes of the
    /// session are this tree's orphans: the number could only have been
    /// reused if every process of the session had gone, and then the new
    /// session's own leader would be alive (or its orphans would have
    /// been created after a reuse that happened while this tree had
    /// none: the tree was gone anyway).
    pub fn is_ours(&self) -> bool {
        match stat(self.leader) {
            Some(s) => s.start_ticks == self.start_ticks,
            None => true,
        }
    }

    /// The live processes of the tree: the session's (while it is ours)
    /// and the cgroup's.
    pub fn members(&self) -> Vec<u32> {
        let mut v = if self.is_ours() {
            session_members(self.leader)
        } else {
            Vec::new()
        };
        if let Some(dir) = self.cgroup.as_deref().and_then(cgroup_dir)
            && let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs"))
        {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if !v.contains(&pid) && stat(pid).is_some_and(|s| !s.zombie) {
                    v.push(pid);
                }
            }
        }
        v
    }

    /// True once no process of the tree is left (zombies do not count).
    pub fn gone(&self) -> bool {
        self.members().is_empty()
    }

    /// Sends `sig` to every process of the tree.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        self.signal_members(sig, &|| ());
    }

    /// Sends `sig` to every member found, through a pidfd of each:
    /// `between` runs after the members are found and pinned and before
    /// they are signalled (where a test makes a member's number pass to
    /// another process). Returns how many were signalled.
    ///
    /// A number read from `/proc` names a process only until that process
    /// is reaped; `kill(pid)` sent later may reach whatever process took
    /// the number since, and the daemon runs as root. So each member is
    /// pinned first (`pidfd_open`), then checked to be a member still (a
    /// number reused before the pinning pins the newcomer, which must be a
    /// member to stay), and signalled through the pidfd, which reaches
    /// that process or, once it has exited, nobody.
    fn signal_members(&self, sig: nix::sys::signal::Signal, between: &dyn Fn()) -> usize {
        let pinned: Vec<(u32, Option<Pinned>)> = self
            .members()
            .into_iter()
            .filter_map(|pid| match Pinned::open(pid) {
                Ok(p) => self.is_member(pid).then_some((pid, Some(p))),
                Err(nix::errno::Errno::ENOSYS) => Some((pid, None)),
                Err(_) => None,
            })
            .collect();
        between();
        pinned
            .into_iter()
            .filter(|(pid, p)| match p {
                Some(p) => p.signal(sig).is_ok(),
                // A kernel without pidfds (before 5.3): the member is
                // checked again right before the signal, which leaves a
                // window where the number may change hands.
                None => {
                    self.is_member(*pid)
                        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), sig)
                            .is_ok()
                }
            })
            .count()
    }

    /// Whether `pid` is a live process of the tree: of its session (while
    /// the session is this tree's) or of its cgroup.
    fn is_member(&self, pid: u32) -> bool {
        let Some(st) = stat(pid).filter(|s| !s.zombie) else {
            return false;
        };
        (st.sid == self.leader && self.is_ours())
            || self
                .cgroup
                .as_deref()
                .is_some_and(|cg| cgroup_of(pid).as_deref() == Some(cg))
    }

    /// Kills the whole tree: `cgroup.kill` where there is a cgroup (the
    /// kernel kills every member, including any forked meanwhile), and
    /// SIGKILL to every member found, a few rounds, for what forks while
    /// the session is walked. Returns whether the tree is gone.
    pub fn kill(&self) -> bool {
        if let Some(dir) = self.cgroup.as_deref().and_then(cgroup_dir) {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        }
        for _ in 0..20 {
            if self.signal_members(nix::sys::signal::Signal::SIGKILL, &|| ()) == 0 && self.gone() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.gone()
    }

    /// Removes the tree's cgroup once it is empty.
    pub fn remove_cgroup(&self) {
        if let Some(rel) = &self.cgroup
            && let Err(e) = remove_cgroup(rel)
        {
            tracing::debug!(cgroup = %rel, "cannot remove the command's cgroup yet: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_odd_command_names() {
        let s =
            parse_stat("42 (a) b (c)) S 1 40 41 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 9876 0 0")
                .expect("parse");
        assert_eq!(
            s,
            Stat {
                pgid: 40,
                sid: 41,
                start_ticks: 9876,
                zombie: false,
                stopped: false,
            }
        );
        let me = stat(std::process::id()).expect("own stat");
        assert_eq!(me.pgid, nix::unistd::getpgrp().as_raw() as u32);
        assert!(!me.zombie);
    }

    #[test]
    fn cgroups_of_dead_electors_are_removed_and_live_ones_kept() {
        // An elector that is gone: a child that has exited and been reaped.
        let dead = std::process::Command::new("true")
            .spawn()
            .and_then(|mut c| c.wait().map(|_| c.id()))
            .expect("spawn true");
        let stale = format!("{CGROUP_PREFIX}{dead}.1");
        let live = format!("{CGROUP_PREFIX}{}.1", std::process::id());
        let (Ok(stale_rel), Ok(live_rel)) = (create_cgroup(&stale), create_cgroup(&live)) else {
            eprintln!("no writable cgroup2 here: nothing to check");
            return;
        };
        remove_stale_cgroups();
        let stale_gone = !cgroup_dir(&stale_rel).expect("dir").exists();
        let live_kept = cgroup_dir(&live_rel).expect("dir").exists();
        let _ = remove_cgroup(&stale_rel);
        let _ = remove_cgroup(&live_rel);
        assert!(stale_gone, "the cgroup of a dead elector was left behind");
        assert!(live_kept, "the cgroup of a live elector was removed");
    }

    #[test]
    fn only_command_cgroups_may_be_killed() {
        assert!(is_command_cgroup("/leasefs-elect.12.3"));
        assert!(is_command_cgroup("/user.slice/leasefs-elect.1.1"));
        assert!(!is_command_cgroup("/system.slice"));
        assert!(!is_command_cgroup("/leasefs-elect.1/../system.slice"));
        assert!(!is_command_cgroup(""));
    }

    #[test]
    fn a_session_and_its_orphans_are_found_and_killed() {
        use std::process::Command;
        // A session whose leader leaves a background child behind.
        let c = Command::new("setsid")
            .args(["sh", "-c", "sleep 30 >/dev/null & echo $!; exit 0"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("setsid");
        let leader = c.id();
        let start = stat(leader).map(|s| s.start_ticks).unwrap_or(0);
        let out = c.wait_with_output().expect("wait");
        let orphan: u32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("orphan pid");
        let tree = Tree {
            leader,
            start_ticks: start,
            cgroup: None,
        };
        // The leader exited (reaped): its orphan is still the tree's.
        assert!(tree.is_ours());
        assert_eq!(tree.members(), vec![orphan]);
        // A tree whose leader number now belongs to another process is
        // not ours (here: this process, with another start time).
        let me = std::process::id();
        let other = Tree {
            leader: me,
            start_ticks: stat(me).expect("stat").start_ticks + 1,
            cgroup: None,
        };
        assert!(!other.is_ours() && other.members().is_empty());
        assert!(tree.kill(), "the orphan survived");
        assert!(tree.gone());
    }

    /// The daemon signals the processes of a term's tree that it found in
    /// `/proc`; one of them may exit, and its number go to an unrelated
    /// process, before the signal is sent. The signal must reach the
    /// process that was found, or nobody: never the one that took its
    /// number. (The number is handed on through `ns_last_pid`, so this
    /// needs root.)
    #[test]
    fn a_signal_never_reaches_a_process_that_took_a_members_number() {
        use std::process::{Child, Command};
        use std::sync::Mutex;
        use std::time::{Duration, Instant};
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (ns_last_pid): nothing checked");
            return;
        }
        // A session of one process: `setsid` (not a group leader here)
        // makes the session and becomes `sleep`.
        let member = Command::new("setsid")
            .args(["sleep", "30"])
            .spawn()
            .expect("setsid");
        let pid = member.id();
        let t0 = Instant::now();
        while stat(pid).is_none_or(|s| s.sid != pid) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the member never led its session"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let tree = Tree {
            leader: pid,
            start_ticks: stat(pid).expect("stat").start_ticks,
            cgroup: None,
        };
        let member = Mutex::new(Some(member));
        let decoy: Mutex<Option<Child>> = Mutex::new(None);
        tree.signal_members(nix::sys::signal::Signal::SIGKILL, &|| {
            // The member exits and is reaped; a new process takes its number.
            if let Some(mut m) = member.lock().expect("lock").take() {
                let _ = m.kill();
                let _ = m.wait();
            }
            for _ in 0..2000 {
                let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string());
                let mut d = Command::new("sleep").arg("30").spawn().expect("sleep");
                if d.id() == pid {
                    *decoy.lock().expect("lock") = Some(d);
                    return;
                }
                let _ = d.kill();
                let _ = d.wait();
            }
        });
        let mut decoy = decoy
            .lock()
            .expect("lock")
            .take()
            .expect("no process took the member's number");
        let t0 = Instant::now();
        let mut killed = None;
        while t0.elapsed() < Duration::from_millis(500) && killed.is_none() {
            killed = decoy.try_wait().expect("wait");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = decoy.kill();
        let _ = decoy.wait();
        assert_eq!(
            killed, None,
            "the process that took the member's number was killed"
        );
    }
}
