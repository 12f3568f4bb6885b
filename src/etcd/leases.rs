//! [`Cluster`] on etcd: a file's claim is the key `lease/<ino>`, created
//! only if absent and bound to an etcd lease of the soft limit's TTL, kept
//! alive by the daemon while any of its handles holds or waits for the
//! file. The revision that created the key is the claim's epoch base, so
//! epochs of one file grow across daemons.
//!
//! Writers that wait (`lease_wait`) queue in etcd (`super::queue`), and a
//! claim is made only in turn: FIFO across daemons, so a file released on
//! one daemon goes to whoever waited first, on whichever daemon.
//!
//! A writer refused on another daemon leaves `want/<ino>/<mount>` (bound
//! to its daemon's liveness lease); the holding daemon then treats it as a local
//! contender would: a client-renewed holder silent for the soft limit is
//! preempted and recovered, and the claim goes with it (HDFS: a create
//! that meets an expired lease triggers its recovery, and a retry wins).
//!
//! Partitions: a claim whose keep-alives have not been acknowledged for two
//! thirds of the TTL is given up locally (`on_lost`: the holder is fenced
//! and its stream aborted) before etcd can let it expire for others.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::queue;
use super::{Etcd, KeepAlive, claim_key};
use crate::lease::cluster::{Claim, ClaimInfo, Cluster, EPOCH_SEQ_BITS, Ticket, Turn, Unrenewed};
use crate::lease::{EpochSource, FileId, HandleId};
use std::sync::atomic::{AtomicI64, Ordering};

use crate::clock::BootInstant as Instant;
use crate::sync::{Arc, Condvar, Mutex, lock};

struct Held {
    lease_id: i64,
    base: u64,
    handles: HashSet<HandleId>,
    /// When etcd last acknowledged a keep-alive (or granted the lease).
    last_ok: Instant,
}

pub struct EtcdLeases {
    etcd: Arc<Etcd>,
    mount_id: String,
    ttl: Duration,
    claims: Mutex<HashMap<FileId, Held>>,
    /// Files whose claim or release is in flight to etcd.
    moving: Mutex<HashSet<FileId>>,
    moved: Condvar,
    /// Grants per file under its current claim, for [`ClaimEpochs`].
    seqs: Arc<Mutex<HashMap<FileId, (u64, u64)>>>,
    /// The etcd lease of this daemon's liveness key `mounts/<id>`.
    mount_lease: AtomicI64,
    /// Files this daemon has marked wanted (`want/<ino>/<mount>`).
    wanting: Mutex<HashSet<FileId>>,
}

/// Epochs `base << 24 | n` for the n-th grant under a file's claim.
pub struct ClaimEpochs {
    seqs: Arc<Mutex<HashMap<FileId, (u64, u64)>>>,
}

impl EpochSource for ClaimEpochs {
    fn next(&mut self, file: FileId) -> Result<u64, String> {
        let mut m = lock(&self.seqs);
        let e = m.entry(file).or_insert((0, 0));
        e.1 += 1;
        if e.1 >= 1 << EPOCH_SEQ_BITS {
            tracing::error!(file, "2^24 grants under one claim; epochs no longer grow");
            e.1 = (1 << EPOCH_SEQ_BITS) - 1;
        }
        Ok((e.0 << EPOCH_SEQ_BITS) | e.1)
    }
}

fn want_key(file: FileId, mount_id: &str) -> String {
    format!("want/{file:016x}/{mount_id}")
}

fn mount_key(id: &str) -> String {
    format!("mounts/{id}")
}

impl EtcdLeases {
    /// Registers this daemon instance as alive (`mounts/<mount_id>`, bound
    /// to an etcd lease of `ttl`, kept alive by [`EtcdLeases::keep_alive`]).
    pub fn new(etcd: Arc<Etcd>, mount_id: String, ttl: Duration) -> Result<Arc<Self>, String> {
        let secs = ttl_secs(ttl);
        let id = register(&etcd, &mount_id, secs)?;
        Ok(Arc::new(EtcdLeases {
            etcd,
            mount_id,
            ttl: Duration::from_secs(secs as u64),
            claims: Mutex::new(HashMap::new()),
            moving: Mutex::new(HashSet::new()),
            moved: Condvar::new(),
            seqs: Arc::new(Mutex::new(HashMap::new())),
            mount_lease: AtomicI64::new(id),
            wanting: Mutex::new(HashSet::new()),
        }))
    }

