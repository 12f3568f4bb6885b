//! `leasefs mount` errors (README "Using it"): bad options and paths get exactly
//! one line on stderr starting with `leasefs:`, a non-zero exit, never a
//! panic, and nothing gets mounted; a data directory serves one daemon.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Output;

/// A scratch directory with three datanodes, a data dir and an empty
/// mountpoint, for mounts that must fail.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("leasefs-cli")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("mnt")).unwrap();
        Scratch { dir }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn dn_args(&self, n: usize) -> Vec<String> {
        (1..=n)
            .flat_map(|i| {
                [
                    "--datanode".to_string(),
                    self.p(&format!("dn{i}")).display().to_string(),
                ]
            })
            .collect()
    }
}

fn mount_cmd(mnt: &Path, args: &[String]) -> Output {
    std::process::Command::new(bin())
        .arg("mount")
        .arg(mnt)
        .args(args)
        .output()
        .expect("run leasefs mount")
}

/// The failure contract; returns the one stderr line.
fn assert_one_line_failure(o: &Output, mnt: &Path) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "mount succeeded: {out}{err}");
    assert!(
        !err.contains("panicked") && !out.contains("panicked"),
        "panic: {err}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "stderr is not one line:\n{err}");
    assert!(
        lines[0].starts_with("leasefs:"),
        "stderr does not start with `leasefs:`: {err}"
    );
    if is_mounted(mnt) {
        let _ = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(mnt)
            .output();
        panic!("a failed mount left {} mounted", mnt.display());
    }
    lines[0].to_string()
}

fn base(s: &Scratch) -> Vec<String> {
    let mut a = vec!["--data".to_string(), s.p("data").display().to_string()];
    a.extend(s.dn_args(3));
    a
}

#[test]
fn mount_on_a_missing_mountpoint_fails_with_one_line() {
    let s = Scratch::new();
    let mnt = s.p("nonexistent");
    let line = assert_one_line_failure(&mount_cmd(&mnt, &base(&s)), &mnt);
    assert!(line.contains("nonexistent"), "{line}");
}

#[test]
fn mount_on_a_non_empty_mountpoint_fails_with_one_line() {
    let s = Scratch::new();
    let mnt = s.p("mnt");
    std::fs::write(mnt.join("x"), "x").unwrap();
    let line = assert_one_line_failure(&mount_cmd(&mnt, &base(&s)), &mnt);
    assert!(line.contains("not empty"), "{line}");
}

#[test]
fn mount_on_an_already_mounted_mountpoint_fails_with_one_line() {
    let m = Mount::new();
    let s = Scratch::new();
    let o = mount_cmd(&m.mnt, &base(&s));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success(),
        "second mount on the same mountpoint succeeded"
    );
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("leasefs:") && lines[0].contains("mount"),
        "{err}"
    );
    // The first mount is untouched.
    m.sh_ok("echo still > f");
    assert_eq!(m.read_string("f"), "still\n");
}

#[test]
fn replication_above_the_number_of_datanodes_fails_with_one_line() {
    let s = Scratch::new();
    let mut a = base(&s);
    a.extend(["--replication".to_string(), "4".to_string()]);
    let mnt = s.p("mnt");
    let line = assert_one_line_failure(&mount_cmd(&mnt, &a), &mnt);
    assert!(line.contains("replication"), "{line}");
}

#[test]
fn an_unknown_mount_option_fails_with_one_line() {
    let s = Scratch::new();
    let mut a = base(&s);
    a.extend(["-o".to_string(), "bogus=1".to_string()]);
    let mnt = s.p("mnt");
    let line = assert_one_line_failure(&mount_cmd(&mnt, &a), &mnt);
    assert!(line.contains("bogus"), "{line}");
}

#[test]
fn a_bad_option_value_fails_with_one_line() {
    let s = Scratch::new();
    let mnt = s.p("mnt");
    for o in [
        "block_size=abc",
        "packet_size=1000",
        "max_packets_in_flight=x",
        "soft_limit=-1",
    ] {
        let mut a = base(&s);
        a.extend(["-o".to_string(), o.to_string()]);
        let line = assert_one_line_failure(&mount_cmd(&mnt, &a), &mnt);
        let key = o.split('=').next().unwrap();
        assert!(line.contains(key), "{o}: {line}");
    }
}

#[test]
fn a_second_mount_of_the_same_data_directory_is_refused_clearly() {
    let m = Mount::new();
    let s = Scratch::new();
    let mnt = s.p("mnt");
    let mut a = vec!["--data".to_string(), m.data.display().to_string()];
    for d in &m.datanodes {
        a.extend(["--datanode".to_string(), d.display().to_string()]);
    }
    let line = assert_one_line_failure(&mount_cmd(&mnt, &a), &mnt);
    assert!(
        line.contains("in use") || line.contains("already"),
        "unclear message: {line}"
    );
    assert!(
        line.contains(&m.data.display().to_string()),
        "does not name the data dir: {line}"
    );
    // The first daemon still serves its mount.
    m.sh_ok("echo still > f");
    assert_eq!(m.read_string("f"), "still\n");
}
