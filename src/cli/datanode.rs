//! `leasefs datanode list | add | decommission | remove | balance`: datanode
//! administration through the daemon's control socket. The work (copies,
//! moves) is the daemon's; `decommission` and `balance` only start it and
//! then follow it with a progress bar (plain lines when stderr is not a
//! terminal), so Ctrl-C stops the waiting, never the work.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::{Value, json};

use super::client::{ask, find_mount};
use super::fail;
use crate::dnadmin::balance::Status;
use crate::dnadmin::{DatanodeInfo, Progress, Removed};
use crate::meta::AdminState;

#[derive(Subcommand, Debug)]
pub enum DatanodeCmd {
    /// Every datanode: storage ID, path, state, used and free bytes, blocks, last heartbeat.
    List {
        mountpoint: PathBuf,
        /// One JSON array of objects.
        #[arg(long)]
        json: bool,
    },
    /// Attach a directory to the running mount: new blocks may use it at once.
    Add { mountpoint: PathBuf, dir: PathBuf },
    /// Copy every block of a datanode to others until each is held R times elsewhere; waits, with progress.
    /// DIR may also be the datanode's storage ID (DS-...), as `list` shows it.
    Decommission {
        mountpoint: PathBuf,
        dir: PathBuf,
        /// Start (or look at) the decommission and return at once.
        #[arg(long)]
        no_wait: bool,
    },
    /// Drop a datanode from the filesystem (its directory is left alone).
    /// DIR may also be the datanode's storage ID (DS-...), e.g. of a dead one whose path now holds another.
    Remove {
        mountpoint: PathBuf,
        dir: PathBuf,
        /// Remove it even if it holds the only good replica of some blocks (their files lose data).
        #[arg(long)]
        force: bool,
    },
    /// Move replicas until the datanodes' used fractions differ by at most the threshold.
    Balance {
        mountpoint: PathBuf,
        /// Largest allowed difference of used fractions, in percentage points.
        #[arg(long, default_value_t = 10.0)]
        threshold: f64,
        /// Start the balancer and return at once.
        #[arg(long)]
        no_wait: bool,
    },
}

/// How often a waiting command asks the daemon.
const POLL: Duration = Duration::from_millis(500);
/// How often a plain progress line is printed when stderr is no terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

pub fn run(cmd: DatanodeCmd) -> ExitCode {
    let r = match cmd {
        DatanodeCmd::List { mountpoint, json } => list(&mountpoint, json),
        DatanodeCmd::Add { mountpoint, dir } => add(&mountpoint, &dir),
        DatanodeCmd::Decommission {
            mountpoint,
            dir,
            no_wait,
        } => decommission(&mountpoint, &dir, no_wait),
        DatanodeCmd::Remove {
            mountpoint,
            dir,
            force,
        } => remove(&mountpoint, &dir, force),
        DatanodeCmd::Balance {
            mountpoint,
            threshold,
            no_wait,
        } => balance(&mountpoint, threshold, no_wait),
    };
    r.unwrap_or_else(|e| fail(2, e))
}

fn mount_of(m: &Path) -> Result<PathBuf, String> {
    Ok(find_mount(m)?.0)
}

/// The directory as the daemon should see it: absolute, symlinks resolved
/// where it still exists (a failed disk's may not). A storage ID
/// (`DS-...`, as `list` shows it) is passed as it is.
fn absolute(dir: &Path) -> Result<String, String> {
    if let Some(id) = dir.to_str().filter(|s| s.starts_with("DS-")) {
        return Ok(id.to_string());
    }
    if let Some(url) = dir.to_str().filter(|_| crate::storage::s3::is_s3(dir)) {
        return crate::storage::s3::parse_url(url).map(|u| u.to_url());
    }
    let p = std::fs::canonicalize(dir)
        .or_else(|_| std::path::absolute(dir))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{}: not a UTF-8 path", dir.display()))
}

