//! [`Core`]: the filesystem's state and what every request shares. Its
//! requests live beside it, one concern a module: `opening`, `reads`,
//! `writes` (with flush and release), `durability` (fsync), `truncate`,
//! `namespace`, `leasing`, `xattrs`. No fuser types: completions are
//! callbacks, called from whichever thread finishes the work (a lease
//! grant, the stream worker), never while a lock is held.

use std::path::PathBuf;
use std::time::Duration;

use dashmap::DashMap;

use super::attr::Attr;
use super::cache::PageCaches;
use super::deletions::Deletions;
use super::epochs::GrantEpochs;
use super::fencing::Fences;
use super::handles::Handles;
use super::proc_info;
use crate::clock::{Clock, SystemClock};
use crate::config::MountOptions;
use crate::error::FsResult;
use crate::lease::cluster::Cluster;
use crate::lease::{EpochSource, LeaseConfig, LeaseManager};
use crate::meta::{Inode, Meta};
use crate::pipeline::reader::BadReplicas;
use crate::pipeline::{Datanodes, OutputStream, StreamCtx};
use crate::sync::Arc;

/// ioctl: the caller takes over renewal of its lease (client renewal).
pub const IOC_CLIENT_RENEWAL: u32 = 0x4C01; // _IO('L', 1)
/// ioctl: renew the caller's lease now.
pub const IOC_RENEW: u32 = 0x4C02; // _IO('L', 2)
/// ioctl: the epoch of the caller's lease grant, as a u64.
pub const IOC_EPOCH: u32 = 0x8008_4C03; // _IOR('L', 3, u64)
/// ioctl: renew the caller's lease now, and say for how many milliseconds
/// (a u64, counted from the call) no other writer can be granted it.
pub const IOC_RENEW_VALID: u32 = 0x8008_4C04; // _IOR('L', 4, u64)

pub use super::cache::Invalidator;
pub use super::request::{Caller, Opened, Reply};

/// Who opens for writing: the process, its uid (who may see the holder's
/// details), and the election term's fence it belongs to, if any (its
/// handle stays fenced by that term).
pub(super) struct Opener {
    pub who: proc_info::Ident,
    pub uid: u32,
    pub fence: Option<u32>,
    /// The inode as the request that created it just made it (no
    /// capability xattr, nobody else's change yet): the grant then reads
    /// nothing. Only on a lone daemon.
    pub created: Option<Inode>,
    /// Opened by a create (see [`Handle::fresh`]).
    pub fresh: bool,
    /// A new grant of an open description whose grant ended at a close
    /// (`Core::regrant`): its gate; the handle replaces the old one.
    pub again: Option<Arc<super::handles::Gate>>,
}

/// The cluster side of a daemon that shares its namespace (etcd): claims
/// and the epochs derived from them.
pub struct ClusterParts {
    pub cluster: Arc<dyn Cluster>,
    pub epochs: Box<dyn EpochSource>,
}

/// Who this daemon is among the daemons of a namespace.
pub struct Instance {
    pub host: Arc<str>,
    /// Unique across daemons and restarts (`host:pid:start-ms`).
    pub mount_id: String,
    /// Set when the namespace is shared (etcd).
    pub cluster: Option<ClusterParts>,
}

impl Instance {
    /// This host and a fresh mount id; not (yet) part of a cluster.
    pub fn new() -> Instance {
        let host: Arc<str> = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into())
            .into();
        let mount_id = format!(
            "{}:{}:{}",
            host,
            std::process::id(),
            crate::clock::wall_ms()
        );
        Instance {
            host,
            mount_id,
            cluster: None,
        }
    }
}

impl Default for Instance {
    fn default() -> Self {
        Self::new()
    }
}

/// The filesystem: every request of the adapter is one call of it. It
/// owns the parts that keep the state of a mount, each behind its own
/// narrow interface:
/// - [`Handles`]: open file descriptions, per-inode open state, streams;
/// - [`PageCaches`]: what the kernel may cache of each inode;
/// - the [`LeaseManager`] (and, over etcd, the cluster claims), with the
///   threads of opens waiting for a lease;
/// - [`Fences`]: the election terms' process trees;
/// - [`GrantEpochs`]: grant epochs not yet recorded with their inodes;
/// - [`Deletions`]: replicas waiting for durable metadata to be deleted;
///
/// and the services it shares with the write pipeline (`ctx`: the
/// metadata store, the datanodes, the replicas found bad, the runtime),
/// held there once ([`Core::meta`], [`Core::dns`], [`Core::bad`]).
pub struct Core {
    /// Set when several daemons share the namespace: a write lease is then
    /// claimed cluster-wide before it is granted here.
    pub cluster: Option<Arc<dyn Cluster>>,
    pub leases: Arc<LeaseManager>,
    pub ctx: Arc<StreamCtx>,
    pub opts: MountOptions,
    pub data_dir: PathBuf,
    pub host: Arc<str>,
    pub mount_id: String,
    pub(super) handles: Handles,
    pub(super) cache: Arc<PageCaches>,
    pub(super) fences: Arc<Fences>,
    pub(super) epochs: GrantEpochs,
    pub(super) deletions: Arc<Deletions>,
    /// The thread of each open waiting for a lease (fh -> tid): its
    /// signals decide whether the wait is interrupted.
    pub(super) waiter_tids: DashMap<u64, (u32, u32)>,
    /// Write opens under way per user: past a bound they do not wait.
    pub(super) waits: Arc<super::waits::Waits>,
    /// The abstract socket name of the daemon's control service, once it
    /// listens (`user.leasefs.control` on the mount root).
    pub(super) control_address: std::sync::OnceLock<String>,
    /// Where the datanodes' flush marks stand (`super::unflushed`).
    pub(super) unflushed: crate::sync::Mutex<super::unflushed::pending::Marks>,
}

