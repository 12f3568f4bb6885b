//! The running daemon: opens a data directory (one daemon at a time),
//! recovers what a previous daemon left open, starts the lease monitor,
//! the lease renewal thread, datanode heartbeats and the interrupt watcher,
//! and serves the mount until it is unmounted.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::MountOptions;
use crate::error::{FsError, FsResult};
use crate::etcd::Etcd;
use crate::etcd::leases::{EtcdLeases, keep_alive_loop};
use crate::fs::adapter::Adapter;
use crate::fs::core::{ClusterParts, Core, Instance};
use crate::meta::{EtcdMeta, Meta, MetaStore};
use crate::sync::{Arc, AtomicBool, Ordering};

pub use self::fatal::{FATAL_EXIT, Fatal};

pub mod fatal;
pub mod logging;

/// Interval of datanode heartbeats (HDFS: 3 s).
pub const HEARTBEAT: Duration = Duration::from_secs(3);
/// How often waiting opens are checked for a pending signal (Ctrl-C).
const INTERRUPT_POLL: Duration = Duration::from_millis(50);
/// Readahead of the mount, as negotiated with the kernel (`max_readahead`).
const READAHEAD_KB: u32 = 1024;
pub struct MountSpec {
    pub mountpoint: PathBuf,
    pub data: PathBuf,
    pub datanodes: Vec<PathBuf>,
    pub replication: usize,
    pub opts: MountOptions,
    /// etcd endpoints when the namespace is shared (`--meta etcd://...`).
    pub etcd: Option<Vec<String>>,
    /// The filesystem's name in etcd.
    pub prefix: String,
}

/// Holds the data directory's lock for the daemon's life.
pub struct DataLock {
    _file: File,
}

/// Takes the data directory for this daemon, refusing a second one.
pub fn lock_data_dir(data: &Path) -> FsResult<DataLock> {
    let path = data.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| FsError::Io(format!("cannot open {}: {e}", path.display())))?;
    // SAFETY: flock on a valid, owned descriptor.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(FsError::Io(format!(
            "data directory {} is in use by another leasefs daemon ({})",
            data.display(),
            holder.trim()
        )));
    }
    let _ = file.set_len(0);
    let _ = std::fs::write(&path, format!("pid {}\n", std::process::id()));
    Ok(DataLock { _file: file })
}

/// Everything a mount needs, built before the kernel is involved so that
/// every error can still be reported to the user.
/// What a daemon sharing its namespace over etcd holds.
struct Shared {
    etcd: Arc<Etcd>,
    leases: Arc<EtcdLeases>,
}

pub struct Daemon {
    pub core: Arc<Core>,
    pub rt: tokio::runtime::Runtime,
    _lock: DataLock,
    stop: Arc<AtomicBool>,
    housekeeper: Arc<crate::housekeeping::Housekeeper>,
    shared: Option<Shared>,
    fatal: Arc<Fatal>,
}

/// The daemon instance that last served this data directory is gone (we
/// hold the directory's lock): end its claims and liveness key in etcd at
/// once, so its files are recovered now rather than after the soft limit.
fn reap_predecessor(data: &Path, leases: &EtcdLeases, me: &str) -> FsResult<()> {
    let path = data.join("instance");
    if let Ok(prev) = std::fs::read_to_string(&path) {
        let prev = prev.trim();
        if !prev.is_empty() && prev != me {
            match leases.reap(prev) {
                Ok(n) => tracing::info!(
                    instance = prev,
                    claims = n,
                    "ended the claims of this data directory's previous daemon"
                ),
                Err(e) => tracing::warn!("cannot end the previous daemon's claims: {e}"),
            }
        }
    }
    std::fs::write(&path, me).map_err(|e| FsError::Io(format!("{}: {e}", path.display())))
}

