//! `powercut`: a FUSE filesystem for power-cut tests, in the spirit of
//! LazyFS. It passes everything through to a backing directory but keeps
//! each change pending until it is made durable (fsync of a file for its
//! data and size, fsync of a directory for its entries); on command it
//! drops every pending change, which is what a power cut leaves on disk.
//! See `journal` for the exact model.
//!
//! ```text
//! powercut mount BACKING MOUNTPOINT --control SOCK   serve until unmounted
//! powercut cut SOCK [--subset SEED]                  the power cut (with a
//!                                                    subset: a random half of
//!                                                    the pending sectors kept)
//! powercut fail SOCK DIR ENOSPC|EIO|EDQUOT|EROFS [--sync]
//!                                                    changes (or only fsyncs) under
//!                                                    top-level DIR fail
//! powercut slow SOCK DIR MILLIS                      writes under top-level DIR
//!                                                    are answered MILLIS late
//! powercut heal SOCK [DIR]                           end injected faults and
//!                                                    slowness
//! powercut commit-namespace SOCK                     every pending namespace change
//!                                                    durable, no file data (a
//!                                                    journal commit on its own)
//! powercut status SOCK
//! powercut disks-up --fs ext4|xfs PC TARGET NAME...  ext4 or XFS images on the
//!                                                    powercut mount PC, through
//!                                                    loop devices, at TARGET/NAME
//! powercut disks-down TARGET NAME...                 unmounted and detached
//! powercut writeback TARGET                          dirty pages of files under
//!                                                    TARGET written, not flushed
//! ```
//!
//! The tree shown is `BACKING/root`; `BACKING/trash` keeps removed files
//! until their removal is durable. After a cut every request fails with
//! `EIO`: unmount (`fusermount3 -u`) and mount again, which starts from
//! the durable state. A clean unmount keeps everything.

