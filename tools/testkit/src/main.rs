//! `testkit`: the processes leasefs's integration tests drive (built by
//! `cargo build --release -p testkit`, which mount-scripts/test.sh runs; the
//! tests find it next to the leasefs binary they use, or through
//! `TESTKIT_BIN`). Each is a real process doing exactly the system calls
//! the test asks for, so that the pid the daemon records is the process
//! the test meant and every failure comes back as its errno's name:
//!
//! ```text
//! testkit agent [--sigint-default]        a line-driven program (see agent.rs)
//! testkit append SRC DST --side FILE ...  an appender recording what was fsynced
//! testkit racer PATH ID                   one of several writers released at once
//! testkit hold-open N --hold-ms MS        N processes each holding a file of its own
//! testkit follow PATH OUT TOTAL           a reader following a growing file
//! testkit writers N MIB                   N writer threads, a file each
//! testkit contend PATH TAG THREADS GRANTS threads contending for one file
//! testkit term JOURNAL [...]              a leader's command for the election tests
//! testkit control SOCK REQUEST            one raw request to the control socket
//! testkit control-idle SOCK N             idle connections to the control socket
//! testkit swap A B SECS                   renames back and forth (see hostile.rs)
//! testkit create-race PATH SECS           O_CREAT opens looking for another's file
//! testkit pile PATH N CPU SECS            N threads on one CPU waiting to open PATH
//! testkit probe DIR N CPU                 timed lookups from one CPU
//! testkit fsyncer PATH SECS               fsynced lines, with their latencies
//! testkit tick EVENTS                     a leader's command acting outside the mount
//! testkit lines PATH ID --side FILE       a writer of numbered, fsynced lines
//! testkit proxy TARGET                    a TCP proxy that pauses and cuts on command
//! testkit hold-and-ask LEADER SOCK N REQ  control requests from an election's leader
//! ```

