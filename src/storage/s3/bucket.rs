//! [`Bucket`]: the object store under one prefix, with synchronous
//! methods. [`super::ObjectDatanode`] is called from the daemon's blocking
//! threads (as a directory datanode's `pread`s are), so each request runs
//! on a small tokio runtime the bucket owns: never on the daemon's own
//! runtime, whose worker a `block_on` would stall.

use crate::sync::{AtomicU64, Ordering};
use std::io;
use std::ops::Range;
use std::path::PathBuf;

use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};

use crate::storage::StorageError;
use crate::sync::Arc;

/// An object store and the prefix a datanode owns in it.
pub struct Bucket {
    /// `Some` until dropped; shut down in the background on drop, so a
    /// bucket dropped from an async context does not panic.
    rt: Option<tokio::runtime::Runtime>,
    store: Arc<dyn ObjectStore>,
    /// `s3://bucket/prefix`, as errors, logs and `datanode list` name it.
    url: String,
    /// The prefix inside the bucket (no leading or trailing `/`; may be empty).
    prefix: String,
    /// Requests sent, by kind (what the store bills and what the layout
    /// costs; docs/SEMANTICS.md, "Object-store datanodes").
    counts: Requests,
    /// How long a PUT whose connection failed is sent again (see
    /// [`Bucket::put`]); the client's own retries have the same bound.
    retry_for: std::time::Duration,
}

/// Requests sent to the store, by kind.
#[derive(Debug, Default)]
pub struct Requests {
    pub put: AtomicU64,
    pub get: AtomicU64,
    pub list: AtomicU64,
    pub delete: AtomicU64,
    pub copy: AtomicU64,
}

impl Requests {
    /// (put, get, list, delete, copy) so far.
    pub fn snapshot(&self) -> [u64; 5] {
        [&self.put, &self.get, &self.list, &self.delete, &self.copy]
            .map(|c| c.load(Ordering::Relaxed))
    }
}

