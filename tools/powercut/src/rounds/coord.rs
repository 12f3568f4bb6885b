//! The spout and election workloads: leasefs's own `spout` and `elect`
//! commands, run as they ship, and the checks the power cuts owe them:
//! the spout emits every record at least once and never re-reads a file it
//! moved to done; election terms (epochs) are never reused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::rig::Rig;
use super::work::spout_lines;

pub const SPOUT_SRC: &str = "sp/src";
pub const SPOUT_DONE: &str = "sp/done";
pub const ELECTION: &str = "el";

/// Names of the regular files directly in `dir` (empty if it is missing).
pub fn files_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Starts a spout instance writing its records to `out`.
pub fn start_spout(rig: &Rig, id: &str, out: &Path, once: bool) -> std::io::Result<Child> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    let mut c = Command::new(&rig.leasefs);
    c.arg("spout")
        .arg(rig.mnt.join(SPOUT_SRC))
        .arg("--done")
        .arg(rig.mnt.join(SPOUT_DONE))
        .args([
            "--lock-timeout",
            "1",
            "--commit-count",
            "7",
            "--commit-sec",
            "0.3",
        ])
        .args(["--renew-ms", "200", "--id", id]);
    if once {
        c.arg("--once");
    }
    c.stdout(f).stderr(Stdio::null()).spawn()
}

/// The spout's record lines: file name -> lines emitted (with repeats).
pub fn emitted(out: &Path) -> BTreeMap<String, BTreeSet<u64>> {
    let mut m: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for l in std::fs::read_to_string(out).unwrap_or_default().lines() {
        let w: Vec<&str> = l.split(' ').collect();
        if let [name, "line", j] = w.as_slice()
            && let Ok(j) = j.parse()
        {
            m.entry(name.to_string()).or_default().insert(j);
        }
    }
    m
}

/// Files of the spout's done directory that this run's records came from:
/// a spout never re-reads a file that was in done when it started.
pub fn rereads(out: &Path, done_at_start: &BTreeSet<String>) -> Vec<String> {
    emitted(out)
        .keys()
        .filter(|n| done_at_start.contains(*n))
        .map(|n| format!("spout re-read {n}, which it had moved to done before the cut"))
        .collect()
}

/// After the last round: runs `spout --once` until nothing is left, then
/// checks that every record of every published file (acknowledged, or in
/// the done directory) was emitted at least once over the whole run.
pub fn drain_and_check(
    rig: &Rig,
    outs: &[PathBuf],
    published: &BTreeMap<String, u64>,
) -> Vec<String> {
    let mut p = Vec::new();
    let last = rig.work.join("spout-drain.out");
    match start_spout(rig, "drain", &last, true) {
        Ok(mut c) => {
            let pid = c.id();
            let done = super::rig::wait_until(Duration::from_secs(60), || {
                matches!(c.try_wait(), Ok(Some(_)))
            });
            if !done {
                super::rig::kill9(pid);
                let _ = c.wait();
                p.push("spout --once did not finish within 60 s".into());
            }
        }
        Err(e) => p.push(format!("cannot run spout --once: {e}")),
    }
    let mut all: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for o in outs.iter().chain([&last]) {
        for (n, lines) in emitted(o) {
            all.entry(n).or_default().extend(lines);
        }
    }
    let done_dir = rig.mnt.join(SPOUT_DONE);
    let mut want: BTreeMap<String, u64> = published.clone();
    for name in files_in(&done_dir) {
        let text = std::fs::read_to_string(done_dir.join(&name)).unwrap_or_default();
        let (base, lines) = done_file(&name, &text);
        if text != spout_lines(&base, lines) {
            p.push(format!(
                "{SPOUT_DONE}/{name}: not the complete file that was published"
            ));
        }
        let w = want.entry(base).or_insert(lines);
        *w = (*w).max(lines);
    }
    for (name, lines) in &want {
        let got = all.get(name).map(|s| s.len() as u64).unwrap_or(0);
        if got < *lines {
            let missing: Vec<u64> = (0..*lines)
                .filter(|j| !all.get(name).is_some_and(|s| s.contains(j)))
                .take(5)
                .collect();
            p.push(format!(
                "spout emitted {got} of the {lines} records of {name} (missing e.g. {missing:?})"
            ));
        }
    }
    let src = rig.mnt.join(SPOUT_SRC);
    // (A staged `.ignore` file whose publisher was killed is no candidate.)
    let left: Vec<String> = files_in(&src)
        .into_iter()
        .filter(|n| !n.ends_with(".ignore"))
        .collect();
    if !left.is_empty() {
        p.push(format!("spout --once left files in {SPOUT_SRC}: {left:?}"));
    }
    let bad: Vec<String> = files_in(&src.join(".bad")).into_iter().collect();
    if !bad.is_empty() {
        p.push(format!("spout moved files to its bad directory: {bad:?}"));
    }
    p
}

