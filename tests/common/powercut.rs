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
}

impl PowerCut {
    /// Mounts leasefs with `o` (its data directory and three datanodes on
    /// the powercut filesystem).
    pub fn new(o: Opts) -> PowerCut {
        let dir = tempfile::Builder::new()
            .prefix("leasefs-powercut")
            .tempdir()
            .expect("tempdir");
        let disk = dir.path().join("disk");
        std::fs::create_dir_all(&disk).expect("mkdir disk");
        let pc = start(dir.path());
        let dns = (1..=o.datanodes)
            .map(|i| disk.join(format!("dn{i}")))
            .collect();
        let m = Mount::with_paths(o, disk.join("data"), dns);
        PowerCut {
            m,
            dir,
            pc: Some(pc),
        }
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("control.sock")
    }

    /// A command to the powercut filesystem; its reply line.
    pub fn control(&self, cmd: &str) -> String {
        control(&self.sock(), cmd)
    }

    /// The power cut: the daemon killed, every change not made durable
    /// dropped, then the powercut filesystem and leasefs mounted again.
    /// Returns the powercut filesystem's account of what it dropped.
    pub fn cut(&mut self) -> String {
        self.m.crash();
        let dropped = self.control("cut");
        self.power_off();
        self.pc = Some(start(self.dir.path()));
        self.m.mount();
        dropped
    }

    fn power_off(&mut self) {
        stop(self.dir.path(), &mut self.pc);
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
    let disk = dir.join("disk");
    let unmounted = wait_until(Duration::from_secs(10), || {
        Command::new("fusermount3")
            .arg("-u")
            .arg(&disk)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            || !is_mounted(&disk)
    });
    if !unmounted {
        let _ = Command::new("fusermount3").arg("-uz").arg(&disk).status();
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
    let disk = dir.join("disk");
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