mod agent;
mod append;
mod chaos;
mod control;
mod follow;
mod hostile;
mod load;
mod proxy;
mod race;
mod sys;
mod term;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "testkit",
    about = "The processes leasefs's integration tests drive"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// A program driven line by line: one descriptor, one answer per command.
    Agent {
        /// SIGINT ends the process instead of interrupting the command.
        #[arg(long)]
        sigint_default: bool,
    },
    /// Append SRC's bytes to DST from DST's length, recording fsynced lengths.
    Append {
        src: PathBuf,
        dst: PathBuf,
        /// Where each fsynced length is appended (outside the mount).
        #[arg(long)]
        side: PathBuf,
        #[arg(long, default_value_t = 65536)]
        piece: usize,
        #[arg(long, default_value_t = 0)]
        sleep_ms: u64,
        /// An fsync every N pieces (0: only at the end).
        #[arg(long, default_value_t = 0)]
        fsync_every: usize,
        /// Random pieces, fsyncs and pauses, from this seed.
        #[arg(long)]
        random: Option<u64>,
    },
    /// Once standard input ends, append 1 MiB of ID to PATH.
    Racer { path: PathBuf, id: u32 },
    /// N processes released together, each holding a file of its own.
    HoldOpen {
        n: usize,
        #[arg(long)]
        hold_ms: u64,
    },
    /// Follow PATH as it grows until TOTAL bytes are read; save them to OUT.
    Follow {
        path: PathBuf,
        out: PathBuf,
        total: usize,
    },
    /// N threads, each appending MIB MiB to a file of its own.
    Writers { n: usize, mib: usize },
    /// THREADS threads appending TAG lines to PATH, an open each, until GRANTS lines.
    Contend {
        path: PathBuf,
        tag: String,
        threads: usize,
        grants: u64,
    },
    /// A leader's command appending `EPOCH ID` lines to JOURNAL.
    Term {
        journal: PathBuf,
        /// Lines to write (0: until stopped).
        #[arg(long, default_value_t = 0)]
        lines: u64,
        /// A directory of the mount for the file held open all term.
        #[arg(long)]
        own: Option<PathBuf>,
        /// Where a failure is recorded (outside the mount).
        #[arg(long)]
        status: Option<PathBuf>,
        /// Where start, tick and error events are recorded (outside the mount).
        #[arg(long)]
        events: Option<PathBuf>,
    },
    /// Send REQUEST to the control socket SOCK; print the answer line.
    Control { sock: PathBuf, request: String },
    /// Hold N idle connections to SOCK, then try one more.
    ControlIdle { sock: PathBuf, n: usize },
    /// Rename A to B and back for SECS seconds.
    Swap { a: PathBuf, b: PathBuf, secs: u64 },
    /// Open PATH with O_CREAT (no O_EXCL) for SECS seconds, looking for another user's file.
    CreateRace { path: PathBuf, secs: u64 },
    /// N threads pinned to CPU each open PATH for writing, kept SECS seconds.
    Pile {
        path: PathBuf,
        n: usize,
        cpu: usize,
        secs: u64,
    },
    /// N lookups of missing names in DIR from CPU; prints the slowest.
    Probe { dir: PathBuf, n: usize, cpu: usize },
    /// Append and fsync numbered lines for SECS seconds; prints latencies.
    Fsyncer { path: PathBuf, secs: u64 },
    /// A leader's command that only writes timestamps outside the mount.
    Tick {
        events: PathBuf,
        #[arg(long, default_value_t = 5)]
        every_ms: u64,
        /// Ignore SIGTERM: only SIGKILL stops it.
        #[arg(long)]
        ignore_term: bool,
    },
    /// Append numbered, fsynced lines to PATH, noting each acknowledged one.
    Lines {
        path: PathBuf,
        id: String,
        #[arg(long)]
        side: PathBuf,
        #[arg(long, default_value_t = 5000)]
        for_ms: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// A TCP proxy to TARGET on loopback, paused and cut by stdin commands.
    Proxy { target: String },
    /// Hold LEADER's lease and send the control request REQ to SOCK N times.
    HoldAndAsk {
        leader: PathBuf,
        sock: PathBuf,
        n: usize,
        request: String,
    },
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Agent { sigint_default } => agent::run(sigint_default),
        Cmd::Append {
            src,
            dst,
            side,
            piece,
            sleep_ms,
            fsync_every,
            random,
        } => append::run(
            &src,
            &dst,
            &side,
            &append::Pace {
                piece,
                sleep_ms,
                fsync_every,
                random,
            },
        ),
        Cmd::Racer { path, id } => race::racer(&path, id),
        Cmd::HoldOpen { n, hold_ms } => race::hold_open(n, Duration::from_millis(hold_ms)),
        Cmd::Follow { path, out, total } => follow::run(&path, &out, total),
        Cmd::Writers { n, mib } => load::writers(n, mib),
        Cmd::Contend {
            path,
            tag,
            threads,
            grants,
        } => load::contend(&path, &tag, threads, grants),
        Cmd::Term {
            journal,
            lines,
            own,
            status,
            events,
        } => term::run(&term::Term {
            journal,
            lines,
            own,
            status,
            events,
        }),
        Cmd::Control { sock, request } => control::request(&sock, &request),
        Cmd::ControlIdle { sock, n } => control::idle(&sock, n),
        Cmd::Swap { a, b, secs } => hostile::swap(&a, &b, secs),
        Cmd::CreateRace { path, secs } => hostile::create_race(&path, secs),
        Cmd::Pile { path, n, cpu, secs } => hostile::pile(&path, n, cpu, secs),
        Cmd::Probe { dir, n, cpu } => hostile::probe(&dir, n, cpu),
        Cmd::Fsyncer { path, secs } => hostile::fsyncer(&path, secs),
        Cmd::Tick {
            events,
            every_ms,
            ignore_term,
        } => chaos::tick(&events, Duration::from_millis(every_ms), ignore_term),
        Cmd::Lines {
            path,
            id,
            side,
            for_ms,
            seed,
        } => chaos::lines(&chaos::Lines {
            path: &path,
            id: &id,
            side: &side,
            for_ms,
            seed,
        }),
        Cmd::Proxy { target } => proxy::run(&target),
        Cmd::HoldAndAsk {
            leader,
            sock,
            n,
            request,
        } => hostile::hold_and_ask(&leader, &sock, n, &request),
    }
}
