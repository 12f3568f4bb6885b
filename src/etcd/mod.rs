//! The connection to an etcd cluster, shared by the etcd metadata backend,
//! the cluster-wide file leases and the housekeeping election.
//!
//! etcd-client is async; leasefs's callers are plain threads (FUSE request
//! threads, the blocking pool, the lease monitor). [`Etcd::run`] drives one
//! request on this connection's own small runtime and waits for it, bounded
//! by a timeout, so a lost etcd turns into an error instead of a hang.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

pub mod election;
pub mod leases;
pub mod queue;

use crate::error::{FsError, FsResult};

/// How long one etcd request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The key of file `file`'s cluster claim (relative to the prefix): the
/// lease layer writes it, the metadata layer checks it (see
/// [`crate::meta::Change::Claimed`]).
pub fn claim_key(file: u64) -> String {
    format!("lease/{file:016x}")
}

pub struct Etcd {
    rt: tokio::runtime::Runtime,
    client: Client,
    /// Every key of this filesystem starts with `/leasefs/<name>/`.
    prefix: String,
    endpoints: Vec<String>,
}

impl Etcd {
    /// Connects to `endpoints` (`host:port`, or full `http://` URLs) and
    /// keeps this filesystem's keys under `/leasefs/<name>/`.
    pub fn connect(endpoints: &[String], name: &str) -> FsResult<Etcd> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("etcd")
            // A blocking thread made while a caller's sync was moved
            // would otherwise keep its CPU (see `sync_cpus`).
            .on_thread_start(crate::sync_cpus::unpinned_start())
            .enable_all()
            .build()
            .map_err(|e| FsError::Meta(format!("cannot start the etcd runtime: {e}")))?;
        let urls: Vec<String> = endpoints
            .iter()
            .map(|e| {
                if e.contains("://") {
                    e.clone()
                } else {
                    format!("http://{e}")
                }
            })
            .collect();
        let opts = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        let client = rt
            .block_on(async {
                tokio::time::timeout(REQUEST_TIMEOUT, Client::connect(&urls, Some(opts))).await
            })
            .map_err(|_| FsError::Meta(format!("etcd at {} did not answer", urls.join(","))))?
            .map_err(|e| {
                FsError::Meta(format!("cannot connect to etcd at {}: {e}", urls.join(",")))
            })?;
        let c = Etcd {
            rt,
            client,
            prefix: format!("/leasefs/{name}/"),
            endpoints: urls,
        };
        // A connection is lazy: ask something so a dead endpoint fails now.
        c.run(|mut cl| async move { cl.status().await })?;
        Ok(c)
    }

    /// Runs one request (built from a clone of the client, which is cheap)
    /// and waits for it for at most [`REQUEST_TIMEOUT`].
    pub fn run<T, F, Fut>(&self, f: F) -> FsResult<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.run_within(REQUEST_TIMEOUT, f)
    }

    /// As [`Etcd::run`] with a timeout of its own (keep-alives must fail
    /// fast enough to fence before a TTL runs out).
    pub fn run_within<T, F, Fut>(&self, limit: Duration, f: F) -> FsResult<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let fut = f(self.client.clone());
        self.rt
            .block_on(async { tokio::time::timeout(limit, fut).await })
            .map_err(|_| FsError::Meta("etcd request timed out".into()))?
            .map_err(|e| {
                // etcd's NOSPACE alarm: its backend reached its quota.
                if e.to_string().contains("database space exceeded") {
                    FsError::Full(format!("etcd: {e}"))
                } else {
                    FsError::Meta(format!("etcd: {e}"))
                }
            })
    }

    /// Spawns a background task on this connection's runtime (keep-alive
    /// streams, election campaigns).
    pub fn spawn<Fut>(&self, fut: Fut) -> tokio::task::JoinHandle<Fut::Output>
    where
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        self.rt.spawn(fut)
    }

    /// Waits for a task spawned with [`Etcd::spawn`] (no timeout).
    pub fn wait<T>(&self, h: tokio::task::JoinHandle<T>) -> Option<T> {
        self.rt.block_on(h).ok()
    }

    /// One keep-alive of etcd lease `id`, answered within `limit`.
    pub fn keep_alive_once(&self, id: i64, limit: Duration) -> KeepAlive {
        self.wait(self.keep_alive_task(id, limit))
            .unwrap_or(KeepAlive::Unanswered)
    }

    /// [`Etcd::keep_alive_once`] started in the background, so that several
    /// keep-alives run at once; its answer is there within `limit`.
    pub fn keep_alive_task(&self, id: i64, limit: Duration) -> tokio::task::JoinHandle<KeepAlive> {
        let mut c = self.client.clone();
        self.spawn(async move {
            let once = async move {
                let (mut k, mut s) = c.lease_keep_alive(id).await?;
                k.keep_alive().await?;
                Ok::<_, etcd_client::Error>(s.message().await?.map(|r| r.ttl()))
            };
            match tokio::time::timeout(limit, once).await {
                Ok(Ok(Some(ttl))) if ttl > 0 => KeepAlive::Confirmed { ttl },
                // etcd answers a lease it does not know (revoked, or run
                // out) with a TTL of 0.
                Ok(Ok(Some(_))) => KeepAlive::Gone,
                Ok(Err(e)) if lease_not_found(&e) => KeepAlive::Gone,
                _ => KeepAlive::Unanswered,
            }
        })
    }

    /// A new etcd lease of `ttl_secs`; returns its id.
    pub fn grant(&self, ttl_secs: i64) -> FsResult<i64> {
        Ok(self
            .run(|mut c| async move { c.lease_grant(ttl_secs, None).await })?
            .id())
    }

    /// Revokes etcd lease `id` (its keys go with it); best effort.
    pub fn revoke(&self, id: i64) {
        if let Err(e) = self.run(|mut c| async move { c.lease_revoke(id).await }) {
            tracing::debug!(id, "etcd lease revoke: {e}");
        }
    }

    /// [`Etcd::revoke`] in the background: the caller does not wait for an
    /// etcd that may be unreachable.
    pub fn revoke_later(&self, id: i64) {
        let mut c = self.client.clone();
        self.spawn(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, c.lease_revoke(id)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::debug!(id, "etcd lease revoke: {e}"),
                Err(_) => tracing::debug!(id, "etcd lease revoke timed out"),
            }
        });
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The full key for `rest` (which must not start with '/').
    pub fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
}

/// What etcd said to one keep-alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Renewed: the lease lives `ttl` seconds from when etcd got it.
    Confirmed { ttl: i64 },
    /// etcd does not know the lease (revoked, or run out): whatever it
    /// stood for is over now, not at some later deadline.
    Gone,
    /// No answer in time, or an error that says nothing about the lease.
    Unanswered,
}

impl KeepAlive {
    pub fn confirmed(self) -> bool {
        matches!(self, KeepAlive::Confirmed { .. })
    }
}

/// etcd's answer for a lease it does not know: "requested lease not
/// found" from the server, or etcd-client's "lease keep alive error: lease
/// not found" for a keep-alive answered with a TTL of 0.
fn lease_not_found(e: &etcd_client::Error) -> bool {
    e.to_string().contains("lease not found")
}
