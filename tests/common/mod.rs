//! Shared fixture of the integration tests: a real leasefs mount in a
//! temporary directory, made with the release binary (`LEASEFS_BIN`, or
//! target/release/leasefs) and always unmounted on drop, even when the
//! test fails; the processes the tests drive ([`Agent`], and the other
//! subcommands of the `testkit` binary, tools/testkit); and the ways to
//! wait: [`wait_for`] a condition with a deadline, or, where time itself
//! is under test, [`let_time_pass`] and [`holds_for`]. Only processes this
//! fixture or a test started are ever killed.

#![allow(dead_code)]

pub mod elect;
pub mod etcd;
pub mod faults;
pub mod garage;
pub mod powercut;
pub mod proxy;
pub mod spout;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub fn bin() -> PathBuf {
    if let Some(b) = std::env::var_os("LEASEFS_BIN") {
        return PathBuf::from(b);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let release = root.join("target/release/leasefs");
    if release.exists() {
        return release;
    }
    PathBuf::from(env!("CARGO_BIN_EXE_leasefs"))
}

pub struct Mount {
    pub dir: tempfile::TempDir,
    pub mnt: PathBuf,
    pub data: PathBuf,
    pub datanodes: Vec<PathBuf>,
    pub pid: Option<u32>,
    args: Vec<String>,
    /// More variables in the daemon's environment.
    env: Vec<(String, String)>,
    /// The etcd this mount keeps its namespace in, when the suite runs on
    /// the etcd backend (`LEASEFS_TEST_META=etcd`).
    _etcd: Option<std::sync::Arc<etcd::EtcdServer>>,
}

/// The mount option every fixture adds for `LEASEFS_TEST_FUSE_URING=off`:
/// the suites then run with requests through `/dev/fuse` even where the
/// kernel offers FUSE over io_uring (which leasefs otherwise uses).
pub fn transport_option() -> Option<&'static str> {
    std::env::var("LEASEFS_TEST_FUSE_URING")
        .is_ok_and(|v| v == "off")
        .then_some("fuse_uring=off")
}

/// Whether the suites run on the etcd backend: `LEASEFS_TEST_META=etcd`
/// mounts every fixture over a loopback etcd (one per test process), under
/// a prefix of its own.
pub fn etcd_backend() -> bool {
    std::env::var("LEASEFS_TEST_META").is_ok_and(|v| v == "etcd")
}

/// How to mount.
pub struct Opts {
    pub datanodes: usize,
    pub replication: Option<usize>,
    pub o: Vec<String>,
    /// More `leasefs mount` arguments (e.g. `--meta etcd://...`).
    pub args: Vec<String>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            datanodes: 3,
            replication: None,
            o: Vec::new(),
            args: Vec::new(),
        }
    }
}

impl Mount {
    pub fn new() -> Mount {
        Self::with(Opts::default())
    }

    pub fn with_o(o: &str) -> Mount {
        Self::with(Opts {
            o: vec![o.to_string()],
            ..Opts::default()
        })
    }

    pub fn with(o: Opts) -> Mount {
        Self::build(o, None, None)
    }

    /// As [`Mount::with`], with this data directory (e.g. on a small tmpfs)
    /// instead of a fresh one in the test's temp dir.
    pub fn with_data_dir(o: Opts, data: PathBuf) -> Mount {
        Self::build(o, None, Some(data))
    }

    /// As [`Mount::with`], with these datanode directories (in this order)
    /// instead of `o.datanodes` fresh ones: e.g. one on a tmpfs the test
    /// mounted itself (see `faults::Tmpfs`).
    pub fn with_datanode_paths(o: Opts, paths: Vec<PathBuf>) -> Mount {
        Self::build(o, Some(paths), None)
    }

    /// As [`Mount::with_datanode_paths`], with this data directory too
    /// (e.g. both on a filesystem whose power the test cuts).
    pub fn with_paths(o: Opts, data: PathBuf, paths: Vec<PathBuf>) -> Mount {
        Self::build(o, Some(paths), Some(data))
    }

    /// As [`Mount::with_datanode_paths`], in `dir`, which may already
    /// hold a data directory (`dir/data`, e.g. unpacked from a fixture).
    pub fn in_dir(o: Opts, dir: tempfile::TempDir, paths: Vec<PathBuf>) -> Mount {
        Self::build_in(o, Some(paths), None, dir)
    }

    /// As [`Mount::with`], with these variables in the daemon's
    /// environment (e.g. the test-only `LEASEFS_TEST_PANIC`).
    pub fn with_env(o: Opts, env: &[(&str, &str)]) -> Mount {
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::build_env(o, None, None, Self::temp_dir(), env)
    }