    /// After this daemon's liveness lease ran out (etcd unreachable for a
    /// TTL), registers it anew, so that other daemons do not take its
    /// files for those of a dead daemon. Its claims were fenced meanwhile.
    fn reregister(&self) {
        match register(&self.etcd, &self.mount_id, self.ttl.as_secs() as i64) {
            Ok(id) => {
                let old = self.mount_lease.swap(id, Ordering::Relaxed);
                self.etcd.revoke_later(old);
                tracing::warn!("registered this daemon in etcd again");
            }
            Err(e) => tracing::error!("cannot register this daemon in etcd again: {e}"),
        }
    }

    pub fn epochs(&self) -> ClaimEpochs {
        ClaimEpochs {
            seqs: self.seqs.clone(),
        }
    }

    /// The keep-alive period: three tries within one TTL.
    pub fn period(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(200))
    }

    /// One round of keep-alives (run every [`EtcdLeases::period`]): every
    /// claim is renewed; claims not acknowledged for 2/3 of the TTL are
    /// dropped and passed to `on_lost`; renewed claims of files a writer
    /// elsewhere wants are passed to `preempt`. The keep-alives of a round
    /// run at once, each bounded by its claim's deadline, and lost claims
    /// are revoked in the background: an unreachable etcd makes no claim
    /// wait for another's timeout.
    pub fn keep_alive(&self, preempt: &dyn Fn(FileId), on_lost: &dyn Fn(FileId)) -> Round {
        let limit = self.ttl * 2 / 3;
        let sent = Instant::now();
        let held: Vec<(FileId, i64, Instant)> = lock(&self.claims)
            .iter()
            .map(|(f, h)| (*f, h.lease_id, h.last_ok + limit))
            .collect();
        let mut pending = Vec::with_capacity(held.len());
        for (file, lease_id, deadline) in held {
            let left = deadline.saturating_duration_since(sent).min(self.period());
            let task = (!left.is_zero()).then(|| self.etcd.keep_alive_task(lease_id, left));
            pending.push((deadline, file, lease_id, task));
        }
        let mount_lease = self.mount_lease.load(Ordering::Relaxed);
        let mount = self.etcd.keep_alive_task(mount_lease, self.period());
        // Earliest deadline first: each answer is in by its own deadline.
        pending.sort_by_key(|p| p.0);
        let mut next_deadline: Option<Instant> = None;
        let mut renewed = Vec::new();
        for (deadline, file, lease_id, task) in pending {
            let answer = task
                .and_then(|t| self.etcd.wait(t))
                .unwrap_or(KeepAlive::Unanswered);
            if answer.confirmed() {
                // etcd restarted the TTL after `sent`: counting from then
                // errs on the safe side.
                if let Some(h) = lock(&self.claims).get_mut(&file)
                    && h.lease_id == lease_id
                {
                    h.last_ok = h.last_ok.max(sent);
                }
                renewed.push(file);
                continue;
            }
            // etcd says the claim is gone (revoked behind this daemon's
            // back, or run out while it stalled): given up now, not at
            // its deadline; unanswered: only once its deadline passed.
            let gone = answer == KeepAlive::Gone;
            let lost = {
                let mut claims = lock(&self.claims);
                match claims.get(&file) {
                    Some(h) if h.lease_id == lease_id && (gone || h.last_ok.elapsed() >= limit) => {
                        claims.remove(&file);
                        lock(&self.seqs).remove(&file);
                        true
                    }
                    _ => false,
                }
            };
            if lost {
                if gone {
                    tracing::warn!(
                        file,
                        "etcd says the cluster claim is gone; giving the file up"
                    );
                } else {
                    tracing::warn!(
                        file,
                        "cluster claim not renewed in time; giving the file up"
                    );
                }
                on_lost(file);
                self.etcd.revoke_later(lease_id);
            } else {
                next_deadline = Some(next_deadline.map_or(deadline, |d| d.min(deadline)));
            }
        }
        let mount = self.etcd.wait(mount).unwrap_or(KeepAlive::Unanswered);
        let alive = mount.confirmed();
        // Only once etcd answers again (every claim renewed): a register
        // that waits on an unreachable etcd must not delay any fencing.
        if mount == KeepAlive::Gone || (!alive && next_deadline.is_none()) {
            self.reregister();
        }
        // Fencing first; only then the (bounded) look at wanted files.
        if !renewed.is_empty() {
            let wanted = self.wanted();
            for f in renewed.into_iter().filter(|f| wanted.contains(f)) {
                preempt(f);
            }
        }
        Round {
            alive,
            next_deadline,
        }
    }

    /// Files a writer on another daemon was refused and still wants.
    fn wanted(&self) -> HashSet<FileId> {
        let prefix = self.etcd.key("want/");
        let p = prefix.clone();
        let r = self.etcd.run_within(self.period(), |mut c| async move {
            c.get(p, Some(GetOptions::new().with_prefix().with_keys_only()))
                .await
        });
        match r {
            Ok(r) => r
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let k = std::str::from_utf8(kv.key()).ok()?;
                    let file = k.strip_prefix(&prefix)?.split('/').next()?;
                    u64::from_str_radix(file, 16).ok()
                })
                .collect(),
            Err(_) => HashSet::new(),
        }
    }

    /// Records that a writer here was refused `file` (until this daemon
    /// goes, or gets the file). Once per file until then.
    fn want(&self, file: FileId) {
        if !lock(&self.wanting).insert(file) {
            return;
        }
        let key = self.etcd.key(&want_key(file, &self.mount_id));
        let (val, lease) = (
            self.mount_id.clone(),
            self.mount_lease.load(Ordering::Relaxed),
        );
        let r = self.etcd.run(|mut c| async move {
            c.put(key, val, Some(PutOptions::new().with_lease(lease)))
                .await
        });
        if let Err(e) = r {
            tracing::debug!(file, "cannot record a wanted file: {e}");
        }
    }

    fn unwant(&self, file: FileId) {
        if !lock(&self.wanting).remove(&file) {
            return;
        }
        let key = self.etcd.key(&want_key(file, &self.mount_id));
        if let Err(e) = self
            .etcd
            .run(|mut c| async move { c.delete(key, None).await })
        {
            tracing::debug!(file, "cannot clear a wanted file: {e}");
        }
    }

    fn revoke(&self, lease_id: i64) {
        self.etcd.revoke(lease_id)
    }

    /// Gives up every claim and the liveness key (clean unmount).
    pub fn shutdown(&self) {
        let all: Vec<i64> = lock(&self.claims)
            .drain()
            .map(|(_, h)| h.lease_id)
            .collect();
        for id in all {
            self.revoke(id);
        }
        self.revoke(self.mount_lease.load(Ordering::Relaxed));
    }

    /// Ends what daemon instance `mount_id` left behind: its liveness key
    /// and its claims. Only for an instance that is provably gone: the
    /// previous daemon of the data directory this daemon has locked.
    pub fn reap(&self, mount_id: &str) -> Result<usize, String> {
        let key = self.etcd.key(&mount_key(mount_id));
        let r = self
            .etcd
            .run(|mut c| async move { c.get(key, None).await })
            .map_err(|e| e.to_string())?;
        if let Some(id) = r
            .kvs()
            .first()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<i64>().ok())
        {
            self.revoke(id);
        }
        let prefix = self.etcd.key("lease/");
        let r = self
            .etcd
            .run(|mut c| async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await })
            .map_err(|e| e.to_string())?;
        let mut n = 0;
        for kv in r.kvs() {
            if let Ok(c) = serde_json::from_slice::<ClaimInfo>(kv.value())
                && c.mount_id == mount_id
                && c.lease_id != 0
            {
                self.revoke(c.lease_id);
                n += 1;
            }
        }
        Ok(n)
    }

    fn read_claim(&self, file: FileId) -> Option<ClaimInfo> {
        let key = self.etcd.key(&claim_key(file));
        let r = self
            .etcd
            .run(|mut c| async move { c.get(key, None).await })
            .ok()?;
        let kv = r.kvs().first()?;
        serde_json::from_slice(kv.value()).ok()
    }
}

