//! A leasefs mount whose data directory and datanodes live on a
//! `powercut` filesystem (tools/powercut): the test can cut the power
//! (every change not yet made durable is lost), inject datanode faults,
//! and mount again. The binary is `POWERCUT_BIN`, or `powercut` next to
//! the leasefs binary the tests use, or target/release/powercut (built
//! by `cargo build --release -p powercut`, which mount-scripts/test.sh
//! runs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{Mount, Opts, is_mounted, wait_until};

pub fn powercut_bin() -> PathBuf {
    if let Some(b) = std::env::var_os("POWERCUT_BIN") {
        return PathBuf::from(b);
    }
    // Beside the leasefs binary the tests use (a CARGO_TARGET_DIR build),
    // else in the checkout's target directory.
    let sibling = super::bin().with_file_name("powercut");
    if sibling.exists() {
        return sibling;
    }
    let b = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/powercut");
    assert!(
        b.exists(),
        "{} is missing: build it with `cargo build --release -p powercut`",
        b.display()
    );
    b
}

pub struct PowerCut {
    pub m: Mount,
    dir: tempfile::TempDir,
    pc: Option<Child>,
    /// `LEASEFS_TEST_POWERCUT_FS`: `ext4` or `xfs` puts the data directory
    /// and each datanode on a filesystem of its own, on a loop device whose
    /// image is on the powercut mount (`powercut disks-up`), so that the
    /// paths users run (ranged syncs, zero fill, syncfs) are what a cut
    /// tests; unset or `plain`: directories on the powercut mount.
    fs: Option<String>,
    disks: Vec<String>,
}

/// The filesystem the power-cut tests put under leasefs (see [`PowerCut`]).
pub fn test_fs() -> Option<String> {
    std::env::var("LEASEFS_TEST_POWERCUT_FS")
        .ok()
        .filter(|f| !f.is_empty() && f != "plain")
}

impl PowerCut {
    /// Mounts leasefs with `o` (its data directory and three datanodes on
    /// the powercut filesystem).
    pub fn new(o: Opts) -> PowerCut {
        PowerCut::on_disks(o, false)
    }

    /// As [`Self::new`], with the data directory and every datanode on one
    /// disk, as most mounts have them (the metadata store's WAL then
    /// shares the datanodes' `syncfs`).
    pub fn one_disk(o: Opts) -> PowerCut {
        PowerCut::on_disks(o, true)
    }

    fn on_disks(o: Opts, one: bool) -> PowerCut {
        let dir = tempfile::Builder::new()
            .prefix("leasefs-powercut")
            .tempdir()
            .expect("tempdir");
        let disk = dir.path().join("disk");
        std::fs::create_dir_all(&disk).expect("mkdir disk");
        let fs = test_fs();
        let names: Vec<String> = std::iter::once("data".to_string())
            .chain((1..=o.datanodes).map(|i| format!("dn{i}")))
            .collect();
        let disks = if one {
            vec!["all".to_string()]
        } else {
            names.clone()
        };
        let pc = start_disks(dir.path(), fs.as_deref(), &disks);
        let under = |name: &str| match one {
            true => disk.join("all").join(name),
            false => disk.join(name),
        };
        if one {
            // Made durable before any cut: `syncfs` of the disk.
            for n in &names {
                std::fs::create_dir_all(under(n)).expect("mkdir on the disk");
            }
            let synced = Command::new("sync")
                .arg("-f")
                .arg(disk.join("all"))
                .status();
            assert!(synced.is_ok_and(|s| s.success()), "sync -f the disk");
        }
        let dns = names[1..].iter().map(|n| under(n)).collect();
        let m = Mount::with_paths(o, under("data"), dns);
        PowerCut {
            m,
            dir,
            pc: Some(pc),
            fs,
            disks,
        }
    }

    /// Whether the datanodes are on the powercut FUSE mount itself (where
    /// leasefs syncs replicas file by file), not on ext4 or XFS over it.
    pub fn on_fuse(&self) -> bool {
        self.fs.is_none()
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("control.sock")
    }

    /// A command to the powercut filesystem; its reply line. On ext4 or
    /// XFS disks `commit-namespace` does nothing: what it models (a
    /// journal commit of names without their data) is the filesystem's
    /// own there, every few seconds or at any fsync.
    pub fn control(&self, cmd: &str) -> String {
        if self.fs.is_some() && cmd == "commit-namespace" {
            return String::new();
        }
        control(&self.sock(), cmd)
    }

    /// The power cut: the daemon killed, every change not made durable
    /// dropped, then the powercut filesystem and leasefs mounted again.
    /// Returns the powercut filesystem's account of what it dropped.
    pub fn cut(&mut self) -> String {
        self.m.crash();
        let dropped = self.control("cut");
        self.power_cycle();
        dropped
    }