mod control;
mod delay;
mod disks;
mod fs;
mod journal;
mod nodes;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, RwLock};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "powercut",
    about = "A FUSE passthrough that loses, on command, everything not yet made durable"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve BACKING/root at MOUNTPOINT until unmounted.
    Mount {
        backing: PathBuf,
        mountpoint: PathBuf,
        /// The control socket (outside the mount).
        #[arg(long)]
        control: PathBuf,
    },
    /// Cut the power: drop every pending change; every later request fails.
    Cut {
        control: PathBuf,
        /// Keep a random half of the pending overwritten 4 KiB sectors
        /// (chosen by SEED): a disk that wrote back part of its cache, in
        /// any order, before the power went.
        #[arg(long, value_name = "SEED")]
        subset: Option<u64>,
    },
    /// Make changes under the top-level directory DIR fail with ERRNO.
    Fail {
        control: PathBuf,
        dir: String,
        errno: String,
        /// Only fsyncs fail (writes succeed).
        #[arg(long)]
        sync: bool,
    },
    /// Answer every write under the top-level directory DIR MILLIS
    /// milliseconds late (a slow disk; other requests are not held up).
    Slow {
        control: PathBuf,
        dir: String,
        millis: u64,
    },
    /// Make every pending namespace change durable, but no file data (what
    /// a filesystem's periodic journal commit may do on its own).
    CommitNamespace { control: PathBuf },
    /// End injected faults and slowness (of DIR, or all).
    Heal {
        control: PathBuf,
        dir: Option<String>,
    },
    /// Pending changes and power state.
    Status { control: PathBuf },
    /// Make (the first time) and mount ext4 or XFS images that live on a
    /// powercut mount PC, one per NAME, each through a loop device at
    /// TARGET/NAME (see `disks`).
    DisksUp {
        #[arg(long, value_enum)]
        fs: disks::Fs,
        pc: PathBuf,
        target: PathBuf,
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Write back every dirty page of every file under TARGET, without a
    /// cache flush of the disks (pending writes for `cut --subset`).
    Writeback { target: PathBuf },
    /// Unmount TARGET/NAME for each NAME and detach its loop device.
    DisksDown {
        target: PathBuf,
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("powercut: {msg}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (sock, cmd) = match cli.cmd {
        Cmd::Mount {
            backing,
            mountpoint,
            control,
        } => return mount(&backing, &mountpoint, &control),
        Cmd::Cut { control, subset } => (
            control,
            match subset {
                Some(seed) => format!("cut subset {seed}"),
                None => "cut".to_string(),
            },
        ),
        Cmd::Fail {
            control,
            dir,
            errno,
            sync,
        } => (
            control,
            format!("fail {dir} {errno}{}", if sync { " sync" } else { "" }),
        ),
        Cmd::Slow {
            control,
            dir,
            millis,
        } => (control, format!("slow {dir} {millis}")),
        Cmd::CommitNamespace { control } => (control, "commit-namespace".to_string()),
        Cmd::Heal { control, dir } => (control, format!("heal {}", dir.unwrap_or_default())),
        Cmd::Status { control } => (control, "status".to_string()),
        Cmd::DisksUp {
            fs,
            pc,
            target,
            names,
        } => {
            return disks::up(fs, &pc, &target, &names).map_or_else(fail, |()| ExitCode::SUCCESS);
        }
        Cmd::Writeback { target } => {
            println!("{} files written back", disks::write_back(&target));
            return ExitCode::SUCCESS;
        }
        Cmd::DisksDown { target, names } => {
            return disks::down(&target, &names).map_or_else(fail, |()| ExitCode::SUCCESS);
        }
    };
    match control::send(&sock, cmd.trim()) {
        Ok(r) if r.starts_with("ok") => {
            println!("{}", r.trim_start_matches("ok").trim());
            ExitCode::SUCCESS
        }
        Ok(r) => fail(r.trim_start_matches("error").trim()),
        Err(e) => fail(format!("cannot reach {}: {e}", sock.display())),
    }
}

fn mount(
    backing: &std::path::Path,
    mountpoint: &std::path::Path,
    sock: &std::path::Path,
) -> ExitCode {
    // Every inode the kernel knows holds a descriptor, and files with
    // unsynced data stay open until synced or cut: as many as the system
    // allows (root may raise the hard limit up to fs.nr_open).
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let most = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(hard)
            .max(hard);
        if setrlimit(Resource::RLIMIT_NOFILE, most, most).is_err() {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
    let root = backing.join("root");
    let trash = backing.join("trash");
    for d in [&root, &trash] {
        if let Err(e) = std::fs::create_dir_all(d) {
            return fail(format!("cannot create {}: {e}", d.display()));
        }
    }
    // Modes come from the kernel already masked.
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    // What a previous session left in the trash is either durable removals
    // it had not emptied or changes a crash of this tool kept: gone.
    if let Ok(entries) = std::fs::read_dir(&trash) {
        for e in entries.flatten() {
            let p = e.path();
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
        }
    }
    let trash_fd = match nix::fcntl::open(
        &trash,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => return fail(format!("cannot open {}: {e}", trash.display())),
    };
    let late = match delay::Delayer::new() {
        Ok(d) => d,
        Err(e) => return fail(format!("cannot start the timer thread: {e}")),
    };
    let shared = Arc::new(nodes::Shared {
        journal: journal::Journal::new(trash_fd),
        cut: RwLock::new(false),
        faults: Mutex::default(),
        slow: Mutex::default(),
        late,
    });
    let pc = match nodes::PowerCut::new(&root, shared.clone()) {
        Ok(p) => p,
        Err(e) => return fail(format!("cannot open {}: {e}", root.display())),
    };
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName(format!("powercut:{}", backing.display())),
        fuser::MountOption::Subtype("powercut".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if nix::unistd::geteuid().is_root() {
        cfg.mount_options
            .push(fuser::MountOption::CUSTOM("allow_other".into()));
        cfg.acl = fuser::SessionACL::All;
    }
    cfg.n_threads = Some(4);
    let session = match fuser::Session::new(pc, mountpoint, &cfg) {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot mount {}: {e}", mountpoint.display())),
    };
    // The socket answers once the mount is there: callers wait for it.
    if let Err(e) = control::serve(sock, shared) {
        return fail(format!("cannot listen on {}: {e}", sock.display()));
    }
    let r = session.run();
    let _ = std::fs::remove_file(sock);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("session ended: {e}")),
    }
}
