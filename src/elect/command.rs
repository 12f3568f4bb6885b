//! The leader's command (takeLeadership): started as the leader of a
//! session of its own (and, where the machine allows, in a cgroup of its
//! own), fenced by the daemon before it runs a single instruction, killed
//! with its elector, and stopped as a whole tree when the term ends.
//!
//! Why not `std::process::Command`: its `spawn` returns only after `exec`,
//! so the command would run before its tree is registered with the daemon,
//! and a leader paused in that gap could leave a command writing unfenced.
//! Here the child is forked, makes itself a session leader (`setsid`: its
//! process group and session are its pid, and everything it forks stays
//! in the session, even in process groups of its own), asks for `SIGKILL`
//! when its parent dies, closes its copy of the election file's
//! descriptor, says it is ready, and then waits on a pipe; the parent
//! moves it into a cgroup, registers the fence (and writes the term's
//! record) and only then lets it `exec`.
//!
//! What escapes (docs/SEMANTICS.md, "Fencing"): a process that leaves the
//! session (`setsid`, daemonizing) is no longer fenced by its session; in
//! a cgroup it is still fenced and stopped with the term, and only a
//! process that also moves itself out of the cgroup (which takes
//! privileges) escapes both.

use std::ffi::{CString, OsStr, OsString};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use crate::proc_tree::{self, Tree};
use crate::sync::{AtomicU64, Ordering};

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    /// The shell's convention: the code, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit status {c}"),
            Exit::Signal(s) => match Signal::try_from(*s) {
                Ok(sig) => write!(f, "killed by {sig}"),
                Err(_) => write!(f, "killed by signal {s}"),
            },
        }
    }
}

/// Why a command did not start.
#[derive(Debug)]
pub enum SpawnError {
    /// The program is not an executable file (nothing was forked).
    NotFound(String),
    /// The fence could not be registered; the child was discarded unrun.
    Fence(String),
    /// fork, pipe or exec failed.
    Os(io::Error),
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnError::NotFound(p) => write!(f, "{p}: no such executable in PATH"),
            SpawnError::Fence(e) => write!(f, "cannot fence its process group: {e}"),
            SpawnError::Os(e) => write!(f, "{e}"),
        }
    }
}

/// A started command and its tree; its pid is also its process group and
/// its session.
#[derive(Debug)]
pub struct Running {
    pid: Pid,
    tree: Tree,
    exit: Option<Exit>,
}

/// Names the cgroups of this elector's commands apart.
static CGROUPS: AtomicU64 = AtomicU64::new(0);

/// Starts `argv` with `env` added to this process's environment, as the
/// leader of a new session, in a cgroup of its own where one can be made.
/// The child closes `close_fd` (the election file) at once, and runs
/// nothing of the command before `before_exec(tree)` has returned `Ok`.
///
/// Must be called from a thread that lives as long as the command should:
/// the kernel's parent-death signal follows the thread that forked.
pub fn spawn(
    argv: &[OsString],
    env: &[(&str, String)],
    close_fd: RawFd,
    before_exec: impl FnOnce(&Tree) -> Result<(), String>,
) -> Result<Running, SpawnError> {
    let Some(program) = argv.first() else {
        return Err(SpawnError::NotFound(String::new()));
    };
    let path = resolve(program)
        .ok_or_else(|| SpawnError::NotFound(program.to_string_lossy().into_owned()))?;
    // Everything the child needs is built before fork: after fork it may
    // only make async-signal-safe calls (no allocation).
    let cstr =
        |s: &OsStr| CString::new(s.as_bytes()).map_err(|e| SpawnError::Os(io::Error::other(e)));
    let prog = cstr(path.as_os_str())?;
    let args: Vec<CString> = argv.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
    let mut vars: Vec<CString> = Vec::new();
    for (k, v) in std::env::vars_os() {
        if env.iter().any(|(name, _)| OsStr::new(name) == k) {
            continue;
        }
        let mut kv = k.into_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        vars.push(cstr(OsStr::from_bytes(&kv))?);
    }
    for (k, v) in env {
        vars.push(cstr(OsStr::new(&format!("{k}={v}")))?);
    }
    let argp: Vec<*const libc::c_char> = args
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp: Vec<*const libc::c_char> = vars
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();

    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    let os = |e: Errno| SpawnError::Os(e.into());
    let (go_r, go_w) = nix::unistd::pipe2(cloexec).map_err(os)?;
    let (err_r, err_w) = nix::unistd::pipe2(cloexec).map_err(os)?;
    let (ready_r, ready_w) = nix::unistd::pipe2(cloexec).map_err(os)?;
    let parent = nix::unistd::getpid().as_raw();
    let fds = ChildFds {
        close: close_fd,
        go_r: go_r.as_raw_fd(),
        go_w: go_w.as_raw_fd(),
        err_w: err_w.as_raw_fd(),
        ready_w: ready_w.as_raw_fd(),
    };
    // SAFETY: the child branch only makes async-signal-safe system calls on
    // memory prepared above and always ends in execve or _exit.
    let child = match unsafe { nix::unistd::fork() } {
        Err(e) => return Err(SpawnError::Os(e.into())),
        Ok(ForkResult::Child) => unsafe { child_exec(parent, &fds, &prog, &argp, &envp) },
        Ok(ForkResult::Parent { child }) => child,
    };
    drop(go_r);
    drop(err_w);
    drop(ready_w);
    let mut running = Running {
        pid: child,
        tree: Tree {
            leader: child.as_raw() as u32,
            start_ticks: 0,
            cgroup: None,
        },
        exit: None,
    };
    // The child has made its session and closed the election file once it
    // says so; EOF means it died first.
    if read_full(&ready_r, 1) != 1 {
        running.reap_blocking();
        return Err(SpawnError::Os(io::Error::other(
            "the command's process ended before it could start",
        )));
    }
    running.tree.start_ticks = proc_tree::stat(running.tree.leader)
        .map(|s| s.start_ticks)
        .unwrap_or(0);
    running.tree.cgroup = own_cgroup(running.tree.leader);
    if let Err(e) = before_exec(&running.tree) {
        drop(go_w); // the child reads EOF and leaves without running anything
        running.reap_blocking();
        running.tree.remove_cgroup();
        return Err(SpawnError::Fence(e));
    }
    if let Err(e) = nix::unistd::write(&go_w, &[1u8]) {
        running.tree.kill();
        running.reap_blocking();
        running.tree.remove_cgroup();
        return Err(SpawnError::Os(e.into()));
    }
    drop(go_w);
    // EOF: exec succeeded (the pipe was close-on-exec); 4 bytes: its errno.
    let mut buf = [0u8; 4];
    if read_into(&err_r, &mut buf) == 4 {
        running.reap_blocking();
        running.tree.remove_cgroup();
        return Err(SpawnError::Os(io::Error::from_raw_os_error(
            i32::from_ne_bytes(buf),
        )));
    }
    Ok(running)
}