impl Daemon {
    pub fn start(spec: &MountSpec) -> FsResult<Daemon> {
        crate::fault::install_hook();
        crate::fault::arm_from_env();
        let lock = lock_data_dir(&spec.data)?;
        // Bound first: an address in use fails the mount before anything
        // is opened.
        let metrics = match &spec.opts.metrics {
            Some(addr) => Some(
                crate::metrics::http::bind(addr).map_err(|e| FsError::Invalid(e.to_string()))?,
            ),
            None => None,
        };
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let mut instance = Instance::new();
        let (meta, shared): (Arc<dyn Meta>, _) = match &spec.etcd {
            None => (
                Arc::new(MetaStore::open(&spec.data.join("meta.db"), uid, gid)?),
                None,
            ),
            Some(eps) => {
                let etcd = Arc::new(Etcd::connect(eps, &spec.prefix)?);
                let meta = Arc::new(EtcdMeta::open(etcd.clone(), uid, gid)?);
                let leases = EtcdLeases::new(
                    etcd.clone(),
                    instance.mount_id.clone(),
                    spec.opts.soft_limit,
                )
                .map_err(FsError::Meta)?;
                tracing::info!(etcd = %eps.join(","), prefix = %spec.prefix, "namespace and leases in etcd");
                (meta as Arc<dyn Meta>, Some(Shared { etcd, leases }))
            }
        };
        // Each directory is recognised by its identity file, whatever its
        // place in the list (daemons sharing a namespace may list theirs in
        // any order); recorded datanodes left out are dead for this mount.
        // How object-store datanodes are reached, for every attach.
        crate::storage::s3::settings::install(spec.opts.s3.clone());
        // ...and for tools run without the daemon (`fsck --data`).
        if let Err(e) = crate::storage::s3::settings::record(&spec.data, &spec.opts.s3) {
            tracing::warn!(
                "cannot record the object-store options in {}: {e}",
                spec.data.display()
            );
        }
        // This host, for host-local copies (its own, and other hosts' it
        // never attaches).
        let here =
            crate::pipeline::copies::resolve(spec.opts.host_id.as_deref(), spec.opts.local_copy)
                .map_err(|e| FsError::Invalid(e.to_string()))?;
        let dns = Arc::new(crate::pipeline::attach::attach(
            &*meta,
            &spec.datanodes,
            spec.replication,
            &here,
        )?);
        dns.heartbeat();
        meta.set_replication(spec.replication)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1024)
            .thread_name("leasefs-worker")
            .on_thread_start(crate::sync_cpus::unpinned_start())
            .enable_time()
            // Sockets: the metrics endpoint (`-o metrics=`).
            .enable_io()
            .build()
            .map_err(|e| FsError::Io(format!("cannot start worker pool: {e}")))?;
        instance.cluster = shared.as_ref().map(|s| ClusterParts {
            cluster: s.leases.clone(),
            epochs: Box::new(s.leases.epochs()),
        });
        let core = Core::with_system_clock(
            meta,
            dns,
            spec.opts.clone(),
            rt.handle().clone(),
            spec.data.clone(),
            instance,
        );
        if let Some(listener) = metrics {
            serve_metrics(&core, &rt, listener);
        }
        // Before anything is served: the commands of terms that ended with
        // the previous daemon are refused from the first request on, and
        // stopped. Only then are that daemon's claims ended in etcd: a
        // claim ended first would let another daemon grant an election's
        // lease while the old term's command still runs.
        if core.fences().load()? > 0 {
            core.fences().sweep();
        }
        if let Some(s) = &shared {
            reap_predecessor(&spec.data, &s.leases, &core.mount_id)?;
        }
        let n = core.startup_recovery()?;
        if n > 0 {
            tracing::info!("recovered {n} file(s) left under construction");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let d = Daemon {
            core,
            rt,
            _lock: lock,
            stop,
            housekeeper: Arc::new(crate::housekeeping::Housekeeper::new()),
            shared,
            fatal: Fatal::new(
                std::fs::canonicalize(&spec.mountpoint).unwrap_or_else(|_| spec.mountpoint.clone()),
            ),
        };
        d.spawn_background();
        Ok(d)
    }

