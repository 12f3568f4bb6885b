//! Shared fixture of the integration tests: a real leasefs mount in a
//! temporary directory, made with the release binary (`LEASEFS_BIN`, or
//! target/release/leasefs) and always unmounted on drop, even when the
//! test fails. Only processes this fixture started are ever killed.

#![allow(dead_code)]

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
}

/// How to mount.
pub struct Opts {
    pub datanodes: usize,
    pub replication: Option<usize>,
    pub o: Vec<String>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            datanodes: 3,
            replication: None,
            o: Vec::new(),
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
        let dir = tempfile::Builder::new().prefix("leasefs-test").tempdir().expect("tempdir");
        let mnt = dir.path().join("mnt");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&mnt).expect("mkdir mnt");
        let datanodes: Vec<PathBuf> = (1..=o.datanodes).map(|i| dir.path().join(format!("dn{i}"))).collect();
        let mut args = vec!["--data".to_string(), data.display().to_string()];
        for d in &datanodes {
            args.push("--datanode".into());
            args.push(d.display().to_string());
        }
        if let Some(r) = o.replication {
            args.push("--replication".into());
            args.push(r.to_string());
        }
        for x in &o.o {
            args.push("-o".into());
            args.push(x.clone());
        }
        let mut m = Mount {
            dir,
            mnt,
            data,
            datanodes,
            pid: None,
            args,
        };
        m.mount();
        m
    }

    /// Mounts (again) with the same data directory and options.
    pub fn mount(&mut self) {
        let out = Command::new(bin())
            .arg("mount")
            .arg(&self.mnt)
            .args(&self.args)
            .output()
            .expect("run leasefs mount");
        assert!(
            out.status.success(),
            "mount failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let lock = std::fs::read_to_string(self.data.join("lock")).unwrap_or_default();
        self.pid = lock.trim().strip_prefix("pid ").and_then(|p| p.parse().ok());
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmounts and waits for the daemon to exit.
    pub fn unmount(&mut self) {
        for _ in 0..50 {
            let st = Command::new("fusermount3").arg("-u").arg(&self.mnt).output();
            if st.map(|o| o.status.success()).unwrap_or(false) {
                break;
            }
            if !is_mounted(&self.mnt) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.mnt).output();
        }
        if let Some(pid) = self.pid.take() {
            wait_exit(pid, Duration::from_secs(20));
            if alive(pid) {
                kill(pid, libc::SIGKILL);
                wait_exit(pid, Duration::from_secs(5));
            }
        }
    }

    /// kill -9 of the daemon, then clean up the dead mount.
    pub fn crash(&mut self) {
        if let Some(pid) = self.pid.take() {
            kill(pid, libc::SIGKILL);
            wait_exit(pid, Duration::from_secs(10));
        }
        let _ = Command::new("fusermount3").arg("-uz").arg(&self.mnt).output();
        let deadline = Instant::now() + Duration::from_secs(5);
        while is_mounted(&self.mnt) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
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

    pub fn leasefs(&self, args: &[&str]) -> Output {
        Command::new(bin()).args(args).output().expect("run leasefs")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

pub fn is_mounted(p: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let s = p.display().to_string();
    info.lines().any(|l| l.split(' ').nth(4) == Some(s.as_str()))
}

pub fn alive(pid: u32) -> bool {
    // A zombie counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

pub fn wait_exit(pid: u32, max: Duration) {
    let deadline = Instant::now() + max;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// Polls `f` until it is true or `max` passes.
pub fn wait_until(max: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + max;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