/// A cgroup of its own for the command `pid`, where this machine lets the
/// elector make one (cgroup2 mounted and writable); `None` otherwise (said
/// once in the log: the session alone then holds the tree).
fn own_cgroup(pid: u32) -> Option<String> {
    static NOTED: std::sync::Once = std::sync::Once::new();
    let n = CGROUPS.fetch_add(1, Ordering::Relaxed);
    let name = format!("{}{}.{n}", proc_tree::CGROUP_PREFIX, std::process::id());
    let made = proc_tree::create_cgroup(&name).and_then(|rel| {
        match proc_tree::move_to_cgroup(&rel, pid) {
            Ok(()) => Ok(rel),
            Err(e) => {
                let _ = proc_tree::remove_cgroup(&rel);
                Err(format!("cannot move the command into {rel}: {e}"))
            }
        }
    });
    match made {
        Ok(rel) => Some(rel),
        Err(why) => {
            NOTED.call_once(|| {
                tracing::info!("commands run without a cgroup of their own ({why}): a process that leaves the command's session escapes its term")
            });
            None
        }
    }
}

/// Reads up to `buf.len()` bytes, retrying on EINTR; how many came.
fn read_into(fd: &std::os::fd::OwnedFd, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match nix::unistd::read(fd, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    got
}

fn read_full(fd: &std::os::fd::OwnedFd, n: usize) -> usize {
    let mut buf = [0u8; 4];
    read_into(fd, &mut buf[..n.min(4)])
}

struct ChildFds {
    close: RawFd,
    go_r: RawFd,
    go_w: RawFd,
    err_w: RawFd,
    ready_w: RawFd,
}

/// The forked child until `exec`. Never returns.
///
/// # Safety
/// Only to be called in the child right after fork.
unsafe fn child_exec(
    parent: libc::pid_t,
    fds: &ChildFds,
    prog: &CString,
    argp: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> ! {
    // SAFETY (whole body): plain system calls on descriptors and memory
    // that were valid before fork; no allocation, no locks.
    unsafe {
        libc::setsid();
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() != parent {
            libc::_exit(126);
        }
        libc::close(fds.close);
        libc::close(fds.go_w);
        let one = 1u8;
        libc::write(fds.ready_w, (&one as *const u8).cast(), 1);
        libc::close(fds.ready_w);
        let mut b = 0u8;
        loop {
            let n = libc::read(fds.go_r, (&mut b as *mut u8).cast(), 1);
            if n == 1 && b == 1 {
                break;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            libc::_exit(125);
        }
        libc::execve(prog.as_ptr(), argp.as_ptr(), envp.as_ptr());
        let err = *libc::__errno_location();
        libc::write(fds.err_w, (&err as *const i32).cast(), 4);
        libc::_exit(127)
    }
}

/// The executable `program` names: a path as given, or the first match in
/// `PATH` (the search `execvp` does).
fn resolve(program: &OsStr) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    if program.is_empty() {
        return None;
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|c| {
            c.metadata().is_ok_and(|m| m.is_file())
                && nix::unistd::access(c.as_path(), nix::unistd::AccessFlags::X_OK).is_ok()
        })
}

impl Running {
    /// The command's pid: its process group and its session.
    pub fn pgid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// The command's tree (session, cgroup).
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The command's exit, once it has exited (reaping it).
    pub fn try_wait(&mut self) -> Option<Exit> {
        if self.exit.is_none() {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, c)) => self.exit = Some(Exit::Code(c)),
                Ok(WaitStatus::Signaled(_, s, _)) => self.exit = Some(Exit::Signal(s as i32)),
                // ECHILD: reaped elsewhere; there is nothing left to wait for.
                Err(Errno::ECHILD) => self.exit = Some(Exit::Code(-1)),
                _ => {}
            }
        }
        self.exit
    }

    fn reap_blocking(&mut self) {
        while self.exit.is_none() {
            match waitpid(self.pid, None) {
                Ok(WaitStatus::Exited(_, c)) => self.exit = Some(Exit::Code(c)),
                Ok(WaitStatus::Signaled(_, s, _)) => self.exit = Some(Exit::Signal(s as i32)),
                Err(Errno::EINTR) | Ok(_) => {}
                Err(_) => self.exit = Some(Exit::Code(-1)),
            }
        }
    }

    /// True once no process of the tree is left (the command itself being
    /// reaped as needed).
    pub fn group_gone(&mut self) -> bool {
        self.try_wait();
        self.tree.gone()
    }

    /// Stops the whole tree: SIGTERM (and SIGCONT, so that stopped
    /// processes can act on it), then SIGKILL (and `cgroup.kill`) after
    /// `grace`. Returns the command's exit and whether the tree is gone,
    /// which is when its fence may be dropped.
    pub fn stop(&mut self, grace: Duration) -> (Option<Exit>, bool) {
        if !self.group_gone() {
            self.tree.signal(Signal::SIGTERM);
            self.tree.signal(Signal::SIGCONT);
            if !wait_for(grace, || self.group_gone()) {
                tracing::warn!(
                    pgid = self.pgid(),
                    "command did not stop on SIGTERM; killing its process tree"
                );
                self.tree.kill();
                wait_for(Duration::from_secs(5), || self.group_gone());
            }
        }
        let gone = self.group_gone();
        if gone {
            self.tree.remove_cgroup();
        }
        (self.exit, gone)
    }
}