impl EtcdLeases {
    /// Claims `file` in etcd (the caller has marked it moving).
    fn claim_in_etcd(
        &self,
        file: FileId,
        handle: HandleId,
        who: &ClaimInfo,
        known_free: bool,
    ) -> Result<Claim, String> {
        // A claim read as free just before needs no second look: the
        // transaction below settles races.
        if !known_free && let Some(other) = self.read_claim(file) {
            self.want(file);
            return Ok(Claim::Busy(other));
        }
        let secs = self.ttl.as_secs() as i64;
        // The TTL runs from etcd's grant, which comes after this.
        let granted = Instant::now();
        let lease_id = self.etcd.grant(secs).map_err(|e| e.to_string())?;
        let key = self.etcd.key(&claim_key(file));
        let who = ClaimInfo {
            lease_id,
            ..who.clone()
        };
        let val = serde_json::to_vec(&who).map_err(|e| e.to_string())?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                val,
                Some(PutOptions::new().with_lease(lease_id)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let r = self.etcd.run(|mut c| async move { c.txn(txn).await });
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.revoke(lease_id);
                return Err(e.to_string());
            }
        };
        if !r.succeeded() {
            self.revoke(lease_id);
            self.want(file);
            let holder = r.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .and_then(|kv| serde_json::from_slice::<ClaimInfo>(kv.value()).ok()),
                _ => None,
            });
            return Ok(Claim::Busy(holder.unwrap_or(ClaimInfo {
                mount_id: "?".into(),
                host: "another daemon".into(),
                pid: 0,
                comm: "?".into(),
                since_ms: 0,
                lease_id: 0,
            })));
        }
        let base = r.header().map(|h| h.revision()).unwrap_or(0).max(1) as u64;
        lock(&self.seqs).insert(file, (base, 0));
        lock(&self.claims).insert(
            file,
            Held {
                lease_id,
                base,
                handles: HashSet::from([handle]),
                last_ok: granted,
            },
        );
        tracing::debug!(file, base, "cluster claim taken");
        self.unwant(file);
        Ok(Claim::Mine { epoch_base: base })
    }
}

