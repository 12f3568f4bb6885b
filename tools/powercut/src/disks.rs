//! Real filesystems on the power-cut disk: a loop device per image file
//! on the `powercut` mount, with ext4 or XFS on it, mounted where leasefs
//! expects its data directory and datanodes.
//!
//! Why this loses exactly what a real disk loses: the loop driver writes a
//! block through the image file's page cache (buffered, not direct I/O)
//! and turns every cache flush of the device (`REQ_PREFLUSH`, and FUA,
//! which it does not offer, so the block layer follows the write with a
//! flush) into an `fsync` of the image. So what `powercut` keeps at a cut
//! is what the filesystem made durable through its own barriers, and
//! leasefs runs the paths it runs for users on ext4 and XFS (ranged syncs,
//! zero fill, `syncfs`), which it switches off on a FUSE datanode.
//!
//! Each image lives in its own top-level directory of the powercut mount
//! (`NAME/disk.img`), so `powercut fail SOCK NAME EIO` fails that disk.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Big enough for every round's files (the rounds retire what they stop
/// checking); sparse, so it costs only what is written.
const IMAGE_BYTES: u64 = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fs {
    Ext4,
    Xfs,
}

impl Fs {
    fn name(self) -> &'static str {
        match self {
            Fs::Ext4 => "ext4",
            Fs::Xfs => "xfs",
        }
    }

    /// The filesystem as users make it, minus what only costs time on an
    /// image: no discard of a file that is already empty, and (ext4) inode
    /// tables written now rather than by a background thread during the
    /// rounds. Block size 4 KiB, as on any disk of today.
    fn mkfs(self, img: &Path) -> Command {
        let mut c;
        match self {
            Fs::Ext4 => {
                c = Command::new("mkfs.ext4");
                c.args([
                    "-q",
                    "-F",
                    "-b",
                    "4096",
                    "-E",
                    "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
                ]);
            }
            Fs::Xfs => {
                c = Command::new("mkfs.xfs");
                c.args(["-q", "-f", "-K", "-b", "size=4096"]);
            }
        }
        c.arg(img);
        c
    }
}

fn run(c: &mut Command) -> Result<String, String> {
    let what = format!("{c:?}");
    let out = c
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn sync_path(p: &Path) -> Result<(), String> {
    File::open(p)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("fsync {}: {e}", p.display()))
}

/// Makes (the first time, durably) and mounts each disk `names[i]`:
/// `pc/NAME/disk.img` through a loop device at `target/NAME`.
pub fn up(fs: Fs, pc: &Path, target: &Path, names: &[String]) -> Result<(), String> {
    for name in names {
        let dir = pc.join(name);
        let img = dir.join("disk.img");
        if !img.exists() {
            std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            let f = File::create(&img).map_err(|e| format!("create {}: {e}", img.display()))?;
            f.set_len(IMAGE_BYTES)
                .map_err(|e| format!("size {}: {e}", img.display()))?;
            run(&mut fs.mkfs(&img))?;
            sync_path(&img)?;
            sync_path(&dir)?;
            sync_path(pc)?;
        }
        let dev = run(Command::new("losetup").args(["--find", "--show"]).arg(&img))?;
        let at = target.join(name);
        std::fs::create_dir_all(&at).map_err(|e| format!("mkdir {}: {e}", at.display()))?;
        if let Err(e) = run(Command::new("mount")
            .args(["-t", fs.name()])
            .arg(&dev)
            .arg(&at))
        {
            let _ = run(Command::new("losetup").arg("-d").arg(&dev));
            return Err(format!("{} on {name} does not mount: {e}", fs.name()));
        }
    }
    Ok(())
}

/// The device mounted at `at`, if something is.
fn source_of(at: &Path) -> Option<PathBuf> {
    let want = at.to_string_lossy().replace(' ', "\\040");
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let mut parts = l.split(" - ");
        let left = parts.next()?;
        let right = parts.next()?;
        (left.split(' ').nth(4) == Some(want.as_str()))
            .then(|| right.split(' ').nth(1).map(PathBuf::from))
            .flatten()
    })
}

/// Unmounts each disk and detaches its loop device. After a cut every
/// write fails, so what the filesystem still had in memory is lost, as
/// in a power cut; on a clean shutdown the unmount writes it back.
pub fn down(target: &Path, names: &[String]) -> Result<(), String> {
    // Mount points are absolute in mountinfo.
    let target = std::fs::canonicalize(target).map_err(|e| format!("{}: {e}", target.display()))?;
    let mut errors = Vec::new();
    for name in names {
        let at = target.join(name);
        let Some(dev) = source_of(&at) else { continue };
        // A killed process's files are closed by the kernel a moment late.
        let end = Instant::now() + Duration::from_secs(10);
        let mut r = run(Command::new("umount").arg(&at));
        while r.is_err() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
            r = run(Command::new("umount").arg(&at));
        }
        if let Err(e) = r {
            errors.push(e);
            let _ = run(Command::new("umount").arg("-l").arg(&at));
        }
        // Detached at once when unused, else (autoclear) once it is.
        if let Err(e) = run(Command::new("losetup").arg("-d").arg(&dev)) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Starts and waits for the writeback of every dirty page of every file
/// under `target` (`sync_file_range`), with no cache flush of the device:
/// the disks then have writes pending that a cut with a subset keeps or
/// drops sector by sector, the torn state a real disk can be left in.
/// Returns the number of files written back.
pub fn write_back(target: &Path) -> usize {
    fn walk(p: &Path, n: &mut usize) {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                walk(&e.path(), n);
            } else if t.is_file()
                && let Ok(f) = File::open(e.path())
            {
                use std::os::fd::AsRawFd;
                let flags = libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
                // SAFETY: a descriptor held open for the call.
                if unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, flags) } == 0 {
                    *n += 1;
                }
            }
        }
    }
    let mut n = 0;
    walk(target, &mut n);
    n
}
