//! The workload processes of the rounds. Each runs until the power cut
//! kills it, and appends one line to its acknowledgement file (on the real
//! disk, outside the filesystem under test) right after each step that the
//! filesystem acknowledged: the checker's record of what must survive.
//!
//! Lines: `epoch E` (a write lease granted with epoch E), `synced NAME LEN`
//! (fsync returned: NAME holds LEN known bytes), `truncating NAME LEN`
//! (about to cut NAME to LEN), `closed NAME LEN` (fsync and close
//! returned), `renaming NAME V LEN` / `renamed NAME V LEN` (version V of
//! LEN bytes, fsynced, about to replace NAME / replaced it and the
//! directory was fsynced), `created NAME LEN`, `unlinking NAME`,
//! `unlinked NAME` (directory fsynced), `small NAME LEN` (created,
//! written, fsynced, closed; or created, written, closed, then fsynced
//! through a new descriptor), `published NAME LINES` (a spout source file
//! renamed into place, directory fsynced), `error STEP: ERRNO` (a step
//! failed: always a finding).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::content::{self, Rng};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// One descriptor appending known bytes, fsyncing now and then.
    Append,
    /// Append, fsync, close; open again for append; and so on.
    Reopen,
    /// Append with fsync, and now and then cut the file shorter.
    Truncate,
    /// Write a new version to NAME.tmp, fsync, rename over NAME, fsync dir.
    RenameOver,
    /// Create files with fsync and remove some of them.
    Unlink,
    /// Small files: create, write, fsync, close.
    Small,
    /// A client-renewed writer that stops renewing (lease recovery after
    /// the soft limit is up to the next one).
    Lease,
    /// Waits for NAME's lease (EBUSY until the holder's soft limit), then
    /// appends with fsync.
    Take,
    /// Publishes spout source files (NAME.ignore, fsync, rename, fsync dir).
    Publish,
}

#[derive(Args, Debug)]
pub struct WorkArgs {
    #[arg(value_enum)]
    pub kind: Kind,
    /// The directory on the mount.
    #[arg(long)]
    pub dir: PathBuf,
    /// The file (or file-name prefix) this workload writes.
    #[arg(long)]
    pub name: String,
    #[arg(long)]
    pub seed: u64,
    /// The acknowledgement file (outside the mount).
    #[arg(long)]
    pub ack: PathBuf,
    /// First version / file number to use.
    #[arg(long, default_value_t = 1)]
    pub start: u64,
}

/// leasefs ioctls (docs/SEMANTICS.md "Leases").
mod ioc {
    nix::ioctl_none!(client_renewal, b'L', 1);
    nix::ioctl_none!(renew, b'L', 2);
    nix::ioctl_read!(epoch, b'L', 3, u64);
}

/// The epoch of the write lease `f` holds.
pub fn epoch_of(f: &File) -> io::Result<u64> {
    let mut e = 0u64;
    // SAFETY: a valid descriptor and a u64 to write the result into.
    unsafe { ioc::epoch(f.as_raw_fd(), &mut e) }
        .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    Ok(e)
}

struct Ack(File);

impl Ack {
    fn line(&mut self, s: String) {
        // One write per line: a kill never leaves half of it behind a whole one.
        let _ = self.0.write_all(format!("{s}\n").as_bytes());
    }
    /// Records a failed step and ends the workload.
    fn fail(&mut self, step: &str, e: io::Error) -> ! {
        self.line(format!("error {step}: {e}"));
        std::process::exit(1)
    }
}