/// Checks files of the done directory as the final check does (each the
/// complete file that was published), records their lines in `published`
/// for the final at-least-once check, and removes them durably.
pub fn retire_done(
    rig: &Rig,
    names: &[String],
    published: &mut BTreeMap<String, u64>,
) -> Vec<String> {
    let mut p = Vec::new();
    if names.is_empty() {
        return p;
    }
    let done_dir = rig.mnt.join(SPOUT_DONE);
    for name in names {
        let path = done_dir.join(name);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                p.push(format!("{SPOUT_DONE}/{name}: cannot read it: {e}"));
                continue;
            }
        };
        let (base, lines) = done_file(name, &text);
        if text != spout_lines(&base, lines) {
            p.push(format!(
                "{SPOUT_DONE}/{name}: not the complete file that was published"
            ));
            continue;
        }
        let w = published.entry(base).or_insert(lines);
        *w = (*w).max(lines);
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::File::open(&done_dir).and_then(|f| f.sync_all());
    p
}

/// The published name of done file `name` (`NAME.1` when the name was
/// taken) and its line count.
fn done_file(name: &str, text: &str) -> (String, u64) {
    let base = name.split('.').next().unwrap_or(name).to_string();
    (base, text.lines().count() as u64)
}

/// Starts an elector whose command records its term's epoch in `ack`.
pub fn start_elector(rig: &Rig, id: &str, ack: &Path) -> std::io::Result<Child> {
    let cmd = format!(
        "echo epoch $LEASEFS_EPOCH >> '{}'; exec sleep 3600",
        ack.display()
    );
    Command::new(&rig.leasefs)
        .arg("elect")
        .arg(rig.mnt.join(ELECTION))
        .args(["--id", id, "--retry-ms", "100", "--"])
        .args(["sh", "-c", &cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Terms must begin with strictly increasing epochs, across every cut;
/// the audit table must not hold one epoch for two terms.
pub fn check_terms(rig: &Rig, terms: &[u64]) -> Vec<String> {
    let mut p = Vec::new();
    for w in terms.windows(2) {
        if w[1] <= w[0] {
            p.push(format!(
                "election term epoch {} followed {}: reused or lower",
                w[1], w[0]
            ));
        }
    }
    let out = Command::new(&rig.leasefs)
        .arg("elect")
        .arg(rig.mnt.join(ELECTION))
        .args(["--history", "--json"])
        .output();
    if let Ok(o) = out
        && o.status.success()
    {
        let text = String::from_utf8_lossy(&o.stdout);
        let mut seen = BTreeSet::new();
        // Each elected event's epoch, from the JSON rows.
        for row in text
            .split('{')
            .filter(|r| r.contains("\"event\":\"elected\""))
        {
            if let Some(e) = row
                .split("\"epoch\":")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|d| d.parse::<u64>().ok())
                && !seen.insert(e)
            {
                p.push(format!(
                    "the election audit table records two terms with epoch {e}"
                ));
            }
        }
    }
    p
}
