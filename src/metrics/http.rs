//! The Prometheus endpoint (`-o metrics=HOST:PORT`): `GET /metrics` over
//! HTTP/1.1 (hyper), on the daemon's worker runtime, never on a FUSE
//! request thread. Each scrape takes one snapshot on the blocking pool (it
//! may read datanode directories' filesystems). Bounded: at most
//! [`MAX_CONNECTIONS`] connections at once (more wait in the listen
//! backlog), headers within [`HEADER_TIMEOUT`], and a connection lives at
//! most [`CONNECTION_LIFETIME`].

use crate::sync::Arc;
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use super::Snapshot;

pub const MAX_CONNECTIONS: usize = 8;
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Takes a snapshot of the mount for one scrape.
pub type Source = Arc<dyn Fn() -> Snapshot + Send + Sync>;

/// Why the endpoint could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("metrics={addr}: cannot resolve the address: {source}")]
    Resolve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics={addr}: cannot listen: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Binds `addr` (`HOST:PORT`; port 0 picks a free one). Done before the
/// mount, so that an address in use or unknown fails the mount with one
/// line.
pub fn bind(addr: &str) -> Result<StdListener, ServeError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| ServeError::Resolve {
            addr: addr.into(),
            source,
        })?
        .collect();
    let l = StdListener::bind(&addrs[..]).map_err(|source| ServeError::Bind {
        addr: addr.into(),
        source,
    })?;
    l.set_nonblocking(true).map_err(|source| ServeError::Bind {
        addr: addr.into(),
        source,
    })?;
    Ok(l)
}

/// Serves `listener` on `rt` until the runtime shuts down.
pub fn serve(rt: &tokio::runtime::Handle, listener: StdListener, source: Source) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    rt.spawn(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return tracing::error!("metrics endpoint: {e}"),
        };
        loop {
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("metrics endpoint: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let source = source.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(req, source.clone()));
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                    Ok(Err(e)) => tracing::debug!("metrics connection: {e}"),
                    Err(_) => tracing::debug!("metrics connection closed after its lifetime"),
                    Ok(Ok(())) => {}
                }
                drop(permit);
            });
        }
    });
}

async fn answer(
    req: Request<Incoming>,
    source: Source,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |code: StatusCode, ctype: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        if let Ok(v) = ctype.parse() {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        Ok(r)
    };
    let text = "text/plain; charset=utf-8";
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            text,
            "only /metrics is served\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            "only GET /metrics\n".into(),
        );
    }
    let encoded = tokio::task::spawn_blocking(move || super::prometheus::encode(source())).await;
    match encoded {
        Ok(Ok(body)) => reply(StatusCode::OK, super::prometheus::CONTENT_TYPE, body),
        Ok(Err(e)) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            text,
            format!("encoding failed: {e}\n"),
        ),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            text,
            format!("snapshot failed: {e}\n"),
        ),
    }
}