    /// On ext4 or XFS disks: starts and waits for the writeback of every
    /// dirty page of every file on them, with no cache flush of the
    /// device (`sync_file_range`), so that the disk has writes pending
    /// that a cut with a subset keeps or drops sector by sector: the torn
    /// state a real disk can be left in.
    pub fn write_back_unflushed(&self) {
        if self.fs.is_some() {
            let o = Command::new(powercut_bin())
                .arg("writeback")
                .arg(self.dir.path().join("disk"))
                .output()
                .expect("run powercut writeback");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    }

    /// After the crash and the cut (by [`Self::cut`], or by hand with
    /// `control("cut ...")`): the powercut filesystem and leasefs mounted
    /// again.
    pub fn power_cycle(&mut self) {
        self.power_off();
        self.pc = Some(start_disks(
            self.dir.path(),
            self.fs.as_deref(),
            &self.disks,
        ));
        self.m.mount();
    }

    fn power_off(&mut self) {
        if self.fs.is_some() {
            let o = Command::new(powercut_bin())
                .arg("disks-down")
                .arg(self.dir.path().join("disk"))
                .args(&self.disks)
                .output()
                .expect("run powercut disks-down");
            if !o.status.success() {
                eprintln!("{}", String::from_utf8_lossy(&o.stderr));
            }
            stop_at(&self.dir.path().join("pc"), &mut self.pc);
        } else {
            stop(self.dir.path(), &mut self.pc);
        }
    }
}

/// Sends `cmd` (`cut`, `fail DIR EIO`, `slow DIR MILLIS`, ...) to the
/// powercut filesystem listening on `sock`; returns its reply line.
fn control(sock: &Path, cmd: &str) -> String {
    let mut words = cmd.split_whitespace();
    let o = Command::new(powercut_bin())
        .args(words.next())
        .arg(sock)
        .args(words)
        .output()
        .expect("run powercut");
    assert!(
        o.status.success(),
        "powercut {cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Unmounts DIR/disk and waits for the powercut process `pc` to end.
fn stop(dir: &Path, pc: &mut Option<Child>) {
    stop_at(&dir.join("disk"), pc)
}

/// Unmounts the powercut mount `disk` and waits for its process `pc`.
fn stop_at(disk: &Path, pc: &mut Option<Child>) {
    let unmounted = wait_until(Duration::from_secs(10), || {
        Command::new("fusermount3")
            .arg("-u")
            .arg(disk)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            || !is_mounted(disk)
    });
    if !unmounted {
        let _ = Command::new("fusermount3").arg("-uz").arg(disk).status();
    }
    if let Some(mut c) = pc.take() {
        if !wait_until(Duration::from_secs(10), || {
            matches!(c.try_wait(), Ok(Some(_)))
        }) {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

/// Starts `powercut` serving DIR/backing at DIR/disk; returns once it answers.
fn start(dir: &std::path::Path) -> Child {
    start_at(dir, &dir.join("disk"))
}

/// With `fs`, starts `powercut` at DIR/pc and mounts `names` on it as
/// `fs` disks at DIR/disk/NAME; else as [`start`].
fn start_disks(dir: &Path, fs: Option<&str>, names: &[String]) -> Child {
    let Some(fs) = fs else { return start(dir) };
    let pc = dir.join("pc");
    std::fs::create_dir_all(&pc).expect("mkdir pc");
    let child = start_at(dir, &pc);
    let o = Command::new(powercut_bin())
        .args(["disks-up", "--fs", fs])
        .arg(&pc)
        .arg(dir.join("disk"))
        .args(names)
        .output()
        .expect("run powercut disks-up");
    if !o.status.success() {
        let mut c = Some(child);
        stop_at(&pc, &mut c);
        panic!("{fs} disks: {}", String::from_utf8_lossy(&o.stderr));
    }
    child
}

/// Starts `powercut` serving DIR/backing at `disk`; returns once it answers.
fn start_at(dir: &Path, disk: &Path) -> Child {
    let disk = disk.to_path_buf();
    let sock = dir.join("control.sock");
    let child = Command::new(powercut_bin())
        .arg("mount")
        .arg(dir.join("backing"))
        .arg(&disk)
        .arg("--control")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start powercut");
    let up = wait_until(Duration::from_secs(20), || {
        is_mounted(&disk) && std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    assert!(up, "the powercut filesystem did not come up");
    child
}

impl Drop for PowerCut {
    fn drop(&mut self) {
        self.m.unmount();
        self.power_off();
    }
}

/// A powercut filesystem for some of a mount's datanodes (not its data
/// directory), so that a test can make one of them a slow disk through a
/// real mount (`powercut slow`). Declare it before the [`Mount`] that uses
/// it: it is unmounted when dropped, which must come after the mount's.
pub struct Disk {
    dir: tempfile::TempDir,
    pc: Option<Child>,
}

impl Disk {
    pub fn new() -> Disk {
        let dir = tempfile::Builder::new()
            .prefix("leasefs-disk")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir_all(dir.path().join("disk")).expect("mkdir disk");
        let pc = start(dir.path());
        Disk { dir, pc: Some(pc) }
    }

    /// The top-level directory `name` on the powercut filesystem (what
    /// `slow` names).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join("disk").join(name)
    }

    /// A plain directory beside it, for the mount's other datanodes.
    pub fn beside(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Answers every write under `name` `ms` milliseconds late.
    pub fn slow(&self, name: &str, ms: u64) {
        control(
            &self.dir.path().join("control.sock"),
            &format!("slow {name} {ms}"),
        );
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        stop(self.dir.path(), &mut self.pc);
    }
}