impl Core {
    pub fn new(
        meta: Arc<dyn Meta>,
        dns: Arc<Datanodes>,
        opts: MountOptions,
        rt: tokio::runtime::Handle,
        data_dir: PathBuf,
        clock: Arc<dyn Clock>,
        instance: Instance,
    ) -> Arc<Core> {
        let Instance {
            host,
            mount_id,
            cluster,
        } = instance;
        let cfg = LeaseConfig {
            soft_limit: opts.soft_limit,
            hard_limit: opts.hard_limit,
            lease_wait: opts.lease_wait,
            release_grace: Duration::from_secs(2),
        };
        let (cluster, epochs): (_, Box<dyn EpochSource>) = match cluster {
            Some(c) => (Some(c.cluster), c.epochs),
            None => (
                None,
                Box::new(super::epochs::StoreEpochs::new(meta.clone(), rt.clone())),
            ),
        };
        // The same for every mount of this data directory, however named.
        let owner = format!(
            "{host}:{}",
            std::fs::canonicalize(&data_dir)
                .unwrap_or_else(|_| data_dir.clone())
                .display()
        );
        let leases = Arc::new(LeaseManager::new(cfg, clock, epochs, host.clone()));
        let bad = Arc::new(BadReplicas::default());
        let budget = crate::pipeline::Budget::new(opts.write_buffer_packets(), rt.clone());
        let fences = Arc::new(Fences::new(owner, leases.clone(), meta.clone(), rt.clone()));
        let cache = Arc::new(PageCaches::new(rt.clone()));
        let deletions = Arc::new(Deletions::new(meta.clone(), dns.clone(), rt.clone()));
        let ctx = Arc::new(StreamCtx {
            bad,
            meta,
            dns,
            rt,
            packet_size: opts.packet_size as usize,
            max_in_flight: opts.max_packets_in_flight,
            publish_lengths: cluster.is_some(),
            sync_by_fs: opts.sync_by_fs,
            ledger: Default::default(),
            budget,
            metrics: Arc::default(),
            journal: Arc::new(crate::pipeline::journal::Journal::new(
                opts.journal_checkpoint,
            )),
            floor: Default::default(),
        });
        Arc::new(Core {
            cluster,
            leases,
            ctx,
            opts,
            data_dir,
            mount_id,
            host,
            handles: Handles::default(),
            cache,
            fences,
            epochs: GrantEpochs::default(),
            deletions,
            waiter_tids: DashMap::new(),
            waits: Arc::default(),
            control_address: std::sync::OnceLock::new(),
            unflushed: Default::default(),
        })
    }

    /// A core with the system clock (the daemon's).
    pub fn with_system_clock(
        meta: Arc<dyn Meta>,
        dns: Arc<Datanodes>,
        opts: MountOptions,
        rt: tokio::runtime::Handle,
        data_dir: PathBuf,
        instance: Instance,
    ) -> Arc<Core> {
        let clock = Arc::new(SystemClock::new());
        Self::new(meta, dns, opts, rt, data_dir, clock, instance)
    }

    /// The metadata store.
    pub fn meta(&self) -> &Arc<dyn Meta> {
        &self.ctx.meta
    }

    /// The datanodes of the mount.
    pub fn dns(&self) -> &Arc<Datanodes> {
        &self.ctx.dns
    }

    /// Replicas found bad (reads, syncs), for housekeeping to repair.
    pub fn bad(&self) -> &Arc<BadReplicas> {
        &self.ctx.bad
    }

    /// The live stream of a file, if a writer has it open.
    pub fn stream_of(&self, ino: u64) -> Option<Arc<OutputStream>> {
        self.handles.stream_of(ino)
    }

    /// The handle table (what the control socket checks a peer against).
    pub fn handles(&self) -> &Handles {
        &self.handles
    }

    /// The kernel evicted the inode, and its cached pages with it.
    pub fn forget_pages(&self, ino: u64) {
        self.cache.forget(ino)
    }

    /// The election terms' fences.
    pub fn fences(&self) -> &Arc<Fences> {
        &self.fences
    }

    /// Attributes with the live view of a file under construction: its
    /// visible (acknowledged) length and latest write time.
    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        // The stream first: a closing stream records the final length in the
        // store before it goes away, so either it is found here or the store
        // read after this has its length.
        let stream = self.stream_of(ino);
        let i = self.meta().get(ino)?;
        let mut a = Attr::from_inode(&i);
        if let Some(s) = stream {
            a.size = s.visible_len();
            if let Some(m) = s.mtime() {
                a.mtime = m;
                a.ctime = a.ctime.max(m);
            }
            a.under_construction = true;
        }
        tracing::trace!(ino, size = a.size, uc = a.under_construction, "getattr");
        Ok(a)
    }

    /// Waits until closes in progress have finished (unmount).
    /// Whether every close finished.
    pub fn wait_closes(&self, max: Duration) -> bool {
        self.handles.wait_closes(max)
    }

    /// The one check of every request that changes the filesystem (create,
    /// remove, rename, link, attributes, xattrs, truncate, open for
    /// writing): refused with EIO when the caller belongs to the command
    /// of an election term that is over.
    pub fn may_change(&self, caller: Caller) -> FsResult<()> {
        self.fences
            .check(self.fences.of(caller.pid, None), caller.uid)
    }

    pub fn stream_stats_json(&self, ino: u64) -> Option<String> {
        self.stream_of(ino)
            .and_then(|s| serde_json::to_string(&s.stats()).ok())
    }
}
