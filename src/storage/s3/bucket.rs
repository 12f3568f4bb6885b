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
    /// How long a request whose connection failed is sent again (see
    /// [`Bucket::retried`]); the client's own retries have the same bound.
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
            // A blocking thread made while a caller's sync was moved
            // would otherwise keep its CPU (see `sync_cpus`).
            .on_thread_start(crate::sync_cpus::unpinned_start())
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

    /// The bucket, its requests sent again for up to `d` after a
    /// connection failure (`-o s3_retry_timeout=`).
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

    /// Runs the request `go` makes, counted in `count`, and sends it again,
    /// until `retry_for` after the first try, when it failed on its
    /// connection rather than with an answer from the store: the client
    /// retries some of those itself but gives up at once on others (a
    /// connection it classes as failing in an unknown way: a 4 s cut of the
    /// store's connection failed a PUT after 2.4 s of a 30 s timeout, and
    /// a host's `close` right after such a cut once failed with `EIO`,
    /// tests/s3_hosts.rs). Every request leasefs sends may be sent again:
    /// each key it PUTs is written with the same bytes each time (a slice,
    /// a marker, an identity object), a GET, a listing or a copy changes
    /// nothing, and a DELETE of what is gone succeeds. A request sent again
    /// ends with the first one's time: the client's own retries inside it
    /// are cut there.
    fn retried<T, F, Fut>(
        &self,
        count: &AtomicU64,
        verb: &str,
        key: &Key,
        mut go: F,
    ) -> object_store::Result<T>
    where
        T: Send,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>> + Send,
    {
        let start = std::time::Instant::now();
        let mut wait = std::time::Duration::from_millis(100);
        let mut again = false;
        loop {
            bump(count, 1);
            let request = go();
            let r = if again {
                let left = self.retry_for.saturating_sub(start.elapsed());
                match self.run(async { tokio::time::timeout(left, request).await }) {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(object_store::Error::Generic {
                            store: "S3",
                            source: Box::new(io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!("{verb} not answered in {:?}", self.retry_for),
                            )),
                        });
                    }
                }
            } else {
                self.run(request)
            };
            match r {
                Err(e) if connection_failed(&e) && start.elapsed() + wait < self.retry_for => {
                    tracing::info!(key = %key, "{verb} failed on its connection, sent again in {wait:?}: {e}");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(std::time::Duration::from_secs(1));
                    again = true;
                }
                r => return r,
            }
        }
    }

    /// PUT: returns once the store acknowledged the whole object (sent
    /// again after a failed connection: [`Bucket::retried`]).
    pub fn put(&self, rel: &str, body: Vec<u8>) -> Result<(), StorageError> {
        let key = self.key(rel);
        let payload = PutPayload::from(body);
        self.retried(&self.counts.put, "PUT", &key, || {
            self.store.put(&key, payload.clone())
        })
        .map(|_| ())
        .map_err(|e| self.err(rel, e))
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
        let r = self.retried(&self.counts.get, "GET", &key, || async {
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
        bump(&self.counts.get, (ranges.len() as u64).saturating_sub(1));
        self.retried(&self.counts.get, "GET", &key, || {
            self.store.get_ranges(&key, ranges)
        })
        .map(|v| v.into_iter().map(|b| b.to_vec()).collect())
        .map_err(|e| self.err(rel, e))
    }

    /// Removes the object (absent: no error).
    pub fn delete(&self, rel: &str) -> Result<(), StorageError> {
        let key = self.key(rel);
        match self.retried(&self.counts.delete, "DELETE", &key, || {
            self.store.delete(&key)
        }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(rel, e)),
        }
    }

    /// A server-side copy (no bytes through the daemon).
    pub fn copy(&self, from: &str, to: &str) -> Result<(), StorageError> {
        let (f, t) = (self.key(from), self.key(to));
        self.retried(&self.counts.copy, "COPY", &f, || self.store.copy(&f, &t))
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
        let metas: Vec<object_store::ObjectMeta> = self
            .retried(&self.counts.list, "LIST", &key, || {
                self.store.list(Some(&key)).try_collect()
            })
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

    /// An in-memory store whose first `fail` requests of every kind fail
    /// on their connection (a reset), as the first requests on connections
    /// a cut left behind do.
    #[derive(Debug)]
    struct Flaky {
        inner: object_store::memory::InMemory,
        fail: AtomicU64,
    }

    impl std::fmt::Display for Flaky {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Flaky")
        }
    }

    impl Flaky {
        fn cut(&self) -> object_store::Result<()> {
            if self.fail.load(Ordering::Relaxed) == 0 {
                return Ok(());
            }
            self.fail.fetch_sub(1, Ordering::Relaxed);
            let reset = io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer");
            Err(generic(Box::new(reset)))
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for Flaky {
        async fn put_opts(
            &self,
            k: &Key,
            p: PutPayload,
            o: PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            self.cut()?;
            self.inner.put_opts(k, p, o).await
        }
        async fn put_multipart_opts(
            &self,
            k: &Key,
            o: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.cut()?;
            self.inner.put_multipart_opts(k, o).await
        }
        async fn get_opts(
            &self,
            k: &Key,
            o: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.cut()?;
            self.inner.get_opts(k, o).await
        }
        async fn delete(&self, k: &Key) -> object_store::Result<()> {
            self.cut()?;
            self.inner.delete(k).await
        }
        fn list(
            &self,
            prefix: Option<&Key>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            match self.cut() {
                Ok(()) => self.inner.list(prefix),
                Err(e) => Box::pin(futures::stream::once(async { Err(e) })),
            }
        }
        async fn list_with_delimiter(
            &self,
            prefix: Option<&Key>,
        ) -> object_store::Result<object_store::ListResult> {
            self.cut()?;
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy(&self, from: &Key, to: &Key) -> object_store::Result<()> {
            self.cut()?;
            self.inner.copy(from, to).await
        }
        async fn copy_if_not_exists(&self, from: &Key, to: &Key) -> object_store::Result<()> {
            self.cut()?;
            self.inner.copy_if_not_exists(from, to).await
        }
    }

    fn flaky_bucket(retry: std::time::Duration) -> (Arc<Flaky>, Bucket) {
        let store = Arc::new(Flaky {
            inner: object_store::memory::InMemory::new(),
            fail: AtomicU64::new(0),
        });
        let b = Bucket::new(store.clone(), "s3://b/p".into(), "p".into())
            .unwrap()
            .retrying_for(retry);
        (store, b)
    }

    // Every kind of request rides out connections a cut left behind, not
    // only a PUT: a `close` right after a cut of the store failed with `EIO`
    // once in CI (tests/s3_hosts.rs), on requests the client gave up on.
    #[test]
    fn every_request_that_failed_on_its_connection_is_sent_again() {
        let (store, b) = flaky_bucket(std::time::Duration::from_secs(10));
        let again = |n| store.fail.store(n, Ordering::Relaxed);
        again(2);
        b.put("blk/1", b"one".to_vec()).unwrap();
        again(2);
        assert_eq!(b.get("blk/1").unwrap().as_deref(), Some(&b"one"[..]));
        again(2);
        assert_eq!(
            b.get_ranges("blk/1", &[0..2, 1..3]).unwrap(),
            vec![b"on".to_vec(), b"ne".to_vec()]
        );
        again(2);
        b.copy("blk/1", "blk/2").unwrap();
        again(2);
        let listed = b.list("blk").unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        again(2);
        b.delete("blk/1").unwrap();
        assert_eq!(b.get("blk/1").unwrap(), None);
        // Each failed try is a request sent (put, get, list, delete, copy;
        // the two ranges count as two GETs, their failed tries as one).
        assert_eq!(b.requests().snapshot(), [3, 8, 3, 3, 3]);
        // Without time to retry the failure is the caller's.
        let (store, b) = flaky_bucket(std::time::Duration::ZERO);
        store.fail.store(1, Ordering::Relaxed);
        assert!(b.list("blk").is_err());
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