/// Whether a request failed on its connection (reset, closed, refused,
/// timed out) rather than with an answer from the store: the error says
/// so through an I/O error among its causes, or through the HTTP client's
/// error (`object_store` shows it as "HTTP error: ..."; a status from the
/// store reads "Server returned ...").
fn connection_failed(e: &object_store::Error) -> bool {
    if !matches!(e, object_store::Error::Generic { .. }) {
        return false;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<io::Error>() {
            return true;
        }
        cause = c.source();
    }
    e.to_string().contains("HTTP error: ")
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("url", &self.url).finish()
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// One object as listed: its key relative to the prefix, and its size.
#[derive(Debug, Clone)]
pub struct Listed {
    pub rel: String,
    pub size: u64,
    /// When the store says it was written.
    pub modified: Option<std::time::SystemTime>,
}

impl Bucket {
    /// A bucket reached through `store`, owning `prefix`, named `url`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        url: String,
        prefix: String,
    ) -> Result<Bucket, StorageError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("leasefs-s3")
            .enable_all()
            .build()
            .map_err(|e| StorageError::io(&PathBuf::from(&url), e))?;
        Ok(Bucket {
            rt: Some(rt),
            store,
            url,
            prefix: prefix.trim_matches('/').to_string(),
            counts: Requests::default(),
            retry_for: std::time::Duration::ZERO,
        })
    }

    /// The bucket, its PUTs sent again for up to `d` after a connection
    /// failure (`-o s3_retry_timeout=`).
    pub fn retrying_for(mut self, d: std::time::Duration) -> Bucket {
        self.retry_for = d;
        self
    }

    /// Requests sent so far.
    pub fn requests(&self) -> &Requests {
        &self.counts
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key of `rel` under the prefix.
    fn key(&self, rel: &str) -> Key {
        if self.prefix.is_empty() {
            Key::from(rel)
        } else {
            Key::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// `rel` as a path in errors: `s3://bucket/prefix/rel`.
    pub fn path_of(&self, rel: &str) -> PathBuf {
        PathBuf::from(format!("{}/{rel}", self.url))
    }

    /// Runs `f` to completion on the bucket's runtime. From inside another
    /// runtime's context (where `block_on` would panic) it runs on a scoped
    /// thread of its own.
    fn run<T: Send>(&self, f: impl std::future::Future<Output = T> + Send) -> T {
        let rt = self.rt.as_ref().expect("runtime present until drop");
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| rt.block_on(f))
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
        } else {
            rt.block_on(f)
        }
    }

    fn err(&self, rel: &str, e: object_store::Error) -> StorageError {
        StorageError::Io {
            path: self.path_of(rel),
            source: io::Error::other(e),
        }
    }

    /// PUT: returns once the store acknowledged the whole object.
    ///
    /// Sent again, until `retry_for` after the first try, when it failed
    /// on its connection rather than with an answer from the store: the
    /// client retries some of those itself but gives up at once on others
    /// (a connection it classes as failing in an unknown way: a 4 s cut
    /// of the store's connection failed a PUT after 2.4 s of a 30 s
    /// timeout, tests/s3_hosts.rs). Every key leasefs PUTs to is written
    /// with the same bytes each time (a slice, a marker, an identity
    /// object), so sending one again changes nothing but the outcome.
    pub fn put(&self, rel: &str, body: Vec<u8>) -> Result<(), StorageError> {
        let key = self.key(rel);
        let payload = PutPayload::from(body);
        let start = std::time::Instant::now();
        let mut wait = std::time::Duration::from_millis(100);
        let mut again = false;
        loop {
            bump(&self.counts.put, 1);
            let put = self.store.put(&key, payload.clone());
            let r = if again {
                // A PUT sent again ends with the first one's time: the
                // client's own retries inside it are cut there.
                let left = self.retry_for.saturating_sub(start.elapsed());
                match self.run(async { tokio::time::timeout(left, put).await }) {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(StorageError::Io {
                            path: self.path_of(rel),
                            source: io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!("PUT not acknowledged in {:?}", self.retry_for),
                            ),
                        });
                    }
                }
            } else {
                self.run(put)
            };
            match r {
                Ok(_) => return Ok(()),
                Err(e) if connection_failed(&e) && start.elapsed() + wait < self.retry_for => {
                    tracing::info!(key = %key, "PUT failed on its connection, sent again in {wait:?}: {e}");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(std::time::Duration::from_secs(1));
                    again = true;
                }
                Err(e) => return Err(self.err(rel, e)),
            }
        }
    }

    /// PUT unless the object exists (`If-None-Match: *`); `false` when the
    /// store says it does. A store that ignores the header (Garage 2.5.0:
    /// docs/SEMANTICS.md, "Object-store datanodes", *Identity*) overwrites
    /// as a plain PUT; one that refuses it is sent a plain PUT instead.
    pub fn put_new(&self, rel: &str, body: Vec<u8>) -> Result<bool, StorageError> {
        let key = self.key(rel);
        bump(&self.counts.put, 1);
        let opts = PutOptions::from(PutMode::Create);
        let payload = PutPayload::from(body.clone());
        match self.run(self.store.put_opts(&key, payload, opts)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => {
                tracing::debug!(key = %key, "conditional PUT refused ({e}): a plain PUT instead");
                self.put(rel, body).map(|()| true)
            }
        }
    }

    /// The whole object; `None` when there is none.
    pub fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let key = self.key(rel);
        bump(&self.counts.get, 1);
        let r = self.run(async {
            let got = self.store.get(&key).await?;
            got.bytes().await
        });
        match r {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(rel, e)),
        }
    }

    /// Bytes `range` of the object, each range fetched in parallel.
    pub fn get_ranges(
        &self,
        rel: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>, StorageError> {
        let key = self.key(rel);
        bump(&self.counts.get, ranges.len() as u64);
        self.run(self.store.get_ranges(&key, ranges))
            .map(|v| v.into_iter().map(|b| b.to_vec()).collect())
            .map_err(|e| self.err(rel, e))
    }

    /// Removes the object (absent: no error).
    pub fn delete(&self, rel: &str) -> Result<(), StorageError> {
        let key = self.key(rel);
        bump(&self.counts.delete, 1);
        match self.run(self.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(rel, e)),
        }
    }

    /// A server-side copy (no bytes through the daemon).
    pub fn copy(&self, from: &str, to: &str) -> Result<(), StorageError> {
        let (f, t) = (self.key(from), self.key(to));
        bump(&self.counts.copy, 1);
        self.run(self.store.copy(&f, &t))
            .map_err(|e| self.err(from, e))
    }

    /// Every object whose key starts with `rel/` (every page of the
    /// listing), keys relative to the prefix.
    pub fn list(&self, rel: &str) -> Result<Vec<Listed>, StorageError> {
        let key = self.key(rel);
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        bump(&self.counts.list, 1);
        let metas: Vec<object_store::ObjectMeta> = self
            .run(self.store.list(Some(&key)).try_collect())
            .map_err(|e| self.err(rel, e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let k = m.location.to_string();
                k.strip_prefix(&strip).map(|r| Listed {
                    rel: r.to_string(),
                    size: m.size,
                    modified: Some(m.last_modified.into()),
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(source: Box<dyn std::error::Error + Send + Sync>) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source,
        }
    }

    #[test]
    fn only_a_failed_connection_sends_a_put_again() {
        let reset = io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer");
        assert!(connection_failed(&generic(Box::new(reset))));
        // The client's error as `object_store` shows it, no I/O cause.
        let http = "Error performing PUT in 2.3s - HTTP error: error sending request";
        assert!(connection_failed(&generic(http.into())));
        // An answer from the store is no connection failure.
        let status = "Server returned non-2xx status code: 403 Forbidden";
        assert!(!connection_failed(&generic(status.into())));
        let gone = object_store::Error::NotFound {
            path: "k".into(),
            source: Box::new(io::Error::other("404")),
        };
        assert!(!connection_failed(&gone));
    }
}
