//! `leasefs mount`: validates everything it can before the kernel is
//! involved, then (without `-f`) starts the daemon in the background and
//! returns only once the mount is ready or has failed.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use clap::Args;

use super::fail;
use crate::config::MountOptions;
use crate::daemon::{self, Daemon, MountSpec};
use crate::storage::{StorageError, trust};

#[derive(Args, Debug)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    /// Data directory (metadata, default datanodes, log, control socket).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A datanode directory; repeat for several. Replaces the defaults.
    #[arg(long = "datanode")]
    pub datanodes: Vec<PathBuf>,
    /// Replicas per block (default: min(3, datanodes)).
    #[arg(long)]
    pub replication: Option<usize>,
    /// Mount options: key=value,... (repeatable).
    #[arg(short = 'o')]
    pub options: Vec<String>,
    /// Stay in the foreground.
    #[arg(short = 'f', long = "foreground")]
    pub foreground: bool,
    /// Where the namespace and leases live: `sqlite` (default, in the data
    /// directory) or `etcd://HOST:PORT[,HOST:PORT...]` (shared by several
    /// daemons).
    #[arg(long, default_value = "sqlite")]
    pub meta: String,
    /// The filesystem's name in etcd: its keys live under `/leasefs/NAME/`.
    #[arg(long, default_value = "default")]
    pub prefix: String,
}

/// Parses `--meta`: `None` for SQLite, else the etcd endpoints.
fn meta_endpoints(meta: &str) -> Result<Option<Vec<String>>, String> {
    if meta == "sqlite" {
        return Ok(None);
    }
    let Some(rest) = meta.strip_prefix("etcd://") else {
        return Err(format!(
            "--meta {meta}: expected sqlite or etcd://HOST:PORT[,HOST:PORT...]"
        ));
    };
    let eps: Vec<String> = rest
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if eps.is_empty() || eps.iter().any(|e| !e.contains(':')) {
        return Err(format!(
            "--meta {meta}: every etcd endpoint needs HOST:PORT"
        ));
    }
    Ok(Some(eps))
}

const READY_FD_ENV: &str = "LEASEFS_READY_FD";

fn default_data_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("leasefs"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share/leasefs"))
}

fn is_mountpoint(p: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = p.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(target.as_str()))
}

/// Checks the arguments and builds the mount specification.
pub fn spec(a: &MountArgs) -> Result<MountSpec, String> {
    let mp = &a.mountpoint;
    let meta = std::fs::metadata(mp).map_err(|e| format!("mountpoint {}: {e}", mp.display()))?;
    if !meta.is_dir() {
        return Err(format!("mountpoint {} is not a directory", mp.display()));
    }
    let mountpoint =
        std::fs::canonicalize(mp).map_err(|e| format!("mountpoint {}: {e}", mp.display()))?;
    if is_mountpoint(&mountpoint) {
        return Err(format!("{} is already a mount point", mountpoint.display()));
    }
    let non_empty = std::fs::read_dir(&mountpoint)
        .map_err(|e| format!("mountpoint {}: {e}", mountpoint.display()))?
        .next()
        .is_some();
    if non_empty {
        return Err(format!("mountpoint {} is not empty", mountpoint.display()));
    }
    let etcd = meta_endpoints(&a.meta)?;
    if a.prefix.is_empty() || a.prefix.contains('/') {
        return Err(format!(
            "--prefix {}: must be a non-empty name without '/'",
            a.prefix
        ));
    }
    let mut opts = MountOptions::default();
    for o in &a.options {
        opts.apply(o).map_err(|e| e.to_string())?;
    }
    let data = match &a.data {
        Some(d) => d.clone(),
        None => {
            default_data_dir().ok_or("no --data given and neither XDG_DATA_HOME nor HOME is set")?
        }
    };
    std::fs::create_dir_all(&data)
        .map_err(|e| format!("data directory {}: {e}", data.display()))?;
    let data = std::fs::canonicalize(&data)
        .map_err(|e| format!("data directory {}: {e}", data.display()))?;
    // The daemon's database, log and control socket: refused where another
    // user could replace them (SEMANTICS "The daemon", *Datanode directories*).
    trust::open_trusted_dir(&data).map_err(|e| format!("data directory {e}"))?;
    let probe = data.join(".probe");
    std::fs::write(&probe, b"ok")
        .map_err(|e| format!("data directory {} is not writable: {e}", data.display()))?;
    let _ = std::fs::remove_file(probe);
    if data.starts_with(&mountpoint) {
        return Err("the data directory may not lie inside the mountpoint".into());
    }
    let dn_dirs: Vec<PathBuf> = if a.datanodes.is_empty() {
        (1..=3).map(|i| data.join(format!("dn{i}"))).collect()
    } else {
        a.datanodes.clone()
    };
    let mut datanodes = Vec::new();
    for d in dn_dirs {
        // An object-store datanode: checked by the daemon when it
        // attaches it (it needs the store's credentials).
        if crate::storage::s3::is_s3(&d) {
            crate::storage::s3::parse_url(d.to_str().unwrap_or_default())
                .map_err(|e| format!("datanode {e}"))?;
            if datanodes.contains(&d) {
                return Err(format!("datanode {} is given twice", d.display()));
            }
            datanodes.push(d);
            continue;
        }
        // A directory that cannot be made or resolved (a failed disk) is
        // passed on as given: the mount leaves it out, dead, and goes on
        // with the others (SEMANTICS "Datanode administration").
        let c = trust::create_private_dirs(&d)
            .and_then(|()| std::fs::canonicalize(&d))
            .or_else(|e| {
                eprintln!(
                    "leasefs: warning: datanode {} cannot be used ({e}); it is left out of this mount",
                    d.display()
                );
                std::path::absolute(&d)
            })
            .map_err(|e| format!("datanode {}: {e}", d.display()))?;
        // One another user could change is refused, not left out: the
        // daemon (root) would create and delete files where they say.
        if let Err(e @ StorageError::Untrusted { .. }) = crate::storage::check_dirs(&c) {
            return Err(format!("datanode {e}"));
        }
        if datanodes.contains(&c) {
            return Err(format!("datanode {} is given twice", c.display()));
        }
        datanodes.push(c);
    }
    // With host-local copies only object stores count toward R (the
    // mount's directories hold this host's copies).
    let counted = if opts.local_copy {
        local_copy_checks(etcd.is_some(), &datanodes)?
    } else {
        datanodes.len()
    };
    let replication = a.replication.unwrap_or(counted.min(3));
    if replication == 0 {
        return Err("replication must be at least 1".into());
    }
    if replication > counted {
        return Err(if opts.local_copy {
            format!(
                "replication {replication} is larger than the number of object-store datanodes ({counted}); with -o local_copy only they count"
            )
        } else {
            format!("replication {replication} is larger than the number of datanodes ({counted})")
        });
    }
    Ok(MountSpec {
        mountpoint,
        data,
        datanodes,
        replication,
        opts,
        etcd,
        prefix: a.prefix.clone(),
    })
}

