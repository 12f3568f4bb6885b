//! Commands that talk to a running daemon through its control socket:
//! `leases` and `recover-lease`, and the connection `stats` uses.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};

use super::fail;

/// The leasefs mount that contains `path`: (mountpoint, path inside it).
pub(super) fn find_mount(path: &Path) -> Result<(PathBuf, String), String> {
    let abs = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read mounts: {e}"))?;
    let mut best: Option<PathBuf> = None;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        // Mounted by root, fuser gives type "fuse" and source
        // "leasefs:DATA"; through fusermount3 the type is "fuse.leasefs".
        let mut fields = right.split(' ');
        let fstype = fields.next().unwrap_or("");
        let source = fields.next().unwrap_or("");
        if fstype != "fuse.leasefs" && !(fstype == "fuse" && source.starts_with("leasefs:")) {
            continue;
        }
        let Some(mp) = left.split(' ').nth(4) else {
            continue;
        };
        let mp = PathBuf::from(mp.replace("\\040", " "));
        if abs.starts_with(&mp)
            && best
                .as_ref()
                .is_none_or(|b| mp.as_os_str().len() > b.as_os_str().len())
        {
            best = Some(mp);
        }
    }
    let mp = best.ok_or_else(|| format!("{} is not inside a leasefs mount", path.display()))?;
    let rel = abs
        .strip_prefix(&mp)
        .map(|r| format!("/{}", r.display()))
        .unwrap_or_else(|_| "/".into());
    Ok((mp, rel))
}

/// Sends one request to the daemon serving `mountpoint`. A daemon busy
/// with as many connections of this user as it serves at once is asked
/// again for a few seconds.
pub(super) fn ask(mountpoint: &Path, req: Value) -> Result<Value, String> {
    let mut tries = 0;
    loop {
        let v = ask_once(mountpoint, &req)?;
        match v["error"].as_str() {
            Some(e) if e.starts_with("too many control connections") && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Some(e) => return Err(e.to_string()),
            None => return Ok(v),
        }
    }
}

fn ask_once(mountpoint: &Path, req: &Value) -> Result<Value, String> {
    let mut s = connect(mountpoint)?;
    writeln!(s, "{req}").map_err(|e| format!("control socket: {e}"))?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("control socket: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("bad answer from daemon: {e}"))
}

/// Connects to the daemon's control service: its abstract socket (named
/// by the mount root's `user.leasefs.control`; reachable whatever the
/// permissions of the data directory), else `DATA/control.sock`.
fn connect(mountpoint: &Path) -> Result<UnixStream, String> {
    use std::os::linux::net::SocketAddrExt;
    if let Ok(name) = xattr_get(mountpoint, "user.leasefs.control")
        && let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        && let Ok(s) = UnixStream::connect_addr(&addr)
    {
        return Ok(s);
    }
    let data = xattr_get(mountpoint, "user.leasefs.data")
        .map_err(|e| format!("{} is not a leasefs mount ({e})", mountpoint.display()))?;
    let sock = PathBuf::from(data).join("control.sock");
    UnixStream::connect(&sock)
        .map_err(|e| format!("cannot reach the daemon at {}: {e}", sock.display()))
}

fn xattr_get(path: &Path, name: &str) -> Result<String, String> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let p = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let n = CString::new(name).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the stated length.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    buf.truncate(r as usize);
    String::from_utf8(buf).map_err(|e| e.to_string())
}

pub fn leases(mountpoint: &Path, as_json: bool) -> ExitCode {
    let (mp, _) = match find_mount(mountpoint) {
        Ok(m) => m,
        Err(e) => return fail(2, e),
    };
    let v = match ask(&mp, json!({"op": "leases"})) {
        Ok(v) => v,
        Err(e) => return fail(2, e),
    };
    let list = v["leases"].as_array().cloned().unwrap_or_default();
    // Leases of files under directories the caller cannot list are left
    // out by the daemon and only counted; said on stderr, so that the
    // table and the JSON keep their form.
    if let Some(n) = v["hidden"].as_u64().filter(|&n| n > 0) {
        eprintln!(
            "leasefs: {n} more leases not shown: their files are under directories you cannot list"
        );
    }
    if as_json {
        println!("{}", Value::Array(list));
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<40} {:<10} {:<24} {:<16} {:>8} {:<6} {:>12} {:>7}",
        "PATH", "STATE", "HOLDER", "COMM", "EPOCH", "MODE", "RENEWED_AGO", "WAITERS"
    );
    for l in list {
        let s = |k: &str| {
            l[k].as_str()
                .map(str::to_string)
                .unwrap_or_else(|| "-".into())
        };
        let ago = l["renewed_ms_ago"]
            .as_u64()
            .map(|m| format!("{:.1}s", m as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<40} {:<10} {:<24} {:<16} {:>8} {:<6} {:>12} {:>7}",
            s("path"),
            s("state"),
            s("holder"),
            s("comm"),
            l["epoch"].as_u64().unwrap_or(0),
            s("mode"),
            ago,
            l["waiters"].as_u64().unwrap_or(0)
        );
    }
    ExitCode::SUCCESS
}

pub fn recover_lease(path: &Path, retries: u32) -> ExitCode {
    let (mp, rel) = match find_mount(path) {
        Ok(m) => m,
        Err(e) => return fail(2, e),
    };
    for attempt in 0..retries.max(1) {
        match ask(&mp, json!({"op": "recover", "path": rel})) {
            Ok(v) if v["closed"].as_bool() == Some(true) => {
                println!("recover-lease: {} is closed", path.display());
                return ExitCode::SUCCESS;
            }
            Ok(_) => {
                if attempt + 1 < retries {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
            Err(e) => return fail(2, e),
        }
    }
    println!(
        "recover-lease: recovery of {} is still under way",
        path.display()
    );
    ExitCode::from(1)
}