fn field<T: serde::de::DeserializeOwned>(v: &Value, name: &str) -> Result<T, String> {
    serde_json::from_value(v[name].clone()).map_err(|e| format!("bad answer from the daemon: {e}"))
}

fn list(m: &Path, as_json: bool) -> Result<ExitCode, String> {
    let v = ask(&mount_of(m)?, json!({"op": "datanode_list"}))?;
    if as_json {
        println!("{}", v["datanodes"]);
        return Ok(ExitCode::SUCCESS);
    }
    let list: Vec<DatanodeInfo> = field(&v, "datanodes")?;
    println!(
        "{:>3} {:<40} {:<16} {:>10} {:>10} {:>5} {:>8} {:>9}  PATH",
        "ID", "STORAGE", "STATE", "USED", "FREE", "USE%", "BLOCKS", "HEARTBEAT"
    );
    let now = crate::clock::wall_ms();
    for d in list {
        let pct = d
            .capacity_bytes
            .filter(|c| *c > 0)
            .map(|c| format!("{:.1}", d.used_bytes as f64 * 100.0 / c as f64))
            .unwrap_or_else(|| "-".into());
        let beat = d
            .last_heartbeat_ms
            .map(|t| format!("{:.1}s ago", now.saturating_sub(t) as f64 / 1000.0))
            .unwrap_or_else(|| "never".into());
        println!(
            "{:>3} {:<40} {:<16} {:>10} {:>10} {:>5} {:>8} {:>9}  {}{}",
            d.id,
            d.storage_id.as_deref().unwrap_or("-"),
            d.state,
            human(d.used_bytes),
            d.free_bytes.map(human).unwrap_or_else(|| "-".into()),
            pct,
            d.blocks,
            beat,
            d.path.display(),
            d.host
                .as_deref()
                .map(|h| format!("  (copies of host {h})"))
                .unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn add(m: &Path, dir: &Path) -> Result<ExitCode, String> {
    // An object-store datanode has no directory to make here.
    let created = if crate::storage::s3::is_s3(dir) {
        Vec::new()
    } else {
        create_dirs(dir)?
    };
    let asked = absolute(dir).and_then(|d| {
        let v = ask(&mount_of(m)?, json!({"op": "datanode_add", "dir": d}))?;
        Ok((d, v))
    });
    // A refused add changes nothing: what it created for the daemon goes.
    if asked.is_err() {
        for c in created.iter().rev() {
            let _ = std::fs::remove_dir(c);
        }
    }
    let (d, v) = asked?;
    println!(
        "datanode {d} attached as id {}: new blocks may use it now",
        v["id"]
    );
    Ok(ExitCode::SUCCESS)
}

/// Creates `dir` and its missing parents; returns those it created, the
/// outermost first.
fn create_dirs(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let missing: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .map(Path::to_path_buf)
        .collect();
    crate::storage::trust::create_private_dirs(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(missing.into_iter().rev().collect())
}

/// A progress display: a bar on a terminal, a line every few seconds
/// otherwise.
struct Display {
    bar: Option<indicatif::ProgressBar>,
    last_line: Option<Instant>,
}

impl Display {
    fn new(total: u64, what: &str) -> Display {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(total);
            let style = indicatif::ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            b.set_style(style);
            b.set_prefix(what.to_string());
            b
        });
        Display {
            bar,
            last_line: None,
        }
    }

    fn show(&mut self, pos: u64, total: u64, msg: String) {
        match &self.bar {
            Some(b) => {
                b.set_length(total);
                b.set_position(pos);
                b.set_message(msg);
            }
            None => {
                if self.last_line.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
                    eprintln!("{pos}/{total} {msg}");
                    self.last_line = Some(Instant::now());
                }
            }
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn decommission(m: &Path, dir: &Path, no_wait: bool) -> Result<ExitCode, String> {
    let mp = mount_of(m)?;
    let d = absolute(dir)?;
    let v = ask(&mp, json!({"op": "datanode_decommission", "dir": d}))?;
    let mut p: Progress = field(&v, "progress")?;
    if no_wait || p.admin == AdminState::Decommissioned {
        return Ok(report_decommission(&d, &p));
    }
    eprintln!(
        "decommissioning {d}: {} block(s) to copy; Ctrl-C stops waiting, not the decommission (run this command again to follow it)",
        p.pending
    );
    let mut display = Display::new(p.blocks, "decommission");
    loop {
        let done = p.blocks - p.pending;
        let mut msg = format!(
            "blocks held R times elsewhere ({} MiB left)",
            p.pending_bytes.div_ceil(1 << 20)
        );
        if p.targets < p.replication {
            msg.push_str(&format!(
                "; waiting: only {} live datanode(s) in service for replication {}",
                p.targets, p.replication
            ));
        }
        display.show(done, p.blocks, msg);
        if p.admin != AdminState::Decommissioning {
            break;
        }
        std::thread::sleep(POLL);
        let v = ask(&mp, json!({"op": "datanode_progress", "id": p.id})).map_err(|e| {
            format!("{e}; the decommission goes on when the filesystem is mounted again: run this command again to follow it")
        })?;
        p = field(&v, "progress")?;
    }
    display.finish();
    Ok(report_decommission(&d, &p))
}

fn report_decommission(d: &str, p: &Progress) -> ExitCode {
    match p.admin {
        AdminState::Decommissioned => {
            println!(
                "{d} is decommissioned: each of its {} block(s) is held {} times by other datanodes; it is safe to remove (leasefs datanode remove)",
                p.blocks, p.replication
            );
            ExitCode::SUCCESS
        }
        AdminState::Decommissioning => {
            println!(
                "{d} is being decommissioned: {} of {} block(s) left to copy",
                p.pending, p.blocks
            );
            ExitCode::SUCCESS
        }
        other => fail(
            1,
            format!(
                "{d} is {} again: its decommission was cancelled",
                other.as_str()
            ),
        ),
    }
}

fn remove(m: &Path, dir: &Path, force: bool) -> Result<ExitCode, String> {
    let d = absolute(dir)?;
    let v = ask(
        &mount_of(m)?,
        json!({"op": "datanode_remove", "dir": d, "force": force}),
    )?;
    let r: Removed = field(&v, "removed")?;
    if r.lost_blocks > 0 {
        eprintln!(
            "leasefs: removed by force: {} block(s) of these {} file(s) lost data:",
            r.lost_blocks,
            r.lost_files.len()
        );
        for f in &r.lost_files {
            println!("{f}");
        }
    } else {
        println!(
            "datanode {} (id {}) removed; its directory was left as it is",
            r.path.display(),
            r.id
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn balance(m: &Path, threshold: f64, no_wait: bool) -> Result<ExitCode, String> {
    let mp = mount_of(m)?;
    let v = ask(
        &mp,
        json!({"op": "datanode_balance", "threshold": threshold}),
    )?;
    let mut s: Status = field(&v, "balance")?;
    if !no_wait && s.running {
        eprintln!("balancing; Ctrl-C stops waiting, not the balancer");
        let mut display = Display::new(0, "balance");
        while s.running {
            display.show(
                s.moved_blocks,
                s.moved_blocks,
                format!(
                    "blocks moved ({} MiB), spread {:.1} points (threshold {})",
                    s.moved_bytes >> 20,
                    s.spread_pct,
                    s.threshold_pct
                ),
            );
            std::thread::sleep(POLL);
            let v = ask(&mp, json!({"op": "datanode_balance_status"}))?;
            s = field(&v, "balance")?;
        }
        display.finish();
    }
    println!(
        "balance: {} block(s) moved ({} MiB); {}",
        s.moved_blocks,
        s.moved_bytes >> 20,
        s.outcome.as_deref().unwrap_or("running")
    );
    Ok(ExitCode::SUCCESS)
}