    /// As [`Mount::with_datanode_paths`], with these variables in the
    /// daemon's environment.
    pub fn with_datanode_paths_env(o: Opts, paths: Vec<PathBuf>, env: &[(&str, &str)]) -> Mount {
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::build_env(o, Some(paths), None, Self::temp_dir(), env)
    }

    fn temp_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("leasefs-test")
            .tempdir()
            .expect("tempdir")
    }

    fn build(o: Opts, paths: Option<Vec<PathBuf>>, data: Option<PathBuf>) -> Mount {
        Self::build_in(o, paths, data, Self::temp_dir())
    }

    fn build_in(
        o: Opts,
        paths: Option<Vec<PathBuf>>,
        data: Option<PathBuf>,
        dir: tempfile::TempDir,
    ) -> Mount {
        Self::build_env(o, paths, data, dir, Vec::new())
    }

    fn build_env(
        o: Opts,
        paths: Option<Vec<PathBuf>>,
        data: Option<PathBuf>,
        dir: tempfile::TempDir,
        env: Vec<(String, String)>,
    ) -> Mount {
        let mnt = dir.path().join("mnt");
        let data = data.unwrap_or_else(|| dir.path().join("data"));
        std::fs::create_dir_all(&mnt).expect("mkdir mnt");
        let datanodes: Vec<PathBuf> = paths.unwrap_or_else(|| {
            (1..=o.datanodes)
                .map(|i| dir.path().join(format!("dn{i}")))
                .collect()
        });
        let mut args = vec!["--data".to_string(), data.display().to_string()];
        for d in &datanodes {
            args.push("--datanode".into());
            args.push(d.display().to_string());
        }
        if let Some(r) = o.replication {
            args.push("--replication".into());
            args.push(r.to_string());
        }
        for x in o.o.iter().map(String::as_str).chain(transport_option()) {
            args.push("-o".into());
            args.push(x.to_string());
        }
        args.extend(o.args.iter().cloned());
        let etcd = (etcd_backend() && !o.args.iter().any(|a| a == "--meta")).then(|| {
            let e = etcd::EtcdServer::shared();
            let name = dir
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().replace('/', "_"))
                .unwrap_or_default();
            args.extend(["--meta".into(), format!("etcd://{}", e.endpoint())]);
            args.extend(["--prefix".into(), name]);
            e
        });
        let mut m = Mount {
            dir,
            mnt,
            data,
            datanodes,
            pid: None,
            args,
            env,
            _etcd: etcd,
        };
        m.mount();
        m
    }

    /// Mounts (again) with the same data directory and options.
    pub fn mount(&mut self) {
        let out = self.try_mount();
        assert!(
            out.status.success(),
            "mount failed: {}{}\nlast lines of the daemon's log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Runs `leasefs mount` with this mount's arguments and returns its
    /// output, whether it mounted or was refused.
    pub fn try_mount(&mut self) -> Output {
        let out = Command::new(bin())
            .arg("mount")
            .arg(&self.mnt)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("run leasefs mount");
        if out.status.success() {
            self.note_pid();
        }
        out
    }

    /// Gives the next [`Mount::mount`] this `--datanode` list (in this
    /// order) and replication factor.
    pub fn set_datanodes(&mut self, paths: Vec<PathBuf>, replication: Option<usize>) {
        let mut args = Vec::new();
        let mut it = std::mem::take(&mut self.args).into_iter();
        while let Some(a) = it.next() {
            if a == "--datanode" || a == "--replication" {
                it.next();
            } else {
                args.push(a);
            }
        }
        for d in &paths {
            args.push("--datanode".into());
            args.push(d.display().to_string());
        }
        if let Some(r) = replication {
            args.push("--replication".into());
            args.push(r.to_string());
        }
        self.args = args;
        self.datanodes = paths;
    }

    fn note_pid(&mut self) {
        let lock = std::fs::read_to_string(self.data.join("lock")).unwrap_or_default();
        self.pid = lock
            .trim()
            .strip_prefix("pid ")
            .and_then(|p| p.parse().ok());
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Lets every user reach the mount point (the test's temp dir is 0700).
    pub fn open_to_all(&self) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the test dir");
    }

    /// Runs a shell command as `nobody:nogroup` (with nogroup's
    /// supplementary groups) in the mount.
    pub fn sh_as_nobody(&self, script: &str) -> Output {
        Command::new("setpriv")
            .args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--init-groups",
                "bash",
                "-c",
            ])
            .arg(script)
            .current_dir(&self.mnt)
            .output()
            .expect("run setpriv")
    }

    /// Unmounts and waits for the daemon to exit.
    pub fn unmount(&mut self) {
        // Busy while a process of the test still has a file open: tried
        // again for a while, then detached.
        poll_until(Duration::from_secs(5), Duration::from_millis(100), || {
            let st = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .output();
            st.is_ok_and(|o| o.status.success()) || !is_mounted(&self.mnt)
        });
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .output();
        }
        if let Some(pid) = self.pid.take() {
            wait_exit(pid, Duration::from_secs(20));
            if alive(pid) {
                kill(pid, libc::SIGKILL);
                wait_exit(pid, Duration::from_secs(5));
            }
        }
        // As after a crash: the daemon's main thread can show as a zombie
        // while its other threads are still on their way out, holding the
        // data directory's lock that the next mount needs.
        wait_until(Duration::from_secs(20), || data_dir_free(&self.data));
    }

    /// Unmounts and mounts again, asserting that the daemon exited
    /// within 10 s of the unmount (not by [`Mount::unmount`]'s kill after
    /// 20 s) and left the next mount no block-journal rows to replay.
    pub fn remount_after_a_prompt_unmount_with_no_journal_left(&mut self) {
        let t = Instant::now();
        self.unmount();
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "the daemon outlived its unmount by {took:?}"
        );
        self.mount();
        assert!(
            !self.log().contains("block journal replayed"),
            "the unmount left rows to replay:\n{}",
            self.log()
        );
    }

    /// kill -9 of the daemon, then clean up the dead mount.
    pub fn crash(&mut self) {
        if let Some(pid) = self.pid.take() {
            kill(pid, libc::SIGKILL);
            wait_exit(pid, Duration::from_secs(10));
        }
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .output();
        wait_until(Duration::from_secs(5), || !is_mounted(&self.mnt));
        // The killed daemon's main thread can show as a zombie while another
        // of its threads is still on its way out, holding the data
        // directory's lock: a new mount needs that lock.
        wait_until(Duration::from_secs(20), || data_dir_free(&self.data));
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.join("leasefs.log")).unwrap_or_default()
    }

    pub fn xattr(&self, rel: &str, name: &str) -> Option<String> {
        getxattr(&self.path(rel), name)
    }

    /// Runs a shell command with the mount as working directory.
    pub fn sh(&self, script: &str) -> Output {
        Command::new("bash")
            .arg("-c")
            .arg(script)
            .current_dir(&self.mnt)
            .output()
            .expect("run bash")
    }

    /// As `sh`, asserting success.
    pub fn sh_ok(&self, script: &str) -> String {
        let o = self.sh(script);
        assert!(
            o.status.success(),
            "`{script}` failed ({:?}): {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `leasefs stats --once --json` of this mount.
    pub fn stats_json(&self) -> serde_json::Value {
        let out = self.leasefs(&["stats", self.mnt.to_str().unwrap(), "--once", "--json"]);
        assert!(
            out.status.success(),
            "stats --once --json: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    }

    /// Datanode counter `name` of `stats --json`, summed over datanodes.
    pub fn dn_counter(&self, name: &str) -> u64 {
        self.stats_json()["datanodes"]
            .as_array()
            .expect("datanodes")
            .iter()
            .map(|d| d[name].as_u64().unwrap_or(0))
            .sum()
    }

    /// A mount-wide counter of `stats --json`.
    pub fn stats_counter(&self, key: &str) -> u64 {
        self.stats_json()[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {key} in stats --json"))
    }

    pub fn leasefs(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .args(args)
            .output()
            .expect("run leasefs")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Whether no daemon holds the data directory's lock (`DATA/lock`).
fn data_dir_free(data: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .open(data.join("lock"))
    else {
        return true;
    };
    // SAFETY: flock on a descriptor this function owns; the lock, if
    // taken, goes with the descriptor when it is dropped.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

pub fn is_mounted(p: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let s = p.display().to_string();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(s.as_str()))
}

pub fn alive(pid: u32) -> bool {
    // A zombie counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

pub fn wait_exit(pid: u32, max: Duration) {
    wait_until(max, || !alive(pid));
}

pub fn kill(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) of a pid this fixture or test started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

pub fn getxattr(p: &Path, name: &str) -> Option<String> {
    let o = Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(p)
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Removes a datanode directory the mounted daemon is writing into, as
/// an operator's `rm -rf` of a failed disk would. The daemon may create a
/// replica file in a directory after `remove_dir_all` listed it, so the
/// last `rmdir` can find it not empty (ENOTEMPTY, seen in CI): another
/// pass removes what was created since. Once a directory is gone the
/// daemon's creates in it fail, so the passes end; 10 s bounds them.
pub fn remove_live_dir(p: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::remove_dir_all(p) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && Instant::now() < deadline => {}
            Err(e) => panic!("removing {}: {e}", p.display()),
        }
    }
}

/// Polls `f` every 20 ms until it is true (true) or `max` passes (false).
pub fn wait_until(max: Duration, f: impl FnMut() -> bool) -> bool {
    poll_until(max, Duration::from_millis(20), f)
}

/// [`wait_until`], polling every `every`: for conditions that cost a
/// process or a scan each time they are looked at.
pub fn poll_until(max: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + max;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// Waits until `cond` holds; panics after `max`, saying what was awaited.
/// The way to wait for anything a test can observe: a fixed sleep before
/// an assertion fails on a loaded machine and wastes time on an idle one.
pub fn wait_for(max: Duration, what: &str, cond: impl FnMut() -> bool) {
    assert!(
        wait_until(max, cond),
        "timed out after {max:?} waiting for {what}"
    );
}

/// Lets `d` pass, for the few checks where the passing of time is itself
/// what is tested and no condition can stand in for it: a lease left
/// unrenewed past its soft limit, renewals kept up for longer than that
/// limit, a lock left idle past its timeout, a kernel cache that must
/// expire, a workload paced in time. Every caller says which.
pub fn let_time_pass(d: Duration) {
    std::thread::sleep(d);
}

/// Checks that `cond` holds all through `d` (polled every 20 ms, and once
/// more at the end): for what must *not* happen within a time, such as a
/// preemption before the soft limit. A time and not a condition, since
/// what is tested is that nothing happens; panics with `what` at the first
/// poll where it stopped holding.
pub fn holds_for(d: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    let end = t0 + d;
    loop {
        assert!(cond(), "{what}: no longer so after {:?}", t0.elapsed());
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
        if Instant::now() >= end {
            assert!(cond(), "{what}: no longer so after {:?}", t0.elapsed());
            return;
        }
    }
}

// ---- the test helper binary ------------------------------------------------

/// The test helper binary (tools/testkit, built by `cargo build --release
/// -p testkit`, which mount-scripts/test.sh runs): `TESTKIT_BIN`, or
/// `testkit` next to the leasefs binary the tests use, or
/// target/release/testkit.
pub fn testkit() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(b) = std::env::var_os("TESTKIT_BIN") {
            return PathBuf::from(b);
        }
        let sibling = bin().with_file_name("testkit");
        if sibling.exists() {
            return sibling;
        }
        let b = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/testkit");
        assert!(
            b.exists(),
            "{} is missing: build it with `cargo build --release -p testkit`",
            b.display()
        );
        b
    })
    .clone()
}

/// `testkit SUBCOMMAND ARGS...` run to completion in `cwd`.
pub fn testkit_run(cwd: &Path, sub: &str, args: &[&str]) -> Output {
    Command::new(testkit())
        .arg(sub)
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run testkit")
}

/// A `testkit agent` the test drives line by line (tools/testkit/src/agent.rs
/// lists the commands), standing for one writer or reader program: it
/// answers `ok ...` or `err ERRNO_NAME MS` to each command. Its pid is the
/// holder the daemon records. Killed (by its pid) when dropped.
pub struct Agent {
    pub pid: u32,
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    rx: std::sync::mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Agent {
    /// An agent working in `cwd` (usually the mountpoint); SIGINT makes
    /// the command under way fail with `EINTR`, as Ctrl-C does to a
    /// program that handles it.
    pub fn spawn(cwd: &Path) -> Agent {
        let mut c = Command::new(testkit());
        c.arg("agent");
        Self::start(c, cwd)
    }

    /// An agent that SIGINT kills (its default action).
    pub fn spawn_dying_on_sigint(cwd: &Path) -> Agent {
        let mut c = Command::new(testkit());
        c.args(["agent", "--sigint-default"]);
        Self::start(c, cwd)
    }

    /// An agent running as `nobody:nogroup` (no supplementary groups), as
    /// an ordinary user of a root mount.
    pub fn spawn_as_nobody(cwd: &Path) -> Agent {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(testkit())
            .arg("agent");
        Self::start(c, cwd)
    }

    fn start(mut cmd: Command, cwd: &Path) -> Agent {
        use std::io::{BufRead, Read};
        use std::process::Stdio;
        let mut child = cmd
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn testkit agent");
        let pid = child.id();
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(l) = line else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut err = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            sink.lock().unwrap().push_str(&s);
        });
        let stdin = child.stdin.take();
        let a = Agent {
            pid,
            child,
            stdin,
            rx,
            stderr,
        };
        let first = a.reply(Duration::from_secs(20));
        assert_eq!(
            first,
            Some(format!("ready {pid}")),
            "agent did not start: {}",
            a.stderr()
        );
        a
    }

    /// Sends a command without waiting for its answer.
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("agent stdin");
        writeln!(stdin, "{line}").expect("write to agent");
        stdin.flush().expect("flush agent stdin");
    }

    /// The next answer, if one comes within `max`.
    pub fn reply(&self, max: Duration) -> Option<String> {
        self.rx.recv_timeout(max).ok()
    }

    /// Sends a command and returns its answer (waiting up to 30 s).
    pub fn cmd(&mut self, line: &str) -> String {
        self.send(line);
        match self.reply(Duration::from_secs(30)) {
            Some(r) => r,
            None => panic!(
                "agent {} gave no answer to `{line}`: {}",
                self.pid,
                self.stderr()
            ),
        }
    }

    /// As `cmd`, asserting an `ok` answer; returns what follows `ok`.
    pub fn ok(&mut self, line: &str) -> String {
        let r = self.cmd(line);
        assert!(
            r.starts_with("ok"),
            "agent {}: `{line}` answered `{r}`",
            self.pid
        );
        r.trim_start_matches("ok").trim().to_string()
    }

    pub fn signal(&self, sig: i32) {
        kill(self.pid, sig);
    }

    /// Waits for the process to end (reaping it).
    pub fn wait_exit(&mut self, max: Duration) -> Option<std::process::ExitStatus> {
        let mut st = None;
        wait_until(max, || {
            st = self.child.try_wait().ok().flatten();
            st.is_some()
        });
        st
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill(self.pid, libc::SIGCONT);
            kill(self.pid, libc::SIGKILL);
        }
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// Bytes as the agent's `setxattr` takes them: two hex digits each.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether process `pid` is stopped (SIGSTOP, SIGTSTP, a tracer).
pub fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with(['T', 't']))
        })
        .unwrap_or(false)
}

