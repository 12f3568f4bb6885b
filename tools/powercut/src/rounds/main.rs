//! `powercut-rounds`: power cuts against leasefs. Each round starts a
//! workload (plus a background append stream) on a leasefs mount whose
//! data directory and datanodes live on a `powercut` filesystem, cuts the
//! power at a random moment (every process killed, every change the disk
//! was not asked to make durable dropped), mounts both again and checks:
//!
//! - every byte acknowledged by fsync reads back, and every file closed
//!   and fsynced reads at its full length, without EIO;
//! - `leasefs fsck` is clean once the first housekeeping round has run,
//!   and never reports a block that no datanode holds;
//! - the epoch of the next grant is above every epoch granted before;
//! - the spout never re-reads a file it had moved to done (and, after the
//!   last round, has emitted every record at least once);
//! - election terms never reuse an epoch.
//!
//! ```text
//! powercut-rounds run [--rounds N] [--seed S] [--work DIR] [--keep-going]
//! ```
//!
//! A file `stop` in the work directory ends the run cleanly after the
//! current round (final checks and unmounts included), for a long run that
//! must give the machine back.
//!
//! Workloads: append, reopen, truncate, rename-over, unlink, small,
//! pipeline (a datanode fails mid-write: ENOSPC or EIO injected by the
//! powercut filesystem, or EIO of its syncs alone), lease (a client-renewed holder stops renewing; a
//! second writer takes over after the soft limit), spout, elect.

mod content;
mod coord;
mod model;
mod rig;
mod work;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use content::Rng;
use model::Model;
use rig::Rig;

/// What the daemon logs when a replica's sync fails (and the replica
/// leaves its block: `pipeline::durable`).
const FAILED_SYNC: &str = "replica sync failed";

/// The pipeline workload's fault that fails a datanode's syncs alone.
const SYNC_FAULT: &str = "EIO --sync";

#[derive(Parser)]
#[command(
    name = "powercut-rounds",
    about = "Power cuts against leasefs, checked"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run power-cut rounds.
    Run {
        #[arg(long, default_value_t = 50)]
        rounds: usize,
        /// Replays a run [default: from the clock].
        #[arg(long)]
        seed: Option<u64>,
        /// Work directory (kept after a failure) [default: a new one in /var/tmp].
        #[arg(long)]
        work: Option<PathBuf>,
        /// The leasefs binary [default: LEASEFS_BIN, else next to this one].
        #[arg(long)]
        leasefs: Option<PathBuf>,
        /// Count failing rounds and go on instead of stopping at the first.
        #[arg(long)]
        keep_going: bool,
        /// Where the data directory and the datanodes live: `plain`,
        /// directories on the powercut FUSE mount (replicas synced file by
        /// file); `ext4` or `xfs`, a filesystem each on a loop device whose
        /// image is on the powercut mount (ranged syncs, zero fill, syncfs:
        /// the paths users run).
        #[arg(long, default_value = "plain", value_parser = ["plain", "ext4", "xfs"])]
        fs: String,
    },
    /// One workload process (started by `run`).
    Work(work::WorkArgs),
}

const KINDS: [&str; 10] = [
    "append",
    "reopen",
    "truncate",
    "rename-over",
    "unlink",
    "small",
    "pipeline",
    "lease",
    "spout",
    "elect",
];