    /// Runs `f` every `period` on a thread of its own, which is vital
    /// (see [`Fatal`]). `point` names it for the test-only panic hook
    /// (`crate::fault`).
    fn every(
        &self,
        name: &str,
        point: &'static str,
        period: Duration,
        f: impl Fn(&Arc<Core>) + Send + 'static,
    ) {
        let core = self.core.clone();
        let stop = self.stop.clone();
        self.fatal.spawn(name, move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(period);
                crate::fault::panic_if(point, || {
                    core.meta()
                        .lookup(crate::meta::ROOT_INO, crate::fault::TRIGGER.as_bytes())
                        .is_ok()
                });
                f(&core);
            }
        });
    }

    /// The threads of a daemon sharing its namespace: keep-alives of its
    /// claims and liveness key, and the housekeeping campaign.
    fn spawn_shared(&self, s: &Shared) {
        let (leases, stop) = (s.leases.clone(), self.stop.clone());
        let core = Arc::downgrade(&self.core);
        let preempt = Box::new(move |ino| {
            if let Some(c) = core.upgrade() {
                c.preempt_for_remote(ino)
            }
        });
        let core = Arc::downgrade(&self.core);
        let on_lost = Box::new(move |ino| {
            if let Some(c) = core.upgrade() {
                c.claim_lost(ino)
            }
        });
        self.fatal.spawn("etcd-keepalive", move || {
            keep_alive_loop(leases, preempt, on_lost, stop)
        });
        let (etcd, meta, hk) = (
            s.etcd.clone(),
            self.core.meta().clone(),
            self.housekeeper.clone(),
        );
        let (id, stop) = (self.core.mount_id.clone(), self.stop.clone());
        self.fatal.spawn("hk-election", move || {
            let (take, lose) = (
                |why: &str| hk.take(&*meta, why),
                |why: &str| hk.lose(&*meta, why),
            );
            crate::etcd::election::run(etcd, id, stop, take, lose)
        });
    }

    fn spawn_background(&self) {
        let o = &self.core.opts;
        // Lease monitor (HDFS LeaseManager.Monitor): expired waits, hard
        // limit, preemption of expired holders that others wait for.
        self.every("lease-monitor", "monitor", o.monitor_interval, |core| {
            for t in core.leases.tick() {
                core.spawn_recovery(t);
            }
            core.persist_epochs();
            core.fences().sweep();
            // Closes left for the next commit wait no longer than this.
            if let Err(e) = core.meta().settle_closes() {
                tracing::warn!("committing lazy closes: {e}");
            }
            logging::report_suppressed();
        });
        // Lease renewal for ordinary programs, which cannot renew anything.
        self.every("lease-renewer", "renewer", o.soft_limit / 2, |core| {
            core.leases.renew_daemon_leases();
        });
        // Datanode heartbeats: storage liveness only, never writer liveness.
        // The registry is read with them: datanodes other daemons added,
        // decommissioned or removed.
        self.every("dn-heartbeat", "heartbeat", HEARTBEAT, |core| {
            crate::dnadmin::refresh(core);
            core.dns().heartbeat();
        });
        // Leader-only housekeeping; a lone daemon leads its namespace,
        // daemons sharing one elect their leader through etcd.
        let hk = self.housekeeper.clone();
        match &self.shared {
            None => hk.take(&**self.core.meta(), "sole daemon of this data directory"),
            Some(s) => self.spawn_shared(s),
        }
        // Its own loop rather than `every`: a kick (a decommission started
        // here) or another daemon's change of admin states runs a round at
        // once.
        let (core, stop, interval) = (
            self.core.clone(),
            self.stop.clone(),
            o.housekeeping_interval,
        );
        self.fatal
            .spawn("housekeeping", move || hk.run(&core, interval, &stop));
        // A waiting open whose process got a signal gets EINTR.
        // While opens wait: Ctrl-C gives EINTR, and a wait that runs out
        // (lease_wait) ends on time rather than at the next monitor tick.
        self.every("waiters", "waiters", INTERRUPT_POLL, |core| {
            if core.leases.waiting().is_empty() {
                return;
            }
            core.interrupt_waiters();
            for t in core.leases.tick() {
                core.spawn_recovery(t);
            }
        });
    }

    /// Unmounted: the background work stops, closes in flight finish,
    /// what a restart needs is recorded (grant epochs), and every lease
    /// and election term of this daemon ends. The one shutdown sequence,
    /// whether the kernel or a signal ended the session.
    fn shut_down(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.housekeeper.lose(&**self.core.meta(), "unmounted");
        let closed = self.core.wait_closes(Duration::from_secs(30));
        // A clean unmount leaves the next mount no file to recover.
        if let Err(e) = self.core.meta().settle_closes() {
            tracing::warn!("committing lazy closes at unmount: {e}");
        }
        // A clean unmount leaves the next mount no journal to replay.
        self.core.ctx.journal.stop();
        if let Err(e) = crate::pipeline::journal::checkpoint(&self.core.ctx) {
            tracing::warn!("block journal checkpoint at unmount: {e}");
        }
        // ...and no replica to check for what a crash tore.
        if closed {
            self.core.flush_marks_at_unmount();
        }
        self.core.persist_epochs();
        self.core.leases.shutdown();
        self.core.fences().end_all();
        if let Some(s) = &self.shared {
            s.leases.shutdown();
        }
    }

    /// Mounts and serves until unmounted. `ready` is called once the
    /// kernel has completed the FUSE handshake.
    pub fn serve(self, spec: &MountSpec, ready: impl FnOnce(Result<(), String>)) -> FsResult<()> {
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![
            fuser::MountOption::FSName(format!("leasefs:{}", spec.data.display())),
            fuser::MountOption::Subtype("leasefs".into()),
            fuser::MountOption::DefaultPermissions,
        ];
        // Mounted by root, the mount serves every user (the kernel checks
        // permissions); an unprivileged mount serves its owner only, since
        // allow_other would need user_allow_other in /etc/fuse.conf.
        if nix::unistd::geteuid().is_root() {
            cfg.mount_options
                .push(fuser::MountOption::CUSTOM("allow_other".into()));
        }
        cfg.n_threads = Some(4);
        cfg.io_uring = spec.opts.fuse_uring;
        cfg.io_uring_poll = spec.opts.fuse_uring_poll;
        crate::storage::direct::set_enabled(spec.opts.reads_direct);
        crate::sync_cpus::configure(&spec.opts.sync_cpus, &spec.data);
        cfg.acl = if nix::unistd::geteuid().is_root() {
            fuser::SessionACL::All
        } else {
            fuser::SessionACL::Owner
        };
        for f in &spec.opts.kernel_flags {
            cfg.mount_options.push(f.clone());
        }
        let adapter = Adapter {
            core: self.core.clone(),
        };
        // Resolved before mounting: once mounted, looking at the mountpoint
        // would wait for this daemon, which does not serve yet.
        let mountpoint =
            std::fs::canonicalize(&spec.mountpoint).unwrap_or_else(|_| spec.mountpoint.clone());
        let admin = crate::dnadmin::Admin::new(self.core.clone(), self.housekeeper.clone());
        crate::control::serve(
            self.core.clone(),
            admin,
            &spec.data,
            &spec.mountpoint,
            self.fatal.clone(),
        );
        let mut session = match fuser::Session::new(adapter, &spec.mountpoint, &cfg) {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("cannot mount {}: {e}", spec.mountpoint.display());
                ready(Err(msg.clone()));
                return Err(FsError::Io(msg));
            }
        };
        let notifier = session.notifier();
        self.core.set_invalidator(Arc::new(move |ino, offset, len| {
            // ENOENT: the kernel holds nothing of this inode; fine.
            let _ = notifier.inval_inode(fuser::INodeNo(ino), offset, len);
        }));
        let notifier = session.notifier();
        self.core.set_storer(Arc::new(move |ino, offset, data| {
            // ENOENT as above.
            let _ = notifier.store(fuser::INodeNo(ino), offset, data);
        }));
        raise_readahead(&mountpoint, READAHEAD_KB);
        install_signal_unmount(session.unmount_callable());
        *crate::sync::lock(&self.fatal.unmounter) = Some(session.unmount_callable());
        ready(Ok(()));
        tracing::info!(mountpoint = %spec.mountpoint.display(), "mounted");
        let r = session.run();
        self.shut_down();
        let _ = std::fs::remove_file(spec.data.join("control.sock"));
        if let Some(why) = crate::sync::lock(&self.fatal.why).clone() {
            tracing::error!("unmounted because a background thread died");
            return Err(FsError::Io(why));
        }
        tracing::info!("unmounted");
        r.map_err(|e| FsError::Io(e.to_string()))
    }
}