/// The errno name of an agent's `err NAME MS` answer.
pub fn err_name(reply: &str) -> Option<&str> {
    reply.strip_prefix("err ").and_then(|r| r.split(' ').next())
}

/// The milliseconds an agent's `ok MS` / `err NAME MS` answer reports.
pub fn reply_ms(reply: &str) -> u64 {
    reply
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX)
}

/// `/proc/PID/comm`, the name the daemon records for a holder.
pub fn comm_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

impl Mount {
    /// `user.leasefs.lease` parsed.
    pub fn lease(&self, rel: &str) -> serde_json::Value {
        let s = self
            .xattr(rel, "user.leasefs.lease")
            .unwrap_or_else(|| panic!("no user.leasefs.lease on {rel}"));
        serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("bad lease JSON `{s}`: {e}"))
    }

    /// `user.leasefs.lease`'s `state`.
    pub fn lease_state(&self, rel: &str) -> String {
        self.lease(rel)["state"].as_str().unwrap_or("?").to_string()
    }

    /// `user.leasefs.epoch`.
    pub fn epoch(&self, rel: &str) -> u64 {
        let s = self
            .xattr(rel, "user.leasefs.epoch")
            .unwrap_or_else(|| panic!("no user.leasefs.epoch on {rel}"));
        s.trim()
            .parse()
            .unwrap_or_else(|e| panic!("bad epoch `{s}`: {e}"))
    }

    /// The file's bytes, read through the mount.
    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.path(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }

    pub fn read_string(&self, rel: &str) -> String {
        String::from_utf8_lossy(&self.read(rel)).into_owned()
    }
}

/// Runs `cmd` as `nobody:nogroup` (no supplementary groups), as an
/// ordinary user of a root mount would.
pub fn as_nobody(cmd: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .args(cmd)
        .output()
        .expect("run setpriv")
}

/// A process the test stopped (SIGSTOP, waited for until it is): continued
/// when dropped, whatever happens.
pub struct Stopped(u32);

impl Stopped {
    pub fn stop(pid: u32) -> Stopped {
        kill(pid, libc::SIGSTOP);
        assert!(
            wait_until(Duration::from_secs(5), || stopped(pid)),
            "process {pid} did not stop"
        );
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

/// A process's resident memory, in KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
