//! The queue of writers waiting for a file across daemons, in etcd (the
//! election recipe of etcd's `concurrency` package): a waiting open puts
//! `queue/<ino>/<mount>/<handle>`, bound to its daemon's liveness lease,
//! and the key's create revision is its place in line. Only the writer at
//! the head may claim the file (or one found stale: see
//! `fs::clustered`), so `lease_wait` is FIFO across daemons, and a file
//! released on one daemon goes to whoever waited first, wherever.

use etcd_client::{GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};

use super::Etcd;
use crate::lease::cluster::ClaimInfo;
use crate::lease::{FileId, HandleId};

/// A place in a file's queue: the create revision of its key.
pub type Ticket = u64;

fn file_prefix(file: FileId) -> String {
    format!("queue/{file:016x}/")
}

fn key(file: FileId, mount_id: &str, handle: HandleId) -> String {
    format!("{}{mount_id}/{handle:016x}", file_prefix(file))
}

/// Joins `file`'s queue for `handle`; returns its ticket.
pub fn enqueue(
    etcd: &Etcd,
    lease: i64,
    mount_id: &str,
    file: FileId,
    handle: HandleId,
) -> Result<Ticket, String> {
    let k = etcd.key(&key(file, mount_id, handle));
    let r = etcd
        .run(|mut c| async move {
            c.put(k, Vec::new(), Some(PutOptions::new().with_lease(lease)))
                .await
        })
        .map_err(|e| e.to_string())?;
    // A fresh key: its create revision is this put's revision.
    Ok(r.header().map_or(0, |h| h.revision()).max(0) as u64)
}

/// Leaves `file`'s queue (best effort: the key goes with the daemon's
/// liveness lease anyway).
pub fn dequeue(etcd: &Etcd, mount_id: &str, file: FileId, handle: HandleId) {
    let k = etcd.key(&key(file, mount_id, handle));
    if let Err(e) = etcd.run(|mut c| async move { c.delete(k, None).await }) {
        tracing::debug!(file, "cannot leave the queue: {e}");
    }
}

/// `file`'s claim and the head of its queue, read at one revision.
pub fn peek(
    etcd: &Etcd,
    claim_key: String,
    file: FileId,
) -> Result<(Option<ClaimInfo>, Option<Ticket>), String> {
    let head = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
        .with_keys_only();
    let txn = Txn::new().and_then([
        TxnOp::get(claim_key, None),
        TxnOp::get(etcd.key(&file_prefix(file)), Some(head)),
    ]);
    let r = etcd
        .run(|mut c| async move { c.txn(txn).await })
        .map_err(|e| e.to_string())?;
    let mut gets = r.op_responses().into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let claim = gets.next().and_then(|g| {
        g.kvs()
            .first()
            .and_then(|kv| serde_json::from_slice::<ClaimInfo>(kv.value()).ok())
    });
    let head = gets
        .next()
        .and_then(|g| g.kvs().first().map(|kv| kv.create_revision().max(0) as u64));
    Ok((claim, head))
}
