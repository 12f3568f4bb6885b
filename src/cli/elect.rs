//! `leasefs elect`: lease-based leader election on a directory of a mount,
//! and `--history`, the election's audit table. The election itself lives
//! in [`crate::elect`]; this file parses arguments, finds the daemon and
//! turns SIGINT/SIGTERM into a resignation.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use super::client::{ask, find_mount};
use super::fail;
use crate::elect::{Elector, Outcome, TermEnd, Timing, control, leader_file};
use crate::sync::{AtomicBool, Ordering};

#[derive(clap::Args, Debug)]
pub struct ElectArgs {
    /// Election directory on a leasefs mount (created if missing); the
    /// lease is on its LEADER file.
    #[arg(value_name = "ELECTION_DIR")]
    pub dir: PathBuf,
    /// This candidate's name in the election file and the audit table.
    #[arg(long, required_unless_present = "history")]
    pub id: Option<String>,
    /// Print the election's audit table (time, event, who, host:pid,
    /// epoch, why) and exit.
    #[arg(long)]
    pub history: bool,
    /// With --history: a JSON array instead of a table.
    #[arg(long, requires = "history")]
    pub json: bool,
    /// With --history: the last N events (default 100).
    #[arg(long, value_name = "N", requires = "history", conflicts_with = "all")]
    pub last: Option<usize>,
    /// With --history: every event the audit table keeps.
    #[arg(long, requires = "history")]
    pub all: bool,
    /// How long a lease lives unrenewed, in milliseconds: the mount's soft
    /// limit (the default, read from the mount root). A smaller value only
    /// makes the leader give up earlier; a larger one is refused.
    #[arg(long, value_name = "MS")]
    pub lease_ms: Option<u64>,
    /// How often the leader renews (default: lease/4).
    #[arg(long, value_name = "MS")]
    pub renew_ms: Option<u64>,
    /// A leader that has not renewed for this long stops its command and
    /// steps down (default: lease*2/3).
    #[arg(long, value_name = "MS")]
    pub renew_deadline_ms: Option<u64>,
    /// How often a follower tries to take the lease.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub retry_ms: u64,
    /// Exit when the first term ends, with the command's exit status (1 if
    /// leadership was lost), instead of competing again.
    #[arg(long)]
    pub once: bool,
    /// The leader's command (after `--`), run while leading with
    /// LEASEFS_EPOCH, LEASEFS_ELECTION and LEASEFS_ID set.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Set by SIGINT/SIGTERM; the elector resigns and exits.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(a: ElectArgs) -> ExitCode {
    super::init_logging("info");
    if a.history {
        let n = if a.all {
            0
        } else {
            a.last.unwrap_or(100).max(1)
        };
        return history(&a.dir, a.json, n);
    }
    let Some(id) = a.id.clone().filter(|i| !i.is_empty()) else {
        return fail(2, "elect: --id NAME is required");
    };
    // Refuse a path outside any leasefs mount before creating anything.
    let existing = a
        .dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("."));
    if let Err(e) = find_mount(existing) {
        return fail(2, format!("elect: {e}"));
    }
    if let Err(e) = std::fs::create_dir_all(&a.dir) {
        return fail(2, format!("elect: {}: {e}", a.dir.display()));
    }
    let (mountpoint, dir_in_mount) = match find_mount(&a.dir) {
        Ok(m) => m,
        Err(e) => return fail(2, format!("elect: {e}")),
    };
    let dir = match std::fs::canonicalize(&a.dir) {
        Ok(d) => d,
        Err(e) => return fail(2, format!("elect: {}: {e}", a.dir.display())),
    };
    let ms = Duration::from_millis;
    let soft = leader_file::mount_soft_limit(&mountpoint);
    let lease = match (a.lease_ms.map(ms), soft) {
        (Some(l), Some(s)) if l > s => {
            return fail(
                2,
                format!(
                    "elect: --lease-ms {} exceeds the mount's soft limit ({} ms): a leader could outlive its lease",
                    l.as_millis(),
                    s.as_millis()
                ),
            );
        }
        (Some(l), _) => l,
        (None, Some(s)) => s,
        (None, None) => {
            tracing::warn!(
                "the mount does not show its soft limit; assuming 60000 ms (give --lease-ms)"
            );
            ms(60_000)
        }
    };
    let mut timing = Timing::from_lease(lease, ms(a.retry_ms));
    if let Some(r) = a.renew_ms {
        timing.renew_interval = ms(r);
    }
    if let Some(d) = a.renew_deadline_ms {
        timing.renew_deadline = ms(d);
        timing.kill_grace = timing
            .kill_grace
            .min(timing.lease.saturating_sub(ms(d) + timing.margin) / 2);
    }
    if let Err(e) = timing.validate() {
        return fail(2, format!("elect: {e}"));
    }
    // Every request is bounded: a stalled daemon must not hold the leader
    // (the watchdog stops its command regardless; this keeps it moving).
    let wait = timing.renew_interval.clamp(ms(1000), ms(5000));
    let ctl = move |req: Value| ask_within(&mountpoint, req, wait);
    // Fail now, in one line, if the daemon cannot keep the audit table.
    if let Err(e) = control::history(&ctl, &dir_in_mount) {
        return fail(2, format!("elect: the leasefs daemon does not answer: {e}"));
    }
    if let Err(e) = install_stop_handlers() {
        return fail(2, format!("elect: cannot install signal handlers: {e}"));
    }
    let mut elector = Elector::new(dir, dir_in_mount, id, a.command, timing);
    elector.once = a.once;
    match elector.run(&ctl, &STOP) {
        Ok(Outcome::Stopped) | Ok(Outcome::Once(TermEnd::Stopped)) => ExitCode::SUCCESS,
        Ok(Outcome::Once(TermEnd::Resigned(exit))) => {
            ExitCode::from(exit.map_or(0, |e| e.code().clamp(0, 255)) as u8)
        }
        Ok(Outcome::Once(TermEnd::Lost(_))) => ExitCode::from(1),
        Err(e) => fail(2, format!("elect: {e}")),
    }
}