/// Serves Prometheus text on `listener` (`-o metrics=`), on the worker
/// runtime; each scrape takes a snapshot of `core` while it lives.
fn serve_metrics(core: &Arc<Core>, rt: &tokio::runtime::Runtime, listener: std::net::TcpListener) {
    match listener.local_addr() {
        Ok(a) => {
            tracing::info!(address = %a, "metrics served at http://{a}/metrics");
            core.ctx.metrics.set_address(a.to_string());
        }
        Err(e) => tracing::warn!("metrics endpoint: {e}"),
    }
    let weak = Arc::downgrade(core);
    let source: crate::metrics::http::Source =
        Arc::new(move || weak.upgrade().map(|c| c.stats()).unwrap_or_default());
    crate::metrics::http::serve(rt.handle(), listener, source);
}

/// Sets the readahead of the mount at `mountpoint` to `kb`. The kernel
/// starts a FUSE mount with the default 128 KiB, and `max_readahead` in the
/// INIT reply can only lower it: cold sequential reads through the page
/// cache would reach the daemon in 128 KiB requests. Needs root (sysfs);
/// skipped otherwise. Reads /proc/self/mountinfo, never the mount itself.
fn raise_readahead(mountpoint: &Path, kb: u32) {
    let Some(dev) = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|info| mount_device(&info, mountpoint))
    else {
        tracing::debug!("mount of {} not found in mountinfo", mountpoint.display());
        return;
    };
    let knob = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&knob, kb.to_string()) {
        Ok(()) => tracing::debug!("{knob} = {kb}"),
        Err(e) => tracing::debug!("cannot set {knob}: {e}"),
    }
}