impl EtcdLeases {
    /// Claims `file` (this daemon's claim if it has one, else in etcd).
    /// Claims of different files go to etcd in parallel; one file's claim
    /// or release is in flight at most once (`moving`), and the lock order
    /// is `moving`, then `claims`. `known_free`: etcd showed no claim
    /// just before.
    fn claim_now(
        &self,
        file: FileId,
        handle: HandleId,
        who: &ClaimInfo,
        mut known_free: bool,
    ) -> Result<Claim, String> {
        let mut moving = lock(&self.moving);
        loop {
            if let Some(h) = lock(&self.claims).get_mut(&file) {
                h.handles.insert(handle);
                return Ok(Claim::Mine { epoch_base: h.base });
            }
            if !moving.contains(&file) {
                break;
            }
            // What etcd showed may have changed while we waited.
            known_free = false;
            moving = self.moved.wait(moving).unwrap_or_else(|e| e.into_inner());
        }
        moving.insert(file);
        drop(moving);
        let r = self.claim_in_etcd(file, handle, who, known_free);
        lock(&self.moving).remove(&file);
        self.moved.notify_all();
        r
    }
}

impl Cluster for EtcdLeases {
    fn claim(&self, file: FileId, handle: HandleId, who: &ClaimInfo) -> Result<Claim, String> {
        self.claim_now(file, handle, who, false)
    }