/// [`ask`] on a thread of its own, answered within `wait` or not at all
/// (the thread stays blocked on the daemon until it answers, then ends).
fn ask_within(mountpoint: &Path, req: Value, wait: Duration) -> Result<Value, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let mnt = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("elect-control".into())
        .spawn(move || {
            let _ = tx.send(ask(&mnt, req));
        })
        .map_err(|e| format!("cannot start a thread for the control request: {e}"))?;
    rx.recv_timeout(wait).unwrap_or_else(|_| {
        Err(format!(
            "the daemon did not answer within {} ms",
            wait.as_millis()
        ))
    })
}

/// SIGINT and SIGTERM set [`STOP`]; the loops look at it every few tens of
/// milliseconds. No SA_RESTART is needed: every wait is a short sleep.
fn install_stop_handlers() -> nix::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let act = SigAction::new(
        SigHandler::Handler(on_stop_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe { sigaction(sig, &act) }?;
    }
    Ok(())
}

/// The last `n` events of the election (0: all of them).
fn history(dir: &Path, as_json: bool, n: usize) -> ExitCode {
    let (mountpoint, dir_in_mount) = match find_mount(dir) {
        Ok(m) => m,
        Err(e) => return fail(2, format!("elect: {e}")),
    };
    let ctl = |req: Value| ask(&mountpoint, req);
    let events = match control::history_last(&ctl, &dir_in_mount, Some(n)) {
        Ok(e) => e,
        Err(e) => return fail(2, format!("elect: {e}")),
    };
    if as_json {
        match serde_json::to_string(&events) {
            Ok(s) => println!("{s}"),
            Err(e) => return fail(2, format!("elect: {e}")),
        }
        return ExitCode::SUCCESS;
    }
    println!("{}", control::format_header());
    for e in &events {
        println!("{}", control::format_event(e));
    }
    ExitCode::SUCCESS
}