impl Drop for Running {
    /// A command never outlives the handle of the elector that started it,
    /// whatever path the elector takes out of its term.
    fn drop(&mut self) {
        if self.try_wait().is_none() || !self.tree.gone() {
            self.tree.kill();
            self.reap_blocking();
        }
        self.tree.remove_cgroup();
    }
}

fn wait_for(max: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + max;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_command_runs_only_after_its_fence_and_in_its_own_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let script = format!(
            "echo $$ $(cut -d' ' -f5,6 /proc/$$/stat) $EPOCH_T > {}",
            out.display()
        );
        let mut seen = 0;
        let mut r = spawn(
            &argv(&["sh", "-c", &script]),
            &[("EPOCH_T", "7".into())],
            -1,
            |tree| {
                seen = tree.leader;
                // The child is waiting: nothing has been written yet.
                std::thread::sleep(Duration::from_millis(50));
                assert!(!out.exists(), "the command ran before its fence");
                Ok(())
            },
        )
        .expect("spawn");
        assert!(wait_for(Duration::from_secs(10), || r.try_wait().is_some()));
        assert_eq!(r.try_wait(), Some(Exit::Code(0)));
        let text = std::fs::read_to_string(&out).expect("output");
        let f: Vec<&str> = text.split_whitespace().collect();
        // Its own process group and session.
        let s = seen.to_string();
        assert_eq!(f, [s.as_str(), &s, &s, "7"]);
    }

    #[test]
    fn a_failed_fence_runs_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let script = format!("touch {}", out.display());
        let r = spawn(&argv(&["sh", "-c", &script]), &[], -1, |_| {
            Err("no daemon".into())
        });
        assert!(matches!(r, Err(SpawnError::Fence(_))));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!out.exists());
    }

    #[test]
    fn missing_programs_and_exec_failures_are_reported() {
        let r = spawn(&argv(&["leasefs-no-such-program"]), &[], -1, |_| Ok(()));
        assert!(matches!(r, Err(SpawnError::NotFound(_))));
        let dir = tempfile::tempdir().expect("tempdir");
        let r = spawn(&[dir.path().as_os_str().to_owned()], &[], -1, |_| Ok(()));
        assert!(matches!(r, Err(SpawnError::Os(_))), "{r:?}");
    }

    #[test]
    fn stop_takes_down_the_whole_tree() {
        // A background child in a process group of its own (job control)
        // stays in the session, and is stopped with the rest.
        let mut r = spawn(
            &argv(&[
                "sh",
                "-c",
                "trap '' TERM; set -m; sleep 30 & set +m; sleep 30 & sleep 30",
            ]),
            &[],
            -1,
            |_| Ok(()),
        )
        .expect("spawn");
        let tree = r.tree().clone();
        assert!(wait_for(Duration::from_secs(5), || tree.members().len() >= 3));
        let (exit, gone) = r.stop(Duration::from_millis(200));
        assert!(gone && tree.gone(), "left: {:?}", tree.members());
        assert_eq!(exit, Some(Exit::Signal(libc::SIGKILL)));
    }
}