/// The `major:minor` of the last mount on `mountpoint` in a mountinfo text.
fn mount_device(info: &str, mountpoint: &Path) -> Option<String> {
    let want = mountpoint.to_str()?;
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && unescape_mountinfo(f[4]) == want).then(|| f[2].to_string())
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// SIGTERM/SIGINT/SIGHUP unmount cleanly instead of killing the daemon
/// with the mount still attached.
fn install_signal_unmount(mut unmounter: fuser::SessionUnmounter) {
    let set = unmount_signals();
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                tracing::info!("{sig:?}: unmounting");
                if let Err(e) = unmounter.unmount() {
                    tracing::error!("unmount failed: {e}");
                }
            }
        });
}

fn unmount_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGHUP);
    set
}

/// Blocks the unmount signals in the calling thread; call it before any
/// thread starts so that every thread inherits the mask and only the
/// signal thread receives them.
pub fn block_unmount_signals() {
    if let Err(e) = unmount_signals().thread_block() {
        tracing::warn!("cannot block signals: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_of_a_mount_is_found_in_mountinfo_with_escaped_names() {
        let info = "36 35 98:0 / / rw - ext4 /dev/vda rw\n\
                    90 36 0:52 / /tmp/a\\040b rw - fuse.leasefs leasefs:/d rw\n\
                    91 36 0:53 / /tmp/a\\040b rw - fuse.leasefs leasefs:/d rw\n";
        assert_eq!(
            mount_device(info, Path::new("/tmp/a b")).as_deref(),
            Some("0:53")
        );
        assert_eq!(mount_device(info, Path::new("/tmp/a")), None);
        assert_eq!(unescape_mountinfo("a\\134b\\011"), "a\\b\t");
    }
}
