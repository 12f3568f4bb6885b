//! `leasefs spout SOURCE_DIR --done DIR ...`: the command-line face of
//! [`crate::spout::Spout`]. Records go to stdout or to `--exec CMD`;
//! SIGINT, SIGTERM and SIGHUP stop it at once and cleanly (no more
//! records; an `--exec` command gets EOF and `STOP_GRACE` to finish, then
//! is killed; what it took is committed; exit 0); a second signal exits at
//! once (130).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::fail;
use crate::spout::{self, Emitter, ExecEmitter, Spout, StdoutEmitter};
use crate::sync::{Arc, AtomicBool, Ordering};

#[derive(Args, Debug)]
pub struct SpoutArgs {
    /// Directory whose files are consumed (on a leasefs mount).
    pub source_dir: PathBuf,
    /// Where finished files are moved (same mount).
    #[arg(long)]
    pub done: PathBuf,
    /// Where files that are not UTF-8 text (or unreadable) are moved
    /// [default: SOURCE_DIR/.bad].
    #[arg(long)]
    pub bad: Option<PathBuf>,
    /// Lock directory [default: SOURCE_DIR/.lock].
    #[arg(long)]
    pub lock_dir: Option<PathBuf>,
    /// Seconds a lock file must be idle before another instance may take it
    /// over (and only once its owner's lease is gone).
    #[arg(long, default_value_t = 300.0, value_name = "SECS")]
    pub lock_timeout: f64,
    /// Record progress every N records (0: by time only).
    #[arg(long, default_value_t = spout::DEFAULT_COMMIT_COUNT, value_name = "N")]
    pub commit_count: u64,
    /// Record progress at least every SECS seconds while records flow.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub commit_sec: f64,
    /// Id written into lock files [default: HOST:PID].
    #[arg(long, value_name = "NAME")]
    pub id: Option<String>,
    /// Write records to the standard input of `sh -c CMD` instead of stdout,
    /// one command per file: a file counts as delivered when CMD exits 0
    /// after reading all of it, or as far as CMD acknowledged by writing
    /// counts of lines handled on fd 3 ($LEASEFS_ACK_FD).
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,
    /// Exit once nothing is left to consume (no file, no lock of any instance).
    #[arg(long)]
    pub once: bool,
    /// Lease renewal period in milliseconds, at most half the mount's soft
    /// limit [default: 1000, or a quarter of the soft limit or half the
    /// lock timeout when shorter].
    #[arg(long, value_name = "MS")]
    pub renew_ms: Option<u64>,
    /// Storm's clocks.insync: `true` decides a lock's idleness by comparing
    /// its times with this host's wall clock; `false` by watching it stay
    /// unchanged for the lock timeout (immune to clock skew and jumps, but
    /// a takeover waits a lock timeout after the instance starts).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub clocks_insync: bool,
    /// Seconds a consumer may go without taking or acknowledging a record:
    /// then its leases are no longer renewed, an --exec command is killed
    /// (whole process tree) and the file is left for another instance;
    /// 0: never [default: the lock timeout].
    #[arg(long, value_name = "SECS")]
    pub progress_timeout: Option<f64>,
    /// At most N records emitted and not yet acknowledged (Storm's
    /// max.outstanding); 0: no bound. Only for commands that acknowledge on
    /// fd 3 (a command that acknowledges only by exiting would wait forever).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_outstanding: u64,
}

/// Set by SIGINT/SIGTERM/SIGHUP; read by the spout between records.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // Second signal: the user means it. Only async-signal-safe calls.
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

fn install_signal_handlers() -> Result<(), String> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only touches an atomic and calls _exit.
        unsafe { sigaction(sig, &action) }.map_err(|e| format!("cannot handle {sig}: {e}"))?;
    }
    Ok(())
}

fn secs(what: &str, v: f64) -> Result<Duration, String> {
    if !v.is_finite() || v <= 0.0 {
        return Err(format!(
            "--{what} must be a number of seconds greater than 0"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

fn build(a: &SpoutArgs) -> Result<Spout, String> {
    let lock_timeout = secs("lock-timeout", a.lock_timeout)?;
    let progress_timeout = match a.progress_timeout {
        None => Some(lock_timeout),
        Some(0.0) => None,
        Some(v) => Some(secs("progress-timeout", v)?),
    };
    let mut s = Spout::new(&a.source_dir, &a.done)
        .lock_timeout(lock_timeout)
        .commit_count(a.commit_count)
        .commit_interval(secs("commit-sec", a.commit_sec)?)
        .progress_timeout(progress_timeout)
        .max_outstanding(a.max_outstanding)
        .clocks_insync(a.clocks_insync)
        .once(a.once);
    if let Some(ms) = a.renew_ms {
        s = s.renew_interval(Duration::from_millis(ms));
    }
    if let Some(b) = &a.bad {
        s = s.bad_dir(b);
    }
    if let Some(l) = &a.lock_dir {
        s = s.lock_dir(l);
    }
    if let Some(id) = &a.id {
        s = s.id(id);
    }
    Ok(s)
}

/// Prints `spout ID: N files done, ...` every few seconds while stderr is
/// a terminal, so a long run shows it is alive.
fn progress_line(spout: &Spout, finished: Arc<AtomicBool>) -> Option<std::thread::JoinHandle<()>> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let progress = spout.progress();
    let id = spout.spout_id().to_string();
    std::thread::Builder::new()
        .name("spout-progress".into())
        .spawn(move || {
            let mut ticks = 0u32;
            while !finished.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                ticks += 1;
                if ticks.is_multiple_of(20) {
                    eprintln!("spout {id}: {}", progress.snapshot());
                }
            }
        })
        .ok()
}

pub fn run(a: SpoutArgs) -> ExitCode {
    super::init_logging("warn");
    let spout = match build(&a) {
        Ok(s) => s,
        Err(e) => return fail(2, e),
    };
    if let Err(e) = install_signal_handlers() {
        return fail(1, e);
    }
    let mut emitter: Box<dyn Emitter> = match &a.exec {
        Some(cmd) => Box::new(ExecEmitter::new(cmd)),
        None => Box::new(StdoutEmitter::stdout()),
    };
    let finished = Arc::new(AtomicBool::new(false));
    let ticker = progress_line(&spout, finished.clone());
    let result = spout.run(emitter.as_mut(), &STOP);
    finished.store(true, Ordering::SeqCst);
    if let Some(t) = ticker {
        let _ = t.join();
        if let Ok(ref stats) = result {
            eprintln!("spout {}: {stats}", spout.spout_id());
        }
    }
    match result {
        Ok(stats) => {
            tracing::info!("spout {}: {stats}", spout.spout_id());
            ExitCode::SUCCESS
        }
        Err(spout::SpoutError::Config(e)) => fail(2, e),
        Err(e) => fail(1, e),
    }
}
