//! Power-cut rounds (tools/powercut: `powercut-rounds`; what they check is
//! in its module documentation and docs/SEMANTICS.md "Durability"): a
//! workload per round (append streams with fsync, close and reopen for
//! append, truncate, rename over, unlink, small files, a datanode failing
//! mid-write, lease recovery after the soft limit, the spout, elections),
//! the power cut at a random moment, both filesystems mounted again, every
//! acknowledgement checked. CI runs 50 rounds; `mount-scripts/powercut-rounds.sh`
//! runs 500. `POWERCUT_ROUNDS` and `POWERCUT_SEED` change the number of
//! rounds and replay a run.

mod common;

use std::path::PathBuf;
use std::process::Command;

#[test]
fn power_cuts_at_random_moments_lose_nothing_acknowledged() {
    let rounds = std::env::var("POWERCUT_ROUNDS").unwrap_or_else(|_| "50".into());
    let rounds_bin = common::powercut::powercut_bin().with_file_name("powercut-rounds");
    let mut c = Command::new(&rounds_bin);
    c.args(["run", "--rounds", &rounds, "--leasefs"])
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
        "power-cut rounds failed ({}):\n{}{}",
        out.status,
        text.lines()
            .filter(|l| !l.starts_with("round ") || l.contains("FAILED"))
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
}