fn pause(rng: &mut Rng, max_ms: u64) {
    std::thread::sleep(Duration::from_micros(rng.below(max_ms * 1000)));
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Opens for writing, waiting while another writer holds the lease.
fn open_write(path: &Path, append: bool, nonblock: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create(true).append(append).mode(0o644);
    if nonblock {
        o.custom_flags(libc::O_NONBLOCK);
    }
    o.open(path)
}

pub fn run(a: WorkArgs) -> ! {
    let ack = match OpenOptions::new().create(true).append(true).open(&a.ack) {
        Ok(f) => Ack(f),
        Err(e) => {
            eprintln!("powercut-rounds: cannot open {}: {e}", a.ack.display());
            std::process::exit(2)
        }
    };
    let rng = Rng::new(a.seed);
    match a.kind {
        Kind::Append => append(&a, ack, rng, false, false),
        Kind::Reopen => append(&a, ack, rng, true, false),
        Kind::Truncate => append(&a, ack, rng, false, true),
        Kind::RenameOver => rename_over(&a, ack, rng),
        Kind::Unlink => unlink(&a, ack, rng),
        Kind::Small => small(&a, ack, rng),
        Kind::Lease => lease(&a, ack, rng),
        Kind::Take => take(&a, ack, rng),
        Kind::Publish => publish(&a, ack, rng),
    }
}

/// Appends `n` known bytes at `pos`; returns the new end.
fn put(f: &mut File, name: &str, pos: u64, n: u64) -> io::Result<u64> {
    f.write_all(&content::bytes(name, pos, n))?;
    Ok(pos + n)
}

fn append(a: &WorkArgs, mut ack: Ack, mut rng: Rng, reopen: bool, truncate: bool) -> ! {
    let path = a.dir.join(&a.name);
    loop {
        let mut f =
            open_write(&path, true, false).unwrap_or_else(|e| ack.fail("open for append", e));
        let e = epoch_of(&f).unwrap_or_else(|e| ack.fail("epoch ioctl", e));
        ack.line(format!("epoch {e}"));
        let mut pos = f
            .metadata()
            .map(|m| m.len())
            .unwrap_or_else(|e| ack.fail("fstat", e));
        loop {
            for _ in 0..rng.range(3, 40) {
                if truncate && pos > 0 && rng.chance(0.08) {
                    let to = rng.below(pos);
                    ack.line(format!("truncating {} {to}", a.name));
                    f.set_len(to).unwrap_or_else(|e| ack.fail("ftruncate", e));
                    pos = to;
                    f.sync_all()
                        .unwrap_or_else(|e| ack.fail("fsync after ftruncate", e));
                    ack.line(format!("synced {} {pos}", a.name));
                    continue;
                }
                let n = rng.range(1, 24_000);
                pos = put(&mut f, &a.name, pos, n).unwrap_or_else(|e| ack.fail("write", e));
                if rng.chance(0.3) {
                    f.sync_all().unwrap_or_else(|e| ack.fail("fsync", e));
                    ack.line(format!("synced {} {pos}", a.name));
                }
                pause(&mut rng, 3);
            }
            f.sync_all().unwrap_or_else(|e| ack.fail("fsync", e));
            ack.line(format!("synced {} {pos}", a.name));
            if reopen {
                break;
            }
        }
        drop(f);
        ack.line(format!("closed {} {pos}", a.name));
        pause(&mut rng, 20);
    }
}

fn rename_over(a: &WorkArgs, mut ack: Ack, mut rng: Rng) -> ! {
    let path = a.dir.join(&a.name);
    let tmp = a.dir.join(format!("{}.tmp", a.name));
    for v in a.start.. {
        let len = rng.range(1, 300_000);
        let vname = version_name(&a.name, v);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .unwrap_or_else(|e| ack.fail("create the new version", e));
        put(&mut f, &vname, 0, len).unwrap_or_else(|e| ack.fail("write the new version", e));
        f.sync_all()
            .unwrap_or_else(|e| ack.fail("fsync the new version", e));
        drop(f);
        ack.line(format!("renaming {} {v} {len}", a.name));
        std::fs::rename(&tmp, &path).unwrap_or_else(|e| ack.fail("rename over", e));
        sync_dir(&a.dir).unwrap_or_else(|e| ack.fail("fsync of the directory", e));
        ack.line(format!("renamed {} {v} {len}", a.name));
        pause(&mut rng, 20);
    }
    std::process::exit(0)
}

/// The content name of version `v` of a renamed-over file.
pub fn version_name(name: &str, v: u64) -> String {
    format!("{name}#v{v}")
}

fn unlink(a: &WorkArgs, mut ack: Ack, mut rng: Rng) -> ! {
    let mut live: Vec<String> = Vec::new();
    for i in a.start.. {
        let name = format!("{}.{i}", a.name);
        let len = rng.range(0, 150_000);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(a.dir.join(&name))
            .unwrap_or_else(|e| ack.fail("create", e));
        put(&mut f, &name, 0, len).unwrap_or_else(|e| ack.fail("write", e));
        f.sync_all().unwrap_or_else(|e| ack.fail("fsync", e));
        drop(f);
        sync_dir(&a.dir).unwrap_or_else(|e| ack.fail("fsync of the directory", e));
        ack.line(format!("created {name} {len}"));
        live.push(name);
        if rng.chance(0.5) {
            let victim = live.swap_remove(rng.below(live.len() as u64) as usize);
            ack.line(format!("unlinking {victim}"));
            std::fs::remove_file(a.dir.join(&victim)).unwrap_or_else(|e| ack.fail("unlink", e));
            sync_dir(&a.dir).unwrap_or_else(|e| ack.fail("fsync of the directory", e));
            ack.line(format!("unlinked {victim}"));
        }
        pause(&mut rng, 10);
    }
    std::process::exit(0)
}

fn small(a: &WorkArgs, mut ack: Ack, mut rng: Rng) -> ! {
    for i in a.start.. {
        let name = format!("{}.{i}", a.name);
        let len = rng.range(1, 4096);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(a.dir.join(&name))
            .unwrap_or_else(|e| ack.fail("create", e));
        put(&mut f, &name, 0, len).unwrap_or_else(|e| ack.fail("write", e));
        if rng.chance(0.5) {
            f.sync_all().unwrap_or_else(|e| ack.fail("fsync", e));
            drop(f);
        } else {
            // Closed first: the one-step path (replicas written whole into
            // finalized/ at the close), then made durable by an fsync
            // through a new read-only descriptor. close() reports the
            // close's error (a drop would not).
            use std::os::fd::IntoRawFd;
            nix::unistd::close(f.into_raw_fd())
                .unwrap_or_else(|e| ack.fail("close", std::io::Error::from(e)));
            std::fs::File::open(a.dir.join(&name))
                .and_then(|r| r.sync_all())
                .unwrap_or_else(|e| ack.fail("fsync after close", e));
        }
        ack.line(format!("small {name} {len}"));
        pause(&mut rng, 5);
    }
    std::process::exit(0)
}

fn lease(a: &WorkArgs, mut ack: Ack, mut rng: Rng) -> ! {
    let path = a.dir.join(&a.name);
    let mut f = open_write(&path, true, false).unwrap_or_else(|e| ack.fail("open for append", e));
    // SAFETY: a valid descriptor; the ioctl takes no argument.
    unsafe { ioc::client_renewal(f.as_raw_fd()) }.unwrap_or_else(|e| {
        ack.fail(
            "client renewal ioctl",
            io::Error::from_raw_os_error(e as i32),
        )
    });
    let e = epoch_of(&f).unwrap_or_else(|e| ack.fail("epoch ioctl", e));
    ack.line(format!("epoch {e}"));
    let mut pos = f
        .metadata()
        .map(|m| m.len())
        .unwrap_or_else(|e| ack.fail("fstat", e));
    for _ in 0..rng.range(1, 6) {
        pos = put(&mut f, &a.name, pos, rng.range(1, 30_000))
            .unwrap_or_else(|e| ack.fail("write", e));
        f.sync_all().unwrap_or_else(|e| ack.fail("fsync", e));
        ack.line(format!("synced {} {pos}", a.name));
        // SAFETY: as above.
        unsafe { ioc::renew(f.as_raw_fd()) }
            .unwrap_or_else(|e| ack.fail("renew ioctl", io::Error::from_raw_os_error(e as i32)));
        pause(&mut rng, 60);
    }
    // Bytes never synced, then silence: the holder stops renewing (hung)
    // and keeps its descriptor until the cut.
    let _ = put(&mut f, &a.name, pos, rng.range(1, 30_000));
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn take(a: &WorkArgs, mut ack: Ack, mut rng: Rng) -> ! {
    let path = a.dir.join(&a.name);
    let mut f = loop {
        match open_write(&path, true, true) {
            Ok(f) => break f,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => ack.fail("open for append after the soft limit", e),
        }
    };
    let e = epoch_of(&f).unwrap_or_else(|e| ack.fail("epoch ioctl", e));
    ack.line(format!("epoch {e}"));
    let mut pos = f
        .metadata()
        .map(|m| m.len())
        .unwrap_or_else(|e| ack.fail("fstat", e));
    loop {
        pos = put(&mut f, &a.name, pos, rng.range(1, 24_000))
            .unwrap_or_else(|e| ack.fail("write", e));
        if rng.chance(0.4) {
            f.sync_all().unwrap_or_else(|e| ack.fail("fsync", e));
            ack.line(format!("synced {} {pos}", a.name));
        }
        pause(&mut rng, 3);
    }
}

/// The text of spout source file `name`: one record per line.
pub fn spout_lines(name: &str, lines: u64) -> String {
    (0..lines).map(|j| format!("{name} line {j}\n")).collect()
}

fn publish(a: &WorkArgs, mut ack: Ack, mut rng: Rng) -> ! {
    for i in a.start.. {
        let name = format!("{}{i}", a.name);
        let lines = rng.range(1, 120);
        let staged = a.dir.join(format!("{name}.ignore"));
        let mut f = File::create(&staged).unwrap_or_else(|e| ack.fail("create a staged file", e));
        f.write_all(spout_lines(&name, lines).as_bytes())
            .unwrap_or_else(|e| ack.fail("write a staged file", e));
        f.sync_all()
            .unwrap_or_else(|e| ack.fail("fsync a staged file", e));
        drop(f);
        std::fs::rename(&staged, a.dir.join(&name)).unwrap_or_else(|e| ack.fail("publish", e));
        sync_dir(&a.dir).unwrap_or_else(|e| ack.fail("fsync of the source directory", e));
        ack.line(format!("published {name} {lines}"));
        pause(&mut rng, 60);
    }
    std::process::exit(0)
}