    fn claim_in_turn(
        &self,
        file: FileId,
        handle: HandleId,
        who: &ClaimInfo,
        pass: Option<Ticket>,
    ) -> Result<Turn, String> {
        let (holder, head) = queue::peek(&self.etcd, self.etcd.key(&claim_key(file)), file)?;
        if let Some(head) = head.filter(|h| Some(*h) != pass) {
            let claimed = holder.is_some() || lock(&self.claims).contains_key(&file);
            return Ok(Turn::Queued { head, claimed });
        }
        // Another daemon's claim; ours (held, or being made or given up
        // right now) is for `claim_now` to sort out.
        let free = holder.is_none();
        if let Some(other) = holder.filter(|h| h.mount_id != self.mount_id) {
            self.want(file);
            return Ok(Turn::Claim(Claim::Busy(other)));
        }
        self.claim_now(file, handle, who, free).map(Turn::Claim)
    }

    fn enqueue(&self, file: FileId, handle: HandleId) -> Result<Ticket, String> {
        let lease = self.mount_lease.load(Ordering::Relaxed);
        queue::enqueue(&self.etcd, lease, &self.mount_id, file, handle)
    }

    fn dequeue(&self, file: FileId, handle: HandleId) {
        queue::dequeue(&self.etcd, &self.mount_id, file, handle)
    }

    fn unclaim(&self, file: FileId, handle: HandleId) {
        // The file stays `moving` until its key is deleted: a claim of
        // this daemon right after (close, then reopen) waits for that
        // rather than finding the old key and taking it for another's.
        let mut moving = lock(&self.moving);
        let gone = {
            let mut claims = lock(&self.claims);
            let Some(h) = claims.get_mut(&file) else {
                return;
            };
            h.handles.remove(&handle);
            if !h.handles.is_empty() {
                return;
            }
            lock(&self.seqs).remove(&file);
            claims.remove(&file)
        };
        let Some(h) = gone else { return };
        moving.insert(file);
        drop(moving);
        self.revoke(h.lease_id);
        tracing::debug!(file, "cluster claim released");
        lock(&self.moving).remove(&file);
        self.moved.notify_all();
    }

    fn lost(&self, file: FileId, epoch: u64) -> bool {
        let base = epoch >> EPOCH_SEQ_BITS;
        let gone = {
            let mut claims = lock(&self.claims);
            match claims.get(&file) {
                Some(h) if h.base == base => {
                    lock(&self.seqs).remove(&file);
                    claims.remove(&file)
                }
                _ => None,
            }
        };
        match gone {
            Some(h) => {
                self.etcd.revoke_later(h.lease_id);
                true
            }
            None => false,
        }
    }

    fn renew(&self, file: FileId, epoch: u64) -> Result<Duration, Unrenewed> {
        let base = epoch >> EPOCH_SEQ_BITS;
        let limit = self.ttl * 2 / 3;
        let (lease_id, deadline) = match lock(&self.claims).get(&file) {
            Some(h) if h.base == base => (h.lease_id, h.last_ok + limit),
            _ => return Err(Unrenewed::Lost),
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .min(self.period());
        if left.is_zero() {
            return Err(Unrenewed::Unconfirmed);
        }
        let sent = Instant::now();
        match self.etcd.keep_alive_once(lease_id, left) {
            KeepAlive::Confirmed { .. } => {
                if let Some(h) = lock(&self.claims).get_mut(&file)
                    && h.lease_id == lease_id
                {
                    h.last_ok = h.last_ok.max(sent);
                }
                Ok((sent + self.ttl).saturating_duration_since(Instant::now()))
            }
            KeepAlive::Gone => {
                if self.lost(file, epoch) {
                    tracing::warn!(
                        file,
                        "etcd says the cluster claim is gone; giving the file up"
                    );
                }
                Err(Unrenewed::Lost)
            }
            KeepAlive::Unanswered => Err(Unrenewed::Unconfirmed),
        }
    }

    fn held(&self, file: FileId) -> Option<u64> {
        lock(&self.claims)
            .get(&file)
            .map(|h| h.base << EPOCH_SEQ_BITS)
    }

    fn end_remote(&self, file: FileId, claim: &ClaimInfo) {
        if claim.mount_id != self.mount_id && claim.lease_id != 0 {
            tracing::warn!(file, daemon = %claim.mount_id, "ending another daemon's claim (recover-lease)");
            self.revoke(claim.lease_id);
        }
    }

    fn remote_holder(&self, file: FileId) -> Option<ClaimInfo> {
        self.read_claim(file)
            .filter(|c| c.mount_id != self.mount_id)
    }

    fn claims(&self) -> Result<Vec<(FileId, ClaimInfo)>, String> {
        let prefix = self.etcd.key("lease/");
        let r = self
            .etcd
            .run(|mut c| async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await })
            .map_err(|e| e.to_string())?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                let k = std::str::from_utf8(kv.key()).ok()?;
                let file = u64::from_str_radix(k.rsplit('/').next()?, 16).ok()?;
                Some((file, serde_json::from_slice(kv.value()).ok()?))
            })
            .collect())
    }

    fn claimed_files(&self) -> Result<Vec<FileId>, String> {
        let prefix = self.etcd.key("lease/");
        let r = self
            .etcd
            .run(|mut c| async move {
                c.get(
                    prefix,
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
            })
            .map_err(|e| e.to_string())?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                let k = std::str::from_utf8(kv.key()).ok()?;
                u64::from_str_radix(k.rsplit('/').next()?, 16).ok()
            })
            .collect())
    }

    fn mount_alive(&self, mount_id: &str) -> bool {
        if mount_id == self.mount_id {
            return true;
        }
        let key = self.etcd.key(&mount_key(mount_id));
        // An unanswered question counts as alive: never recover a file
        // behind a live writer's back.
        self.etcd
            .run(|mut c| async move { c.get(key, None).await })
            .map(|r| !r.kvs().is_empty())
            .unwrap_or(true)
    }
}