/// Files appended to are retired (removed) past this size.
const RETIRE: u64 = 3 << 20;

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Work(a) => work::run(a),
        Cmd::Run {
            rounds,
            seed,
            work,
            leasefs,
            keep_going,
            fs,
        } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
            let fs = (fs != "plain").then_some(fs);
            match run(rounds, seed, work, leasefs, keep_going, fs) {
                Ok(0) => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("powercut-rounds: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A workload or command started this round, and how to read its acks.
struct Started {
    child: Child,
    ack: Option<(PathBuf, String, bool)>,
}

struct Run {
    rig: Rig,
    model: Model,
    rng: Rng,
    /// Generation of each file slot (bumped when a file is retired).
    slots: BTreeMap<&'static str, u64>,
    spout_outs: Vec<PathBuf>,
    /// The spout's done directory at the start of the last spout round.
    spout_checked: std::collections::BTreeSet<String>,
    counts: BTreeMap<&'static str, usize>,
    /// Pipeline rounds whose datanode's syncs failed, and how many of
    /// those failures the daemon met before the cut.
    sync_faults: (usize, usize),
    dropped: Vec<String>,
    /// Fast-path counters summed over the rounds' daemons (read before
    /// each cut): ranged syncs, full syncs, zero fills, one-step replicas
    /// at close and at fsync, closes committed on the request's thread,
    /// replies a ring polled for, replica reads past the page cache,
    /// replicas the block journal kept (of small files fsynced or, at R>1,
    /// closed) and that it rewrote, and
    /// journaled replicas held in memory until needed on disk, and the
    /// replicas a mount had housekeeping check for what a cut tore, and
    /// those synced at a close behind a move of the flush marks, and the
    /// closes after a whole fsync left for the store's next commit.
    fast: [u64; FAST.len()],
    /// Rounds whose cut kept a random subset of the pending sectors.
    subset_cuts: usize,
}

const FAST: [&str; 14] = [
    "ranged syncs",
    "full syncs",
    "zero fills",
    "one-step replicas",
    "one-step fsyncs",
    "closes on the caller's thread",
    "replies a FUSE ring polled for",
    "replica reads past the page cache",
    "small-file replicas the block journal kept (fsyncs, closes)",
    "replicas rewritten from the block journal at mount",
    "journaled replicas held in memory until needed on disk",
    "replicas written since the flush mark, checked after a mount",
    "replicas of blocks open across a move of the flush marks, synced at close",
    "closes after a whole fsync left for the next commit",
];

fn run(
    rounds: usize,
    seed: u64,
    work: Option<PathBuf>,
    leasefs: Option<PathBuf>,
    keep_going: bool,
    fs: Option<String>,
) -> Result<usize, String> {
    let own_work = work.is_none();
    let work = match work {
        Some(w) => w,
        None => PathBuf::from(format!("/var/tmp/powercut-rounds.{}", std::process::id())),
    };
    let leasefs = leasefs
        .or_else(|| std::env::var_os("LEASEFS_BIN").map(PathBuf::from))
        .unwrap_or_else(|| sibling("leasefs"));
    let disks = fs.clone().unwrap_or_else(|| "plain".into());
    let rig = Rig::new(&work, sibling("powercut"), leasefs, fs).map_err(|e| e.to_string())?;
    println!(
        "powercut-rounds: {rounds} rounds, seed {seed}, disks {disks}, work {}",
        work.display()
    );
    let mut r = Run {
        rig,
        model: Model::default(),
        rng: Rng::new(seed),
        slots: BTreeMap::new(),
        spout_outs: Vec::new(),
        spout_checked: Default::default(),
        counts: BTreeMap::new(),
        sync_faults: (0, 0),
        dropped: Vec::new(),
        fast: [0; FAST.len()],
        subset_cuts: 0,
    };
    r.rig.power_on()?;
    r.mount()?;
    let mut failures = 0;
    let started = Instant::now();
    let stop = r.rig.work.join("stop");
    for round in 0..rounds {
        if stop.exists() {
            println!(
                "powercut-rounds: {} exists: stopping after {round} rounds",
                stop.display()
            );
            break;
        }
        let kind = KINDS[(round + (seed % 10) as usize) % KINDS.len()];
        *r.counts.entry(kind).or_default() += 1;
        let problems = r.round(round, kind)?;
        if !problems.is_empty() {
            failures += 1;
            println!("round {round} ({kind}) FAILED:");
            for p in &problems {
                println!("  {p}");
            }
            let log = r.rig.work.join("logs/leasefs.log");
            println!("  (daemon logs: {})", log.display());
            if !keep_going {
                break;
            }
        }
    }
    r.rig.shutdown();
    // The final checks on a clean mount.
    let mut last = Vec::new();
    if failures == 0 || keep_going {
        r.rig.power_on()?;
        r.mount()?;
        last = coord::drain_and_check(&r.rig, &r.spout_outs, &r.model.published);
        last.extend(coord::check_terms(&r.rig, &r.model.terms));
        last.extend(r.fsck_clean());
        r.rig.shutdown();
        // On ext4 and XFS the rounds exist to exercise the fast paths:
        // a run long enough to reach each of them that did not is a
        // failure of the test itself.
        if r.rig.fs.is_some() && r.counts.values().sum::<usize>() >= 20 {
            // Full syncs may not be needed; ring polls need the rings; a cut
            // may find every journaled replica on disk (the rewrites are
            // reported, not required).
            let rings = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
                .is_ok_and(|v| v.trim() == "Y");
            for (i, name) in FAST.iter().enumerate() {
                if r.fast[i] == 0 && i != 1 && i != 9 && (i != 6 || rings) {
                    last.push(format!("no {name} in the whole run on {disks}"));
                }
            }
        }
        for p in &last {
            println!("final check FAILED: {p}");
        }
    }
    let per: Vec<String> = r.counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let fast: Vec<String> = FAST
        .iter()
        .zip(r.fast)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!(
        "powercut-rounds: fast paths run before the cuts on {disks}: {}; {} of the cuts kept a random subset of the pending sectors; {} datanodes whose syncs failed, {} of those failures met by a replica's sync before the cut",
        fast.join(", "),
        r.subset_cuts,
        r.sync_faults.0,
        r.sync_faults.1
    );
    println!(
        "powercut-rounds: {} rounds in {:.0} s (seed {seed}, disks {disks}): {failures} failed{}; rounds per workload: {}",
        r.counts.values().sum::<usize>(),
        started.elapsed().as_secs_f64(),
        if last.is_empty() {
            ""
        } else {
            ", final checks failed"
        },
        per.join(", ")
    );
    if failures == 0 && last.is_empty() {
        // A run that found nothing leaves nothing (a failed one keeps its
        // logs, acknowledgement files and disk for a look).
        let _ = std::fs::remove_dir_all(r.rig.work.join("backing"));
        if own_work {
            let _ = std::fs::remove_dir_all(&r.rig.work);
        }
    } else {
        println!("powercut-rounds: kept {}", r.rig.work.display());
    }
    Ok(failures + last.len())
}

impl Run {
    /// Mounts leasefs (each mount picks how replicas are synced) and makes
    /// the workload directories (durably).
    fn mount(&mut self) -> Result<(), String> {
        let sync = if self.rng.chance(0.5) { "fs" } else { "file" };
        let o = format!(
            "soft_limit=1,monitor_interval=0.2,housekeeping_interval=1,block_size=256K,replica_sync={sync}"
        );
        self.rig.mount(&o)?;
        for d in [
            "a",
            "r",
            "u",
            "s",
            "l",
            coord::SPOUT_SRC,
            coord::SPOUT_DONE,
            coord::ELECTION,
        ] {
            let p = self.rig.mnt.join(d);
            if !p.exists() {
                std::fs::create_dir_all(&p).map_err(|e| format!("mkdir {d}: {e}"))?;
                for q in [p.parent().unwrap_or(&p), &p] {
                    let _ = std::fs::File::open(q).and_then(|f| f.sync_all());
                }
            }
        }
        Ok(())
    }

    fn slot(&mut self, s: &'static str) -> String {
        format!("{s}{}", self.slots.entry(s).or_insert(0))
    }

    fn spawn_work(
        &mut self,
        round: usize,
        kind: &str,
        dir: &str,
        name: &str,
        start: u64,
    ) -> Result<Started, String> {
        let ack = self
            .rig
            .work
            .join(format!("acks/{round}-{kind}-{name}.ack"));
        let child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .args(["work", kind, "--name", name])
            .arg("--dir")
            .arg(self.rig.mnt.join(dir))
            .arg("--ack")
            .arg(&ack)
            .args([
                "--seed",
                &self.rng.next().to_string(),
                "--start",
                &start.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start workload {kind}: {e}"))?;
        Ok(Started {
            child,
            ack: Some((ack, dir.to_string(), false)),
        })
    }

    /// One round: start, wait a random while, cut, remount, check.
    fn round(&mut self, round: usize, kind: &'static str) -> Result<Vec<String>, String> {
        let mut started = Vec::new();
        let bg = self.slot("bg");
        started.push(self.spawn_work(round, "append", "a", &bg, 0)?);
        let (lo, hi) = match kind {
            "lease" => (600, 3500),
            "spout" | "elect" => (500, 2500),
            _ => (250, 1500),
        };
        let run_ms = self.rng.range(lo, hi);
        let mut done_before = Default::default();
        let mut fault = None;
        match kind {
            "append" | "reopen" | "truncate" => {
                let slot = match kind {
                    "append" => "ap",
                    "reopen" => "ro",
                    _ => "tr",
                };
                let name = self.slot(slot);
                let k = if kind == "append" { "append" } else { kind };
                started.push(self.spawn_work(round, k, "a", &name, 0)?);
            }
            "rename-over" => {
                let name = "ren".to_string();
                let start = *self.model.next.get(&name).unwrap_or(&1);
                started.push(self.spawn_work(round, "rename-over", "r", &name, start)?);
            }
            "unlink" => {
                let name = format!("u{round}");
                started.push(self.spawn_work(round, "unlink", "u", &name, 0)?);
            }
            "small" => {
                let name = format!("s{round}");
                started.push(self.spawn_work(round, "small", "s", &name, 0)?);
            }
            "pipeline" => {
                let name = self.slot("pl");
                started.push(self.spawn_work(round, "append", "a", &name, 0)?);
                let dn = self.rng.range(1, 3);
                // A full disk, a dead one, or one whose writes succeed
                // and whose syncs (on ext4 and XFS: its cache flushes)
                // fail, as fsyncgate's.
                let errno = match self.rng.below(3) {
                    0 => "ENOSPC",
                    1 => "EIO",
                    _ => SYNC_FAULT,
                };
                fault = Some((
                    self.rng.range(run_ms / 4, run_ms * 3 / 4),
                    format!("dn{dn}"),
                    errno,
                ));
            }
            "lease" => {
                let name = format!("l{round}");
                started.push(self.spawn_work(round, "lease", "l", &name, 0)?);
                // The taker starts once the holder has the lease (its first
                // ack line: its epoch, or the error it stopped on), however
                // late a loaded machine runs it.
                if let Some((ack, ..)) = started.last().and_then(|s| s.ack.as_ref()) {
                    let deadline = std::time::Instant::now() + Duration::from_secs(60);
                    while std::fs::read_to_string(ack).map_or(true, |t| t.is_empty())
                        && std::time::Instant::now() < deadline
                    {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                started.push(self.spawn_work(round, "take", "l", &name, 0)?);
            }
            "spout" => {
                let next = *self.model.next.get("spout").unwrap_or(&0);
                self.model.next.insert("spout".into(), next + 1000);
                started.push(self.spawn_work(round, "publish", coord::SPOUT_SRC, "s", next)?);
                done_before = coord::files_in(&self.rig.mnt.join(coord::SPOUT_DONE));
                let out = self.rig.work.join(format!("acks/{round}-spout.out"));
                for i in 0..2 {
                    let c = coord::start_spout(&self.rig, &format!("sp{round}-{i}"), &out, false)
                        .map_err(|e| format!("cannot start spout: {e}"))?;
                    started.push(Started {
                        child: c,
                        ack: None,
                    });
                }
                self.spout_outs.push(out);
            }
            "elect" => {
                let ack = self.rig.work.join(format!("acks/{round}-terms.ack"));
                for i in 0..2 {
                    let c = coord::start_elector(&self.rig, &format!("e{round}-{i}"), &ack)
                        .map_err(|e| format!("cannot start elect: {e}"))?;
                    started.push(Started {
                        child: c,
                        ack: None,
                    });
                }
                started[1].ack = Some((ack, coord::ELECTION.into(), true));
            }
            _ => {}
        }
        let t0 = Instant::now();
        let failed_syncs = || self.rig.daemon_log().matches(FAILED_SYNC).count();
        let syncs_before = fault
            .as_ref()
            .filter(|(.., errno)| *errno == SYNC_FAULT)
            .map(|_| failed_syncs());
        if let Some((at, dn, errno)) = &fault {
            std::thread::sleep(Duration::from_millis(*at));
            self.rig.control(&format!("fail {dn} {errno}"))?;
        }
        let rest = Duration::from_millis(run_ms).saturating_sub(t0.elapsed());
        std::thread::sleep(rest);
        if let Some(before) = syncs_before {
            self.sync_faults.0 += 1;
            self.sync_faults.1 += usize::from(failed_syncs() > before);
        }

        // The cut.
        let mut children: Vec<Child> = Vec::new();
        let mut acks = Vec::new();
        for s in started {
            children.push(s.child);
            acks.extend(s.ack);
        }
        let fast = self.rig.fast_paths();
        for (sum, n) in self.fast.iter_mut().zip(fast) {
            *sum += n;
        }
        // Half the cuts keep a random subset of what was pending.
        let subset = self.rng.chance(0.5).then(|| self.rng.next());
        self.subset_cuts += usize::from(subset.is_some());
        let dropped = self.rig.cut(&mut children, round, subset)?;
        self.dropped.push(dropped.clone());
        let max_before = self.model.max_epoch;
        let mut problems = Vec::new();
        let mut granted = Vec::new();
        for (path, dir, is_term) in &acks {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let (p, epochs) = self.model.apply(dir, &text, *is_term);
            problems.extend(p);
            self.model.max_epoch = self
                .model
                .max_epoch
                .max(epochs.iter().copied().max().unwrap_or(0));
            granted.push(epochs);
        }
        // The lease round's holder, then the writer that took over.
        if kind == "lease"
            && let [.., held, taken] = granted.as_slice()
            && let (Some(h), Some(t)) = (held.first(), taken.first())
            && t <= h
        {
            problems.push(format!(
                "the writer after the soft limit got epoch {t}, not above {h}"
            ));
        }

        // Power back on.
        self.rig.power_on()?;
        if let Err(e) = self.mount() {
            problems.push(e);
            return Ok(problems);
        }
        let t_up = Instant::now();
        problems.extend(self.model.check(&self.rig.mnt));
        if kind == "spout" {
            let out = self.spout_outs.last().cloned().unwrap_or_default();
            problems.extend(coord::rereads(&out, &done_before));
            // Files in done at the start of the previous spout round have
            // now been checked in two rounds: their records join the final
            // at-least-once check and the files go (the disk stays bounded).
            let old = std::mem::replace(&mut self.spout_checked, done_before.clone());
            let both: Vec<String> = old.intersection(&done_before).cloned().collect();
            problems.extend(coord::retire_done(
                &self.rig,
                &both,
                &mut self.model.published,
            ));
        }
        if kind == "elect" {
            problems.extend(coord::check_terms(&self.rig, &self.model.terms));
        }
        let epoch = self.probe_epoch();
        match epoch {
            Ok(e) if e > self.model.max_epoch => self.model.max_epoch = e,
            Ok(e) => problems.push(format!(
                "a write lease after the cut got epoch {e}, not above {} granted before it",
                self.model.max_epoch
            )),
            Err(e) => problems.push(format!("cannot open a file for writing after the cut: {e}")),
        }
        let fsck = self.fsck_clean();
        let clean_after = t_up.elapsed();
        problems.extend(fsck);
        self.retire();
        let mut dirs = std::collections::BTreeSet::new();
        for (dir, name) in self.model.trim(500) {
            let _ = std::fs::remove_file(self.rig.mnt.join(&dir).join(name));
            dirs.insert(dir);
        }
        // Durably: a cut must not bring back files nothing checks or removes.
        for dir in dirs {
            let _ = std::fs::File::open(self.rig.mnt.join(dir)).and_then(|f| f.sync_all());
        }
        println!(
            "round {round} {kind}: cut after {run_ms} ms ({}); fast paths {fast:?}; epochs {max_before}..{}; fsck clean after {:.1} s",
            dropped,
            self.model.max_epoch,
            clean_after.as_secs_f64()
        );
        let _ = std::io::stdout().flush();
        Ok(problems)
    }

    /// The epoch of a fresh write lease.
    fn probe_epoch(&self) -> Result<u64, String> {
        let p = self.rig.mnt.join("epoch-probe");
        let f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&p)
            .map_err(|e| e.to_string())?;
        work::epoch_of(&f).map_err(|e| e.to_string())
    }

    /// `leasefs fsck` until clean (housekeeping repairs what a cut left:
    /// replicas to copy again, orphans), never with a missing block.
    fn fsck_clean(&self) -> Vec<String> {
        let mut last = String::new();
        let mut p = Vec::new();
        let ok = rig::wait_until(Duration::from_secs(15), || {
            let out = Command::new(&self.rig.leasefs)
                .arg("fsck")
                .arg(&self.rig.mnt)
                .output();
            let Ok(o) = out else { return false };
            last = String::from_utf8_lossy(&o.stdout).into_owned();
            if last.contains("MissingBlock") && p.is_empty() {
                p.push(format!(
                    "fsck reports a block no datanode holds:\n{}",
                    head(&last)
                ));
            }
            o.status.success()
        });
        if !ok {
            p.push(format!(
                "fsck not clean 15 s after the mount:\n{}",
                head(&last)
            ));
        }
        p
    }

    /// Removes append files past `RETIRE` and starts new ones in their slot.
    fn retire(&mut self) {
        let big: Vec<(String, String)> = self
            .model
            .appended
            .iter()
            .filter(|(n, f)| {
                std::fs::metadata(self.rig.mnt.join(&f.dir).join(n)).is_ok_and(|m| m.len() > RETIRE)
            })
            .map(|(n, f)| (n.clone(), f.dir.clone()))
            .collect();
        for (name, dir) in big {
            let _ = std::fs::remove_file(self.rig.mnt.join(&dir).join(&name));
            self.model.forget(&name);
            for (slot, g) in self.slots.iter_mut() {
                if name == format!("{slot}{g}") {
                    *g += 1;
                }
            }
        }
    }
}

/// The first lines of a long report.
fn head(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = lines
        .iter()
        .take(12)
        .copied()
        .collect::<Vec<_>>()
        .join("\n");
    if lines.len() > 12 {
        out.push_str(&format!("\n... ({} more lines)", lines.len() - 12));
    }
    out
}
