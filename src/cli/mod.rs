//! The `leasefs` command line (README "Using it"). Every failure is one line on
//! stderr and a non-zero exit; nothing here panics on input.

mod client;
mod datanode;
mod elect;
mod fsck;
mod mount;
mod spout;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "leasefs",
    version,
    about = "A FUSE filesystem with HDFS write semantics: one writer per file by lease, replicated blocks, fsync on every replica"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Mount a leasefs filesystem.
    Mount(mount::MountArgs),
    /// Consume a Storm-HdfsSpout-style directory: each file by one instance, every line at least once.
    Spout(spout::SpoutArgs),
    /// List the write leases of a mount.
    Leases {
        mountpoint: PathBuf,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check (and with --repair, fix) every block's replicas and files left open.
    Fsck {
        /// A mounted leasefs (checked through its daemon).
        mountpoint: Option<PathBuf>,
        /// An unmounted data directory (checked offline).
        #[arg(long, conflicts_with = "mountpoint")]
        data: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        #[arg(long)]
        repair: bool,
        /// Check replicas by presence, generation stamp and length, without
        /// reading their checksums (the check every user may run; the deep
        /// one is for root and the user who mounted).
        #[arg(long, conflicts_with = "data")]
        shallow: bool,
        /// With --data: how to reach object-store datanodes (the s3_
        /// options of a mount: `s3_endpoint`, `s3_region`,
        /// `s3_credentials`, ...), over what the last mount of DIR
        /// recorded (DIR/s3-options).
        #[arg(short = 'o', requires = "data", value_name = "s3_key=value,...")]
        o: Vec<String>,
    },
    /// Recover a file's lease now and report whether the file is closed.
    RecoverLease {
        path: PathBuf,
        /// How many times to ask before giving up.
        #[arg(long, default_value_t = 1)]
        retries: u32,
    },
    /// Live statistics of a mount: operations, bytes, fsync latency,
    /// leases, pipeline and datanodes, refreshed every --interval seconds.
    Stats {
        mountpoint: PathBuf,
        /// Seconds between two reports.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Print one report (averages since the mount) and exit.
        #[arg(long)]
        once: bool,
        /// Print the counters as JSON: one object, or one line per interval.
        #[arg(long)]
        json: bool,
    },
    /// Lease-based leader election: lead (running COMMAND) while holding the
    /// lease on ELECTION_DIR/LEADER, follow otherwise.
    Elect(elect::ElectArgs),
    /// Datanode administration: list, add, decommission, remove, balance.
    #[command(subcommand)]
    Datanode(datanode::DatanodeCmd),
}

/// Sets up logging: `RUST_LOG` wins, else `default`.
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.cmd {
        Cmd::Mount(a) => mount::run(a),
        Cmd::Spout(a) => spout::run(a),
        Cmd::Leases { mountpoint, json } => client::leases(&mountpoint, json),
        Cmd::RecoverLease { path, retries } => client::recover_lease(&path, retries),
        Cmd::Elect(a) => elect::run(a),
        Cmd::Datanode(c) => datanode::run(c),
        Cmd::Stats {
            mountpoint,
            interval,
            once,
            json,
        } => stats::run(&mountpoint, interval, once, json),
        Cmd::Fsck {
            mountpoint,
            data,
            json,
            repair,
            shallow,
            o,
        } => fsck::run(
            mountpoint.as_deref(),
            data.as_deref(),
            json,
            fsck::How {
                repair,
                deep: !shallow,
                s3: o,
            },
        ),
    }
}

/// Prints one clear line and returns the exit code.
pub(crate) fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("leasefs: {msg}");
    ExitCode::from(code)
}
