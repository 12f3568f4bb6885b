//! [`Core`]: open, read, write, flush, fsync, release and truncate with
//! leases, on top of the namespace and the write pipeline. No fuser types:
//! completions are callbacks, called from whichever thread finishes the
//! work (a lease grant, the stream worker), never while a lock is held.

use std::path::PathBuf;
use std::time::Duration;

use dashmap::DashMap;

use super::attr::Attr;
use super::cache::{PageCaches, ReadMode};
use super::deletions::Deletions;
use super::epochs::GrantEpochs;
use super::fencing::Fences;
use super::handles::{Handle, Handles};
use super::{privs, proc_info};
use crate::clock::{Clock, SystemClock};
use crate::config::MountOptions;
use crate::error::{FsError, FsResult};
use crate::lease::cluster::Cluster;
use crate::lease::{
    Acquire, AcquireOpts, EpochSource, Grant, Holder, LeaseConfig, LeaseError, LeaseManager,
    RecoveryReason,
};
use crate::meta::{Inode, Kind, Meta, UnderConstruction};
use crate::pipeline::reader::{self, BadReplicas, OpenReplicas};
use crate::pipeline::{Datanodes, OutputStream, StreamCtx};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering, lock};

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
            journal: crate::pipeline::journal::Journal::new(opts.journal_checkpoint),
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

    // ---- open / create ------------------------------------------------

    /// Opens `ino`. Readers are never gated; writers take the file's lease
    /// first, which may complete later (lease_wait, a pending release, or
    /// recovery of an expired holder).
    pub fn open(self: &Arc<Self>, ino: u64, flags: i32, caller: Caller, reply: Reply<Opened>) {
        self.open_as(ino, None, flags, caller, reply)
    }

    /// [`Self::open`], of the inode `created` when the same request just
    /// created it (see [`Opener::created`]).
    pub(super) fn open_as(
        self: &Arc<Self>,
        ino: u64,
        created: Option<Inode>,
        flags: i32,
        caller: Caller,
        reply: Reply<Opened>,
    ) {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let fh = self.handles.next_fh();
        if !write {
            return match self.meta().get(ino) {
                Ok(inode) => self.open_reader(fh, &inode, caller.uid, reply),
                Err(e) => reply(Err(e)),
            };
        }
        // A writer reads the inode once the lease is ours (`granted`), not
        // before: FUSE sends OPEN for regular files only (directories get
        // OPENDIR, the kernel keeps special files to itself), and anything
        // read before the grant could be stale by then.
        let who = proc_info::identity(caller.pid);
        let fence = self.fences.of(caller.pid, Some(&who));
        if let Err(e) = self.fences.check(fence, caller.uid) {
            return reply(Err(e));
        }
        let opener = Opener {
            who,
            uid: caller.uid,
            fence,
            fresh: created.is_some(),
            created: created.filter(|_| self.cluster.is_none()),
            again: None,
        };
        // Counted until answered; past its user's bound it does not wait
        // (see `waits`): only lease decisions read O_NONBLOCK.
        let permit = self.waits.enter(caller.uid);
        let flags = if permit.may_wait() {
            flags
        } else {
            flags | libc::O_NONBLOCK
        };
        let reply: Reply<Opened> = Box::new(move |r| {
            let _counted = permit;
            reply(r)
        });
        if let Some(cl) = self.cluster.clone() {
            // Claiming waits on the network: not on a request thread.
            let me = self.clone();
            self.ctx.rt.spawn_blocking(move || {
                let left = match me.claim(&*cl, ino, fh, flags, caller, &opener.who) {
                    Ok(left) => left,
                    Err(e) => return reply(Err(e)),
                };
                me.acquire_local(ino, fh, flags, caller, opener, left, reply)
            });
            return;
        }
        self.acquire_local(ino, fh, flags, caller, opener, None, reply)
    }

    /// A read-only handle (also what a write open of anything but a regular
    /// file gets). A file nobody changes is read through the page cache;
    /// one under construction directly, so that readers never see bytes
    /// not yet acknowledged nor a zero-filled last page (`cache`).
    fn open_reader(&self, fh: u64, inode: &Inode, uid: u32, reply: Reply<Opened>) {
        let ino = inode.ino;
        let mode = if inode.kind == Kind::File {
            self.read_mode(ino)
        } else {
            ReadMode::Direct
        };
        let h = Handle {
            fh,
            ino,
            write: false,
            append: false,
            sync_writes: false,
            cached: mode != ReadMode::Direct,
            epoch: 0,
            tgid: 0,
            fence: None,
            uid,
            flushed: Default::default(),
            fresh: Default::default(),
            stream: None,
            gate: Default::default(),
            replicas: OpenReplicas::new(uid),
        };
        self.handles.register(h);
        reply(Ok(match mode {
            ReadMode::Direct => Opened {
                fh,
                direct_io: true,
                keep_cache: false,
            },
            ReadMode::Cached { keep } => Opened {
                fh,
                direct_io: false,
                keep_cache: keep,
            },
        }))
    }

    /// Takes the file's lease among this daemon's handles (the whole
    /// decision on a lone daemon).
    /// `wait`: what is left of a wait begun in the queue across daemons
    /// (`None`: `lease_wait`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire_local(
        self: &Arc<Self>,
        ino: u64,
        fh: u64,
        flags: i32,
        caller: Caller,
        opener: Opener,
        wait: Option<Duration>,
        reply: Reply<Opened>,
    ) {
        let who = &opener.who;
        let holder = Holder {
            host: self.host.clone(),
            pid: who.tgid,
            comm: who.comm.clone(),
            handle: fh,
            opened_wall_ms: crate::clock::wall_ms(),
        };
        let me = self.clone();
        let cont: Box<dyn FnOnce(Result<Grant, LeaseError>) + Send> = Box::new(move |g| {
            me.waiter_tids.remove(&fh);
            match g {
                Ok(grant) => me.granted(ino, fh, flags, opener, grant, reply),
                Err(e) => {
                    me.unclaim(ino, fh);
                    reply(Err(e.into()))
                }
            }
        });
        let opts = AcquireOpts {
            nonblock: flags & libc::O_NONBLOCK != 0,
        };
        // The callback is shared between the immediate and deferred paths.
        let slot = Arc::new(Mutex::new(Some(cont)));
        let slot2 = slot.clone();
        let cb: Box<dyn FnOnce(Result<Grant, LeaseError>) + Send> = Box::new(move |g| {
            if let Some(c) = lock(&slot2).take() {
                c(g)
            }
        });
        let take = || lock(&slot).take();
        match self.leases.acquire_within(ino, holder, opts, wait, cb) {
            Ok(Acquire::Granted(g)) => {
                if let Some(c) = take() {
                    c(Ok(g))
                }
            }
            Ok(Acquire::Queued) => {
                tracing::info!(
                    ino,
                    fh,
                    pid = caller.pid,
                    uid = caller.uid,
                    "queued for the lease"
                );
                self.waiter_tids.insert(fh, (caller.pid, caller.uid));
                // The grant may have come in between.
                if lock(&slot).is_none() {
                    self.waiter_tids.remove(&fh);
                }
            }
            Ok(Acquire::Recover(ticket)) => self.spawn_recovery(ticket),
            Err(e) => {
                if let Some(c) = take() {
                    c(Err(e))
                }
            }
        }
    }

    /// The mode of a read-only open of a regular file: through the page
    /// cache only while nothing may change it (no stream, lease free) and
    /// never over etcd, where other daemons change files without this one
    /// knowing.
    fn read_mode(&self, ino: u64) -> ReadMode {
        if self.cluster.is_some()
            || self.stream_of(ino).is_some()
            || self.leases.state(ino) != crate::lease::LeaseState::Free
        {
            return ReadMode::Direct;
        }
        self.cache.open_reader(ino)
    }

    /// The lease is ours: set up the file's output stream.
    #[allow(clippy::too_many_arguments)]
    fn granted(
        self: &Arc<Self>,
        ino: u64,
        fh: u64,
        flags: i32,
        opener: Opener,
        grant: Grant,
        reply: Reply<Opened>,
    ) {
        let Opener {
            who,
            uid,
            fence,
            created,
            fresh,
            again,
        } = opener;
        let found = match created {
            Some(i) => Ok((i, false)),
            None => self
                .meta()
                .get_with_xattr(ino, privs::CAPABILITY)
                .map(|(i, caps)| (i, caps.is_some())),
        };
        let (inode, has_caps) = match found {
            Ok((i, caps)) if i.kind == Kind::File => (i, caps),
            r => {
                self.leases.release(ino, fh);
                self.unclaim(ino, fh);
                return match r.map(|(i, _)| i) {
                    Ok(i) if i.kind == Kind::Dir => reply(Err(FsError::IsDir)),
                    Ok(i) => self.open_reader(fh, &i, uid, reply),
                    Err(e) => reply(Err(e)),
                };
            }
        };
        let uc = UnderConstruction {
            ino,
            holder: format!("{}:{}", self.host, who.tgid),
            pid: who.tgid,
            comm: who.comm,
            epoch: grant.epoch,
            mount_id: self.mount_id.clone(),
            since_ms: crate::clock::wall_ms(),
        };
        let bs = if inode.block_size == 0 {
            self.opts.block_size
        } else {
            inode.block_size
        };
        // From here until this handle's release the file may change: read
        // opens go direct and no longer keep earlier pages.
        self.cache.busy(ino);
        let log = Arc::new(self.file_record(uc));
        let stream = OutputStream::new(self.ctx.clone(), ino, inode.size, bs, log, uid);
        let h = Handle {
            fh,
            ino,
            write: true,
            append: flags & libc::O_APPEND != 0,
            // O_SYNC is O_DSYNC and more (the same for leasefs: an fsync).
            sync_writes: flags & libc::O_DSYNC != 0,
            cached: false,
            epoch: grant.epoch,
            tgid: who.tgid,
            fence,
            uid,
            flushed: Default::default(),
            fresh: AtomicBool::new(fresh),
            stream: Some(stream.clone()),
            replicas: OpenReplicas::new(uid),
            gate: again
                .clone()
                .unwrap_or_else(|| super::handles::Gate::new(grant.epoch)),
        };
        let of = self.handles.open_file(ino);
        *lock(&of.stream) = Some(stream.clone());
        of.privs
            .store(privs::at_open(&inode, has_caps), Ordering::Relaxed);
        if again.is_some() {
            self.handles.replace(h);
        } else {
            self.handles.register(h);
        }
        self.epochs.granted(ino, grant.epoch);
        tracing::debug!(ino, fh, epoch = grant.epoch, "write lease granted");
        // Writers never use the page cache (see `open`).
        let opened = Opened {
            fh,
            direct_io: true,
            keep_cache: false,
        };
        // O_TRUNC follows as a SETATTR through this descriptor (`set_size`).
        if self.cluster.is_some() {
            // Other daemons change the file: the kernel's size of it may
            // be theirs of before (see `PageCaches::tell_size`).
            let (me, size, epoch) = (self.clone(), inode.size, grant.epoch);
            self.ctx.rt.spawn_blocking(move || {
                me.record_grant(ino, epoch);
                me.tell_kernel_size(ino, size);
                reply(Ok(opened))
            });
            return;
        }
        reply(Ok(opened))
    }

    // ---- read / write -------------------------------------------------

    /// Reads through `fh`. Through the writer's own descriptor a read first
    /// flushes what it wrote (read-your-writes, as on a local filesystem);
    /// every other reader sees the visible length.
    ///
    /// The replicas are read on the blocking pool, never on a request
    /// thread: a slow or failing datanode disk then stalls only its readers;
    /// with `in_memory`, bytes in memory are read first on this thread
    /// ([`Core::read_in_memory`]; false when the caller tried already).
    pub fn read_any(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        size: u32,
        in_memory: bool,
        reply: Reply<Vec<u8>>,
    ) {
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return reply(Err(e)),
        };
        let me = self.clone();
        match h.stream.clone() {
            Some(s) if s.pos() > s.visible_len() && offset + size as u64 > s.visible_len() => {
                // The flush completes on the stream's worker, off the loop.
                s.flush(Box::new(move |r| {
                    reply(r.and_then(|_| me.read(fh, offset, size)))
                }));
            }
            _ => {
                if in_memory {
                    let mut d = reader::spare_buffer(size as usize);
                    if let Some(n) = self.read_in_memory_of(&h, offset, &mut d) {
                        d.truncate(n);
                        return reply(Ok(d));
                    }
                    reader::recycle(d);
                }
                self.ctx
                    .rt
                    .spawn_blocking(move || reply(me.read(fh, offset, size)));
            }
        }
    }

    /// A read served on the request thread, into `out` (as many bytes as
    /// the request asks): only of a file nobody writes, with a local
    /// metadata store (whose reads every lookup makes on a request thread
    /// too), through replica readers the handle keeps, and only if every
    /// byte and checksum it needs is in memory (`reader::read_cached`).
    /// How many bytes it read, or `None`: the request then goes to
    /// [`Core::read_any`], which reads it on the blocking pool. A hand-off
    /// to the pool and back cost a served 1 MiB read more than its copies
    /// (benches/PROFILE.md, "Reads, issue 28").
    pub fn read_in_memory(&self, fh: u64, offset: u64, out: &mut [u8]) -> Option<usize> {
        let h = self.handles.get(fh).ok()?;
        self.read_in_memory_of(&h, offset, out)
    }

    fn read_in_memory_of(&self, h: &Handle, offset: u64, out: &mut [u8]) -> Option<usize> {
        if self.cluster.is_some()
            || h.stream.is_some()
            || h.replicas.is_empty()
            || self.stream_of(h.ino).is_some()
        {
            return None;
        }
        let inode = self.meta().get(h.ino).ok()?;
        let blocks = self.meta().blocks(h.ino).ok()?;
        let bs = if inode.block_size == 0 {
            self.opts.block_size
        } else {
            inode.block_size
        };
        let n = reader::read_cached(&h.replicas, &blocks, bs, inode.size, offset, out)?;
        self.ctx.metrics.read(n as u64);
        Some(n)
    }

    /// fsync of a directory: the metadata store's log made durable, on the
    /// blocking pool.
    pub fn fsync_dir(self: &Arc<Self>, reply: Reply<()>) {
        let me = self.clone();
        self.ctx
            .rt
            .spawn_blocking(move || reply(me.meta().sync_if_needed()));
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handles.get(fh)?;
        // A writer may reopen the last block for append (new generation
        // stamp) between our reading the block list and the replicas.
        let mut tries = 0;
        loop {
            match self.read_once(h.ino, offset, size, Some(&h.replicas)) {
                Err(FsError::Moved(why)) if tries < 20 => {
                    tries += 1;
                    tracing::debug!(ino = h.ino, "read again: {why}");
                    std::thread::sleep(std::time::Duration::from_micros(200 * tries));
                }
                r => {
                    if let Ok(d) = &r {
                        self.ctx.metrics.read(d.len() as u64);
                    }
                    return r;
                }
            }
        }
    }

    /// One read of `ino`; `open`: the handle's kept replica readers.
    pub(super) fn read_once(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        open: Option<&OpenReplicas>,
    ) -> FsResult<Vec<u8>> {
        // The stream before the store, as in `getattr`.
        let stream = self.stream_of(ino);
        let inode = self.meta().get(ino)?;
        let len = match stream {
            Some(s) => s.visible_len(),
            None => inode.size,
        };
        tracing::trace!(ino, offset, size, len, "read");
        if offset >= len {
            return Ok(Vec::new());
        }
        let blocks = self.meta().blocks(ino)?;
        let bs = if inode.block_size == 0 {
            self.opts.block_size
        } else {
            inode.block_size
        };
        let mut skipped = Vec::new();
        let r = reader::read(
            self.dns(),
            self.bad(),
            open,
            &blocks,
            bs,
            len,
            offset,
            size as usize,
            &mut skipped,
        );
        if r.is_ok() && !skipped.is_empty() {
            // Passed-over replicas the block list still names as they were
            // read are really missing or stale; the others had moved on.
            let now = self.meta().blocks(ino)?;
            for sk in skipped {
                let current = now.iter().any(|b| {
                    b.block_id == sk.block && b.gs == sk.gs && b.replicas.contains(&sk.dn)
                });
                if current {
                    reader::report_replica(self.bad(), sk.block, sk.dn, &sk.why);
                }
            }
        }
        r
    }

    /// Writes through `fh`. `kill_suidgid` is the kernel's word that the
    /// caller lacks CAP_FSETID: the write then clears setuid and setgid
    /// (`privs`) before its bytes go anywhere.
    pub fn write(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        data: &[u8],
        (caller, kill_suidgid): (Caller, bool),
        reply: Reply<u32>,
    ) {
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return reply(Err(e)),
        };
        if h.stream.is_none() {
            return reply(Err(FsError::BadHandle));
        }
        if !h.live() {
            // A close ended this description's grant: a new one first.
            let (me, data) = (self.clone(), data.to_vec());
            self.ctx
                .rt
                .spawn_blocking(move || match me.regrant(fh, caller) {
                    Ok(_) => me.write(fh, offset, &data, (caller, kill_suidgid), reply),
                    Err(e) => reply(Err(e)),
                });
            return;
        }
        if let Err(e) = self.writable(&h) {
            tracing::warn!(ino = h.ino, fh, uid = h.uid, "write refused: {e}");
            return reply(Err(e));
        }
        if self.handles.privs_to_drop(h.ino, kill_suidgid) {
            return self.drop_privs_then_write(h, offset, data, (caller, kill_suidgid), reply);
        }
        self.write_checked(&h, offset, data, reply)
    }

    /// The write of `Core::write` once privileges are dropped. The drop
    /// is a metadata commit: on the request thread only when it is local.
    fn drop_privs_then_write(
        self: &Arc<Self>,
        h: Arc<Handle>,
        offset: u64,
        data: &[u8],
        (caller, kill_suidgid): (Caller, bool),
        reply: Reply<u32>,
    ) {
        let kill = if kill_suidgid {
            privs::Kill::Yes
        } else {
            privs::Kill::No
        };
        // A mode cleared here is not one the kernel knows: it would show
        // the old one from its attribute cache (to a statx of the mode
        // alone) for up to a second. So such a write is answered only once
        // the kernel has forgotten the inode's attributes, which it is
        // told from the blocking pool, never from a request thread.
        if self.cluster.is_some() {
            let (me, data) = (self.clone(), data.to_vec());
            self.ctx
                .rt
                .spawn_blocking(move || match me.drop_privs(h.ino, caller, kill) {
                    Ok(changed) => {
                        if changed {
                            me.cache.forget_attrs(h.ino);
                        }
                        me.write_checked(&h, offset, &data, reply)
                    }
                    Err(e) => reply(Err(e)),
                });
            return;
        }
        match self.drop_privs(h.ino, caller, kill) {
            Ok(false) => self.write_checked(&h, offset, data, reply),
            Ok(true) => {
                let (me, data) = (self.clone(), data.to_vec());
                self.ctx.rt.spawn_blocking(move || {
                    me.cache.forget_attrs(h.ino);
                    me.write_checked(&h, offset, &data, reply)
                });
            }
            Err(e) => reply(Err(e)),
        }
    }

    /// Drops what a data change of `ino` by `caller` removes (see
    /// `privs`), and remembers what is left for the next write; whether
    /// the mode changed.
    pub(super) fn drop_privs(&self, ino: u64, caller: Caller, kill: privs::Kill) -> FsResult<bool> {
        let (i, changed) = privs::drop(&**self.meta(), ino, caller, kill)?;
        self.handles.note_privs(ino, privs::mode_bits(&i), false);
        Ok(changed)
    }

    /// Appends through the handle's stream; the reply may wait for acks
    /// (backpressure). O_APPEND writes go to the real end of the file.
    ///
    /// While handles that read through the page cache are open (opened
    /// before this writer), the reply waits until the bytes are
    /// acknowledged and the pages from the previous visible end to the new
    /// one are invalidated: the kernel grows its file size when the reply
    /// arrives, and a page it read while the end was there (zero-filled
    /// past it) must not survive that, nor may the size pass unacknowledged
    /// bytes.
    fn write_checked(self: &Arc<Self>, h: &Handle, offset: u64, data: &[u8], reply: Reply<u32>) {
        let fh = h.fh;
        let Some(stream) = h.stream.as_ref() else {
            return reply(Err(FsError::BadHandle));
        };
        // Held until the write is in the stream: a close that ends the
        // grant (`closing`) waits for it, and closes it with the rest.
        let Some(_entered) = h.gate.enter(h.epoch) else {
            let (me, data) = (self.clone(), data.to_vec());
            let caller = Caller {
                pid: h.tgid,
                uid: h.uid,
                gid: 0,
            };
            self.ctx
                .rt
                .spawn_blocking(move || match me.regrant(fh, caller) {
                    Ok(h) => me.write_checked(&h, offset, &data, reply),
                    Err(e) => reply(Err(e)),
                });
            return;
        };
        if h.flushed.swap(false, Ordering::Relaxed) {
            self.leases.note_write(h.ino, fh);
        }
        // The kernel grows its size of the file when this write returns,
        // by bytes not yet acknowledged; while it may still hold the
        // attributes of the create's reply, a stat would show that size
        // without asking (docs/SEMANTICS.md "Visible length"). Forgetting
        // them first sends the next stat here, for the visible length.
        if h.fresh.swap(false, Ordering::Relaxed) {
            self.cache.forget_attrs(h.ino);
        }
        let reply: Reply<u32> = if h.sync_writes {
            let s = stream.clone();
            Box::new(move |r| match r {
                Ok(n) => s.sync(Box::new(move |r| reply(r.map(|_| n)))),
                Err(e) => reply(Err(e)),
            })
        } else {
            reply
        };
        let n = data.len() as u32;
        let off = if h.append { None } else { Some(offset) };
        let reply = self.kernel_size_after(h, stream, offset, data, reply);
        if !self.cache.has_cached_readers(h.ino) {
            return stream.write(off, data, Box::new(move |r| reply(r.map(|_| n))));
        }
        let from = stream.visible_len();
        let (s, me, ino) = (stream.clone(), self.clone(), h.ino);
        stream.write(
            off,
            data,
            Box::new(move |r| {
                if let Err(e) = r {
                    return reply(Err(e));
                }
                let s2 = s.clone();
                s.flush(Box::new(move |r| match r {
                    Err(e) => reply(Err(e)),
                    Ok(()) => {
                        let to = s2.visible_len();
                        me.cache
                            .invalidate_range_then(ino, from, to, move || reply(Ok(n)));
                    }
                }));
            }),
        );
    }

    /// close(): every byte of this writer acknowledged by all replicas,
    /// and the file closed as far as its metadata goes (last block
    /// finalised, length committed), so that a failed commit (`ENOSPC` of
    /// a full metadata store) is what `close()` returns: FUSE's RELEASE
    /// comes after `close()` has returned, and its errors reach nobody.
    /// Only a close by the process that opened the handle counts as the
    /// holder closing (for the reopen grace): a child closing an inherited
    /// copy (exec) does not.
    pub fn flush(self: &Arc<Self>, fh: u64, caller: Caller, reply: Reply<()>) {
        let (h, stream) = match self.writer(fh) {
            Ok(Some(w)) => w,
            Ok(None) => return reply(Ok(())),
            Err(e) => return reply(Err(e)),
        };
        // The holder's main thread needs no /proc read to be recognised.
        let by_holder = caller.pid == h.tgid || proc_info::identity(caller.pid).tgid == h.tgid;
        let me = self.clone();
        let s = stream.clone();
        stream.close(Box::new(move |r| {
            if r.is_ok() && by_holder {
                // Over etcd the close ends the grant (`closing`).
                if me.cluster.is_some() {
                    return me.end_grant_at_close(h, s, reply);
                }
                h.flushed.store(true, Ordering::Relaxed);
                me.leases.note_flush(h.ino, h.fh);
            }
            reply(r)
        }));
    }

    /// The handle and stream of a descriptor that may still write, or
    /// `None` for a read-only one.
    fn writer(&self, fh: u64) -> FsResult<Option<(Arc<Handle>, Arc<OutputStream>)>> {
        let h = self.handles.get(fh)?;
        let Some(stream) = h.stream.clone() else {
            return Ok(None);
        };
        // A grant a close ended has nothing left to close.
        if !h.live() {
            return Ok(None);
        }
        self.writable(&h)?;
        Ok(Some((h, stream)))
    }

    /// The open file description is gone: close the file (finalising its
    /// last block) and hand the lease to the next waiter.
    pub fn release(self: &Arc<Self>, fh: u64, reply: Reply<()>) {
        let Some(h) = self.handles.remove(fh) else {
            return reply(Ok(()));
        };
        let ino = h.ino;
        if h.write && !h.live() {
            // Its grant ended at a close (`closing`): nothing left to end.
            if h.cached {
                self.cache.cached_closed(ino);
            }
            self.drop_open(ino);
            return reply(Ok(()));
        }
        let stream_to_close = h.stream.clone();
        if h.write {
            // A handle of an ended election term closes nothing: its
            // unflushed bytes are dropped and the file is recovered.
            let _ = self.writable(&h);
        }
        let me = self.clone();
        let finish = move |r: FsResult<()>| {
            if h.write {
                me.end_grant(&h, false);
            }
            if h.cached {
                me.cache.cached_closed(h.ino);
            }
            // No cache invalidation here: the kernel's pages and size of this
            // inode were updated by the writer's own writes through it.
            me.drop_open(h.ino);
            reply(r)
        };
        let failed = stream_to_close.as_ref().and_then(|s| s.is_failed());
        match stream_to_close {
            // The writer is gone with its stream failed (no replica left):
            // close the file now by recovery, before the lease moves on.
            Some(_)
                if failed
                    .as_ref()
                    .is_some_and(|e| !matches!(e, FsError::Lease(LeaseError::Fenced { .. }))) =>
            {
                self.handles.close_started();
                let me = self.clone();
                self.ctx.rt.spawn_blocking(move || {
                    if let Err(e) = me.recover(ino, RecoveryReason::HolderGone) {
                        tracing::error!(ino, "recovery after a failed stream: {e}");
                    }
                    finish(Ok(()));
                    me.handles.close_finished();
                });
            }
            Some(stream) if failed.is_none() => {
                self.handles.close_started();
                let me = self.clone();
                stream.close(Box::new(move |r| {
                    if let Err(e) = &r {
                        tracing::error!("close failed: {e}");
                    }
                    finish(r);
                    me.handles.close_finished();
                }));
            }
            _ => finish(Ok(())),
        }
    }

    /// One open fewer; an unlinked file goes away with its last open.
    /// Over etcd another daemon may have removed its last name: the store
    /// says; on a lone daemon the unlink told its handles.
    fn drop_open(&self, ino: u64) {
        if let Some(unlinked) = self.handles.drop_open(ino)
            && (unlinked || self.cluster.is_some())
            && let Ok(i) = self.meta().get(ino)
            && i.nlink == 0
        {
            self.delete_inode(ino);
        }
    }

    /// Deletes an inode with no names and no opens, and its replicas.
    pub(crate) fn delete_inode(&self, ino: u64) {
        self.cache.drop_state(ino);
        self.ctx.ledger.forget(ino);
        match self.meta().delete_inode(ino) {
            Ok(blocks) => self.deletions.delete(blocks),
            Err(e) => tracing::error!(ino, "cannot delete inode: {e}"),
        }
    }

    // ---- truncate -------------------------------------------------------

    /// Changes a file's size. Needs the lease: through the caller's own
    /// handle (`fh`, or any write handle of the same process), or taken
    /// implicitly when nobody holds it.
    pub fn set_size(
        self: &Arc<Self>,
        ino: u64,
        size: u64,
        fh: Option<u64>,
        caller: Caller,
        reply: Reply<()>,
    ) {
        if let Err(e) = self.may_change(caller) {
            return reply(Err(e));
        }
        // A truncation drops privileges as a write does, once it is done.
        let me = self.clone();
        let reply: Reply<()> = Box::new(move |r| match r {
            // The reply carries the new mode to this kernel.
            Ok(()) => reply(
                me.drop_privs(ino, caller, privs::Kill::UnlessCapFsetid)
                    .map(drop),
            ),
            Err(e) => reply(Err(e)),
        });
        let own = fh
            .and_then(|f| self.handles.get(f).ok())
            .filter(|h| h.write && h.live())
            .or_else(|| {
                let tgid = proc_info::identity(caller.pid).tgid;
                self.handles
                    .find(|h| h.ino == ino && h.write && h.tgid == tgid && h.live())
            });
        if let Some(h) = own
            && let Some(stream) = h.stream.clone()
        {
            if let Err(e) = self.writable(&h) {
                return reply(Err(e));
            }
            let me = self.clone();
            return stream.truncate(
                size,
                Box::new(move |r| match r {
                    Ok(()) => me.cache.invalidate_all_then(ino, (), reply),
                    Err(e) => reply(Err(e)),
                }),
            );
        }
        // Nobody of ours holds it: take the lease for the duration.
        let me = self.clone();
        self.open(
            ino,
            libc::O_WRONLY,
            caller,
            Box::new(move |r| match r {
                Err(e) => reply(Err(e)),
                Ok(o) => {
                    let Ok(h) = me.handles.get(o.fh) else {
                        return reply(Err(FsError::BadHandle));
                    };
                    let Some(stream) = h.stream.clone() else {
                        return reply(Err(FsError::BadHandle));
                    };
                    let me2 = me.clone();
                    let release = move |r: FsResult<()>| {
                        me2.release(o.fh, Box::new(move |r2| reply(r.and(r2))))
                    };
                    let me3 = me.clone();
                    stream.truncate(
                        size,
                        Box::new(move |r| match r {
                            // Pages go while the file is still busy.
                            Ok(()) => me3.cache.invalidate_all_then(ino, (), Box::new(release)),
                            Err(e) => release(Err(e)),
                        }),
                    );
                }
            }),
        );
    }

    /// fallocate: mode 0 grows the file with zeros (like truncate) when the
    /// range ends past it; KEEP_SIZE is accepted and does nothing (blocks
    /// are not preallocated); other modes would rewrite existing bytes.
    pub fn fallocate(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
        caller: Caller,
        reply: Reply<()>,
    ) {
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return reply(Err(e)),
        };
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply(Err(FsError::Unsupported(
                "fallocate mode other than 0 or KEEP_SIZE",
            )));
        }
        let end = offset.saturating_add(length);
        let size = match self.getattr(h.ino) {
            Ok(a) => h.stream.as_ref().map(|s| s.pos()).unwrap_or(a.size),
            Err(e) => return reply(Err(e)),
        };
        if mode & libc::FALLOC_FL_KEEP_SIZE != 0 || end <= size {
            return reply(Ok(()));
        }
        self.set_size(h.ino, end, Some(fh), caller, reply)
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
