//! The spout's directory layout: which source files are candidates, the
//! names a file goes by while consumed, and the moves into the done and
//! bad directories.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A file being consumed is renamed `NAME.inprogress` (Storm's suffix).
pub const INPROGRESS: &str = ".inprogress";
/// Writers create `NAME.ignore` and rename it to `NAME` when complete.
pub const IGNORE: &str = ".ignore";

/// Whether a source file name is one the spout may claim. Besides Storm's
/// two suffixes, hidden names are skipped: `rsync`, editors and many
/// tools stage a file as `.NAME.XXXXXX` before renaming it into place, and
/// the default lock and bad directories are hidden too. Names are bytes:
/// one that is not UTF-8 is consumed like any other.
pub fn is_candidate_name(name: &OsStr) -> bool {
    let n = name.as_bytes();
    !(n.starts_with(b".") || n.ends_with(IGNORE.as_bytes()) || n.ends_with(INPROGRESS.as_bytes()))
}

/// `NAME` of `NAME.inprogress`.
pub fn strip_inprogress(name: &OsStr) -> Option<&OsStr> {
    name.as_bytes()
        .strip_suffix(INPROGRESS.as_bytes())
        .map(OsStr::from_bytes)
}

/// Candidate files of `source`, oldest modification time first (ties by
/// name, so every instance sees the same order).
pub fn list_candidates(source: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(source)? {
        let entry = entry?;
        if !is_candidate_name(&entry.file_name()) {
            continue;
        }
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.is_file() {
            files.push((meta.mtime(), meta.mtime_nsec(), entry.path()));
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, _, p)| p).collect())
}

/// Whether a leasefs writer still holds `path` open (its lease is not
/// free). Such a file was not published by a rename and may be incomplete;
/// it is left alone until its writer closes it. Off leasefs (no such
/// attribute) nothing is known, and the answer is false.
pub fn is_being_written(path: &Path) -> bool {
    let Ok(p) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut buf = [0u8; 1024];
    // SAFETY: valid C strings and a buffer of the stated length.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            c"user.leasefs.lease".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n <= 0 {
        return false;
    }
    serde_json::from_slice::<serde_json::Value>(&buf[..n as usize])
        .ok()
        .and_then(|v| v["state"].as_str().map(|s| s != "free"))
        .unwrap_or(false)
}

/// Whether `dir` is on a leasefs mount: every node there, directories
/// included, has the virtual `user.leasefs.lease` attribute. Checked at
/// start so that a spout pointed elsewhere fails at once, not at its first
/// claim (or never, with `--once` on an empty directory).
pub fn check_leasefs(dir: &Path) -> std::io::Result<()> {
    let p = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: a valid C string; size 0 asks for the value's length only.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            c"user.leasefs.lease".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::ENODATA) | Some(libc::ENOTSUP)) {
            return Err(std::io::Error::other(
                "it has no user.leasefs.lease attribute",
            ));
        }
        return Err(e);
    }
    Ok(())
}

/// `source/NAME.inprogress`.
pub fn inprogress_path(source: &Path, name: &OsStr) -> PathBuf {
    source.join(with_suffix(name, INPROGRESS))
}

fn with_suffix(name: &OsStr, suffix: &str) -> OsString {
    let mut n = name.to_os_string();
    n.push(suffix);
    n
}

/// The mount's soft limit, from the `user.leasefs.soft_limit_ms` of the
/// mount root above `dir` (only the root answers it). `None` off leasefs,
/// or from a daemon that does not show it.
pub fn soft_limit_of(dir: &Path) -> Option<Duration> {
    let abs = std::fs::canonicalize(dir).ok()?;
    abs.ancestors().find_map(|a| {
        let p = CString::new(a.as_os_str().as_bytes()).ok()?;
        let mut buf = [0u8; 32];
        // SAFETY: a valid C string and a buffer of the stated length.
        let n = unsafe {
            libc::getxattr(
                p.as_ptr(),
                c"user.leasefs.soft_limit_ms".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n <= 0 {
            return None;
        }
        let ms: u64 = std::str::from_utf8(&buf[..n as usize])
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(Duration::from_millis(ms))
    })
}

/// Renames without replacing an existing file (`RENAME_NOREPLACE`).
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    let f = CString::new(from.as_os_str().as_bytes())?;
    let t = CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: valid C strings; AT_FDCWD with absolute or cwd-relative paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINVAL) && !to.exists() {
        // A filesystem without the flag: a plain rename, target checked.
        return std::fs::rename(from, to);
    }
    Err(e)
}

/// Moves `from` into `dir` as `name`, or `name.1`, `name.2`, ... when a
/// file of that name is already there: a file consumed earlier under the
/// same name is never overwritten.
pub fn move_into(from: &Path, dir: &Path, name: &OsStr) -> std::io::Result<PathBuf> {
    let mut to = dir.join(name);
    for n in 1..=10_000u32 {
        match rename_noreplace(from, &to) {
            Ok(()) => return Ok(to),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                to = dir.join(with_suffix(name, &format!(".{n}")));
            }
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!(
            "10000 files named {}.N already in {}",
            name.to_string_lossy(),
            dir.display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_names() {
        for ok in ["a", "a.log", "x.ignored", "inprogress"] {
            assert!(is_candidate_name(OsStr::new(ok)), "{ok}");
        }
        assert!(is_candidate_name(OsStr::from_bytes(b"caf\xe9")));
        for no in [
            "a.ignore",
            "a.inprogress",
            ".lock",
            ".a.XXXX",
            "b.log.inprogress",
        ] {
            assert!(!is_candidate_name(OsStr::new(no)), "{no}");
        }
        assert_eq!(
            strip_inprogress(OsStr::from_bytes(b"caf\xe9.inprogress")),
            Some(OsStr::from_bytes(b"caf\xe9"))
        );
    }

    #[test]
    fn move_into_never_overwrites() {
        let d = tempfile::tempdir().unwrap();
        let done = d.path().join("done");
        std::fs::create_dir(&done).unwrap();
        for i in 0..3 {
            let src = d.path().join("f");
            std::fs::write(&src, format!("{i}")).unwrap();
            move_into(&src, &done, OsStr::new("f")).unwrap();
        }
        let read = |n: &str| std::fs::read_to_string(done.join(n)).unwrap();
        assert_eq!(
            (read("f"), read("f.1"), read("f.2")),
            ("0".into(), "1".into(), "2".into())
        );
    }

    #[test]
    fn oldest_first() {
        let d = tempfile::tempdir().unwrap();
        for (n, t) in [
            ("b", 100),
            ("a", 300),
            ("c", 200),
            ("x.ignore", 1),
            (".h", 1),
        ] {
            let p = d.path().join(n);
            std::fs::write(&p, "").unwrap();
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t))
                .unwrap();
        }
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let names: Vec<_> = list_candidates(d.path())
            .unwrap()
            .into_iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["b", "c", "a"]);
    }
}
