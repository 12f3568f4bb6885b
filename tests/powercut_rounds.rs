//! Power-cut rounds (tools/powercut: `powercut-rounds`; what they check is
//! in its module documentation and docs/SEMANTICS.md "Durability"): a
//! workload per round (append streams with fsync, close and reopen for
//! append, truncate, rename over, unlink, small files, a datanode failing
//! mid-write, lease recovery after the soft limit, the spout, elections),
//! the power cut at a random moment (half of them keeping a random subset
//! of the writes the disk had pending), both filesystems mounted again,
//! every acknowledgement checked.
//!
//! Three runs: the data directory and datanodes as directories on the
//! powercut FUSE mount (replicas synced file by file), and on ext4 and on
//! XFS disks (loop devices whose images are on the powercut mount), where
//! leasefs takes the paths users run: ranged syncs, zero fill, one-step
//! small files (written whole at their close, or at their fsync), replies
//! of syncs and closes a FUSE ring polled for. A run on ext4 or XFS fails
//! if one of those never ran.
//! CI runs 30 rounds on each of the three (the FUSE mount rounds, without
//! the fast paths, were 50 until CI time ran short: the disks are the
//! proof that matters);
//! `mount-scripts/powercut-rounds.sh` runs 500. `POWERCUT_ROUNDS`,
//! `POWERCUT_FS_ROUNDS` and `POWERCUT_SEED` change the numbers of rounds
//! and replay a run.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// One run at a time: each is a machine's worth of processes.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn rounds(fs: &str, default_rounds: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let var = if fs == "plain" {
        "POWERCUT_ROUNDS"
    } else {
        "POWERCUT_FS_ROUNDS"
    };
    let rounds = std::env::var(var).unwrap_or_else(|_| default_rounds.into());
    let rounds_bin = common::powercut::powercut_bin().with_file_name("powercut-rounds");
    let mut c = Command::new(&rounds_bin);
    c.args(["run", "--rounds", &rounds, "--fs", fs, "--leasefs"])
        .arg(common::bin());
    if let Ok(seed) = std::env::var("POWERCUT_SEED") {
        c.args(["--seed", &seed]);
    }
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", PathBuf::from(&rounds_bin).display()));
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "power-cut rounds on {fs} failed ({}):\n{}{}",
        out.status,
        text.lines()
            .filter(|l| !l.starts_with("round ") || l.contains("FAILED"))
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this kernel can mount `fs` on a loop device.
fn kernel_has(fs: &str) -> bool {
    let listed = std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|l| l.lines().any(|l| l.split_whitespace().last() == Some(fs)));
    // A module not loaded yet is not listed: mount(8) loads it.
    let module = Command::new("modprobe")
        .arg(fs)
        .status()
        .is_ok_and(|s| s.success());
    (listed || module) && std::path::Path::new("/dev/loop-control").exists()
}

#[test]
fn power_cuts_at_random_moments_lose_nothing_acknowledged() {
    rounds("plain", "30");
}

#[test]
fn power_cuts_on_ext4_disks_lose_nothing_acknowledged() {
    if !kernel_has("ext4") {
        eprintln!("SKIPPED: this kernel cannot mount ext4 on a loop device");
        return;
    }
    rounds("ext4", "30");
}

#[test]
fn power_cuts_on_xfs_disks_lose_nothing_acknowledged() {
    if !kernel_has("xfs") {
        eprintln!("SKIPPED: this kernel cannot mount xfs on a loop device");
        return;
    }
    rounds("xfs", "30");
}
