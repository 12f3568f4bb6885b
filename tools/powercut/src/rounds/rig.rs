//! The machine under test: a `powercut` filesystem holding leasefs's data
//! directory and its three datanodes, leasefs mounted on top, and the power
//! cut: every process killed (workloads, then the daemon), every pending
//! change of the powercut filesystem dropped, both filesystems mounted
//! again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Rig {
    pub work: PathBuf,
    pub powercut: PathBuf,
    pub leasefs: PathBuf,
    /// The powercut mount (leasefs's data and datanodes live here).
    pub disk: PathBuf,
    /// The leasefs mount.
    pub mnt: PathBuf,
    sock: PathBuf,
    backing: PathBuf,
    pc: Option<Child>,
    pub daemon: Option<u32>,
    /// `-o` of the current leasefs mount.
    pub options: String,
    /// `ext4` or `xfs`: the data directory and each datanode are a
    /// filesystem of their own on a loop device whose image lives on the
    /// powercut mount (`powercut disks-up`); `None`: directories on the
    /// powercut mount itself.
    pub fs: Option<String>,
    /// Where the powercut filesystem is mounted when `fs` is set.
    pc_mnt: PathBuf,
}

/// The disks under `disk`: leasefs's data directory and its datanodes.
pub const DISKS: [&str; 4] = ["data", "dn1", "dn2", "dn3"];