/// What `-o local_copy` needs: a namespace over etcd (host-local copies
/// mean something only to daemons on several hosts; a SQLite store serves
/// one) and at least one object-store datanode, the shared storage every
/// host reads. Returns how many datanodes count toward R.
fn local_copy_checks(over_etcd: bool, datanodes: &[PathBuf]) -> Result<usize, String> {
    if !over_etcd {
        return Err(format!(
            "-o local_copy: {}",
            crate::meta::sqlite::LOCAL_COPY_NEEDS_ETCD
        ));
    }
    let shared = datanodes
        .iter()
        .filter(|d| crate::storage::s3::is_s3(d))
        .count();
    if shared == 0 {
        return Err(
            "-o local_copy needs an object-store datanode (--datanode s3://BUCKET/PREFIX): the directories of such a mount hold this host's copies only"
                .into(),
        );
    }
    Ok(shared)
}

pub fn run(a: MountArgs) -> ExitCode {
    let spec = match spec(&a) {
        Ok(s) => s,
        Err(e) => return fail(1, e),
    };
    if a.foreground {
        foreground(&spec)
    } else {
        background(&spec, &a.options)
    }
}

fn foreground(spec: &MountSpec) -> ExitCode {
    daemon::block_unmount_signals();
    daemon::logging::init(&spec.data, spec.opts.log_size);
    let ready_fd: Option<OwnedFd> = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        // SAFETY: the parent passed us this descriptor for our sole use.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    if let Some(fd) = &ready_fd {
        // Helpers we exec (fusermount3) must not keep the parent waiting.
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }
    let notify = move |r: Result<(), String>| {
        if let Some(fd) = ready_fd {
            let mut f = std::fs::File::from(fd);
            let msg = match &r {
                Ok(()) => "ok\n".to_string(),
                Err(e) => format!("{e}\n"),
            };
            let _ = std::io::Write::write_all(&mut f, msg.as_bytes());
        }
    };
    let d = match Daemon::start(spec) {
        Ok(d) => d,
        Err(e) => {
            let msg = e.to_string();
            notify(Err(msg.clone()));
            return fail(1, msg);
        }
    };
    match d.serve(spec, notify) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(1, e),
    }
}

/// Starts `leasefs mount -f` detached, logging to DATA/leasefs.log, and
/// waits for it to say the mount is ready.
fn background(spec: &MountSpec, options: &[String]) -> ExitCode {
    let (rd, wr) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => return fail(1, format!("cannot create a pipe: {e}")),
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(1, format!("cannot find own executable: {e}")),
    };
    let log_path = spec.data.join("leasefs.log");
    let log = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
    {
        Ok(f) => f,
        Err(e) => return fail(1, format!("cannot open log {}: {e}", log_path.display())),
    };
    let log2 = match log.try_clone() {
        Ok(f) => f,
        Err(e) => return fail(1, format!("cannot open log: {e}")),
    };
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&spec.mountpoint)
        .arg("--data")
        .arg(&spec.data)
        .arg("--replication")
        .arg(spec.replication.to_string())
        .arg("--meta")
        .arg(a_meta(spec))
        .arg("--prefix")
        .arg(&spec.prefix)
        .arg("-f");
    for d in &spec.datanodes {
        cmd.arg("--datanode").arg(d);
    }
    for o in options {
        cmd.arg("-o").arg(o);
    }
    cmd.env(READY_FD_ENV, wr.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2))
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return fail(1, format!("cannot start the daemon: {e}")),
    };
    drop(wr);
    let mut msg = String::new();
    let _ = std::fs::File::from(rd).read_to_string(&mut msg);
    let msg = msg.trim();
    if msg == "ok" {
        return ExitCode::SUCCESS;
    }
    let _ = child.try_wait();
    if msg.is_empty() {
        fail(
            1,
            format!(
                "the daemon exited before the mount was ready; see {}",
                log_path.display()
            ),
        )
    } else {
        fail(1, msg)
    }
}

/// `--meta` as given, rebuilt from the spec for the background daemon.
fn a_meta(spec: &MountSpec) -> String {
    match &spec.etcd {
        Some(eps) => format!("etcd://{}", eps.join(",")),
        None => "sqlite".into(),
    }
}