/// What a round of [`EtcdLeases::keep_alive`] found.
pub struct Round {
    /// This daemon's own liveness lease was renewed (false: it must stop
    /// writing).
    pub alive: bool,
    /// The earliest deadline of a claim this round could not renew: the
    /// next round must come no later.
    pub next_deadline: Option<Instant>,
}

/// Puts `mounts/<mount_id>` under a new etcd lease of `secs`; returns the
/// lease (its id is the key's value, for a successor to end it).
fn register(etcd: &Etcd, mount_id: &str, secs: i64) -> Result<i64, String> {
    let id = etcd.grant(secs).map_err(|e| e.to_string())?;
    let key = etcd.key(&mount_key(mount_id));
    let val = id.to_string();
    etcd.run(|mut c| async move {
        c.put(key, val, Some(PutOptions::new().with_lease(id)))
            .await
    })
    .map_err(|e| e.to_string())?;
    Ok(id)
}

/// Keeps the claims alive until `stop` is set: a round every keep-alive
/// period (counted from the start of the last one), or sooner when an
/// unrenewed claim's deadline comes first.
pub fn keep_alive_loop(
    leases: Arc<EtcdLeases>,
    preempt: Box<dyn Fn(FileId) + Send>,
    on_lost: Box<dyn Fn(FileId) + Send>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let period = leases.period();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let started = Instant::now();
        let round = leases.keep_alive(&*preempt, &*on_lost);
        if !round.alive {
            tracing::error!("this daemon's liveness key in etcd has expired");
        }
        let next = round
            .next_deadline
            .map_or(started + period, |d| d.min(started + period));
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// The TTL of the etcd leases behind claims and liveness keys for a soft
/// limit of `soft`: whole seconds (etcd's unit), rounded up so that no
/// other daemon can claim a file before `soft` has passed since its last
/// confirmed renewal (a soft limit of 2.9 s is a TTL of 3 s, not 2), and
/// at least 2 s (below that etcd grants its own minimum anyway).
pub fn ttl_secs(soft: Duration) -> i64 {
    (soft.as_nanos().div_ceil(1_000_000_000) as i64).max(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_whole_seconds_rounded_up_and_at_least_two() {
        let ms = Duration::from_millis;
        assert_eq!(ttl_secs(ms(2900)), 3);
        assert_eq!(ttl_secs(ms(3000)), 3);
        assert_eq!(ttl_secs(ms(3001)), 4);
        assert_eq!(ttl_secs(ms(500)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(60)), 60);
    }
}