/// Waits for `f` to hold, polling every 20 ms, for at most `max`.
pub fn wait_until(max: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + max;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn alive(pid: u32) -> bool {
    // A zombie still has /proc/PID; its status says so.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

pub fn kill9(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

pub fn is_mounted(p: &Path) -> bool {
    let want = p.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| {
            m.lines()
                .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
        })
        .unwrap_or(false)
}

fn fusermount(args: &[&str], p: &Path) -> bool {
    Command::new("fusermount3")
        .args(args)
        .arg(p)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Rig {
    pub fn new(
        work: &Path,
        powercut: PathBuf,
        leasefs: PathBuf,
        fs: Option<String>,
    ) -> std::io::Result<Rig> {
        let r = Rig {
            work: work.to_path_buf(),
            powercut,
            leasefs,
            disk: work.join("disk"),
            mnt: work.join("mnt"),
            sock: work.join("powercut.sock"),
            backing: work.join("backing"),
            pc: None,
            daemon: None,
            options: String::new(),
            fs,
            pc_mnt: work.join("pc"),
        };
        for d in [
            &r.pc_mnt,
            &r.disk,
            &r.mnt,
            &r.backing,
            &work.join("acks"),
            &work.join("logs"),
        ] {
            std::fs::create_dir_all(d)?;
        }
        Ok(r)
    }

    pub fn data(&self) -> PathBuf {
        self.disk.join("data")
    }

    /// The powercut mount.
    fn pc_at(&self) -> &Path {
        if self.fs.is_some() {
            &self.pc_mnt
        } else {
            &self.disk
        }
    }

    /// Mounts the powercut filesystem (and the ext4 or XFS disks on it);
    /// returns once it answers.
    pub fn power_on(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.work.join("logs/powercut.log"))
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.powercut)
            .arg("mount")
            .arg(&self.backing)
            .arg(self.pc_at())
            .arg("--control")
            .arg(&self.sock)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.powercut.display()))?;
        self.pc = Some(child);
        let ok = wait_until(Duration::from_secs(20), || {
            self.control("status").is_ok() && is_mounted(self.pc_at())
        });
        if !ok {
            return Err("the powercut filesystem did not come up".into());
        }
        if let Some(fs) = &self.fs {
            let out = Command::new(&self.powercut)
                .args(["disks-up", "--fs", fs])
                .arg(&self.pc_mnt)
                .arg(&self.disk)
                .args(DISKS)
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
            }
        }
        Ok(())
    }

    /// Unmounts the ext4 or XFS disks (after a cut, what they still held
    /// in memory is lost, since every write fails).
    fn disks_down(&self) -> Result<(), String> {
        if self.fs.is_none() {
            return Ok(());
        }
        let out = Command::new(&self.powercut)
            .arg("disks-down")
            .arg(&self.disk)
            .args(DISKS)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Sends a command to the powercut filesystem.
    pub fn control(&self, cmd: &str) -> Result<String, String> {
        let out = Command::new(&self.powercut)
            .args(cmd.split_whitespace().take(1))
            .arg(&self.sock)
            .args(cmd.split_whitespace().skip(1))
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() {
            Ok(text)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Mounts leasefs with `-o options` over the powercut disk.
    pub fn mount(&mut self, options: &str) -> Result<(), String> {
        self.options = options.to_string();
        let mut c = Command::new(&self.leasefs);
        c.arg("mount")
            .arg(&self.mnt)
            .arg("--data")
            .arg(self.data())
            .arg("--replication")
            .arg("3")
            .arg("-o")
            .arg(options);
        for i in 1..=3 {
            c.arg("--datanode").arg(self.disk.join(format!("dn{i}")));
        }
        let out = c.output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "leasefs mount failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let lock = std::fs::read_to_string(self.data().join("lock")).unwrap_or_default();
        self.daemon = lock
            .trim()
            .strip_prefix("pid ")
            .and_then(|p| p.parse().ok());
        Ok(())
    }

    /// The daemon's fast-path counters, summed over its datanodes:
    /// (ranged syncs, full syncs, zero fills, one-step replicas at close
    /// and at fsync), then the mount's closes committed on the request's
    /// thread and replies its FUSE rings polled for, then replica reads
    /// that went past the page cache (the checks' reads after a cut), then
    /// replicas the block journal made durable and rewrote at mount, then
    /// journaled replicas held in memory until needed on disk, then
    /// replicas a mount checked past the flush marks and replicas synced
    /// at a close behind them, then closes left for the store's next
    /// commit.
    pub fn fast_paths(&self) -> [u64; 14] {
        let Ok(out) = Command::new(&self.leasefs)
            .args(["stats", "--once", "--json"])
            .arg(&self.mnt)
            .output()
        else {
            return [0; 14];
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            return [0; 14];
        };
        let mut sum = [0u64; 14];
        sum[5] = v["closes_on_caller"].as_u64().unwrap_or(0);
        sum[6] = v["ring_polls_answered"].as_u64().unwrap_or(0);
        sum[13] = v["closes_without_commit"].as_u64().unwrap_or(0);
        for dn in v["datanodes"].as_array().into_iter().flatten() {
            sum[7] += dn["reads_direct"].as_u64().unwrap_or(0);
            sum[8] += dn["journaled"].as_u64().unwrap_or(0);
            sum[9] += dn["journal_replayed"].as_u64().unwrap_or(0);
            sum[10] += dn["deferred"].as_u64().unwrap_or(0);
            sum[11] += dn["unflushed_checked"].as_u64().unwrap_or(0);
            sum[12] += dn["synced_behind_mark"].as_u64().unwrap_or(0);
            for (i, key) in [
                "syncs_ranged",
                "syncs_full",
                "zero_fills",
                "one_step_replicas",
                "one_step_synced",
            ]
            .iter()
            .enumerate()
            {
                sum[i] += dn[key].as_u64().unwrap_or(0);
            }
        }
        sum
    }

    /// The daemon's log so far (it lives on the powercut disk).
    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.data().join("leasefs.log")).unwrap_or_default()
    }

    /// The power cut. Every process stops first (workloads, then the
    /// daemon), then the disk loses what was not durable. The daemon's log
    /// is kept in `logs/` (appended) before the disk loses it. Returns the
    /// powercut filesystem's account of what it dropped.
    pub fn cut(
        &mut self,
        children: &mut Vec<Child>,
        round: usize,
        subset: Option<u64>,
    ) -> Result<String, String> {
        for c in children.iter() {
            kill9(c.id());
        }
        for mut c in children.drain(..) {
            let _ = c.wait();
        }
        if let Some(pid) = self.daemon.take() {
            kill9(pid);
            if !wait_until(Duration::from_secs(20), || !alive(pid)) {
                return Err(format!("leasefs daemon {pid} did not die"));
            }
        }
        fusermount(&["-u", "-z"], &self.mnt);
        let log = self.daemon_log();
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.work.join("logs/leasefs.log"))
            .and_then(|mut f| {
                use std::io::Write;
                writeln!(f, "===== round {round}: power cut =====")?;
                f.write_all(log.as_bytes())
            });
        let dropped = match subset {
            Some(seed) => {
                // On ext4 or XFS what the kernel still held goes to the
                // disk first, unflushed: the subset tears it.
                if self.fs.is_some() {
                    let _ = Command::new(&self.powercut)
                        .arg("writeback")
                        .arg(&self.disk)
                        .output();
                }
                self.control(&format!("cut --subset {seed}"))?
            }
            None => self.control("cut")?,
        };
        self.power_off()?;
        Ok(dropped)
    }

    /// Unmounts the powercut filesystem and waits for its process.
    pub fn power_off(&mut self) -> Result<(), String> {
        let disks = self.disks_down();
        // The kernel releases a killed process's files asynchronously.
        let pc = self.pc_at().to_path_buf();
        if !wait_until(Duration::from_secs(10), || {
            fusermount(&["-u"], &pc) || !is_mounted(&pc)
        }) {
            fusermount(&["-u", "-z"], &pc);
        }
        if let Some(mut c) = self.pc.take() {
            let pid = c.id();
            if !wait_until(Duration::from_secs(10), || !alive(pid)) {
                kill9(pid);
            }
            let _ = c.wait();
        }
        disks
    }

    /// Clean shutdown at the end of a run: unmount leasefs, then the disk.
    pub fn shutdown(&mut self) {
        if is_mounted(&self.mnt) {
            wait_until(Duration::from_secs(20), || fusermount(&["-u"], &self.mnt));
            fusermount(&["-u", "-z"], &self.mnt);
        }
        if let Some(pid) = self.daemon.take()
            && !wait_until(Duration::from_secs(20), || !alive(pid))
        {
            kill9(pid);
        }
        let _ = self.power_off();
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(pid) = self.daemon.take() {
            kill9(pid);
        }
        fusermount(&["-u", "-z"], &self.mnt);
        if let Some(mut c) = self.pc.take() {
            let _ = self.disks_down();
            fusermount(&["-u", "-z"], self.pc_at());
            kill9(c.id());
            let _ = c.wait();
        }
    }
}
