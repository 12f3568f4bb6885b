//! The Prometheus endpoint (`-o metrics=HOST:PORT`): `GET /metrics` over
//! HTTP/1.1 (hyper), on the daemon's worker runtime, never on a FUSE
//! request thread. Each scrape takes one snapshot on the blocking pool (it
//! may read datanode directories' filesystems).
//!
//! Anyone who can reach the address may connect, so no client may keep a
//! scrape out: every connection is accepted at once and then given one of
//! [`MAX_CONNECTIONS`] places, taken from the oldest connection not being
//! answered when all are held (see [`conns`](super::conns)); only when
//! every place is answering a request does a new connection get `503` at
//! once. A connection has [`HEADER_TIMEOUT`] to send each request head
//! (idle between requests included), lives at most
//! [`CONNECTION_LIFETIME`] and is closed after [`MAX_REQUESTS`] answers.

use crate::sync::Arc;
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::Snapshot;
use super::conns::{Conn, Conns};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// Time to send a request head, from the connection's start or the end
/// of its previous answer: an idle or trickling client lets go by then.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest a connection is served, whatever it does.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(20);
/// Requests answered on one connection; the last answer says
/// `Connection: close`.
pub const MAX_REQUESTS: u64 = 16;
/// Connections being told `503` at once (each for at most
/// [`REFUSAL_TIME`]); more are closed without a word.
const MAX_REFUSING: usize = 32;
const REFUSAL_TIME: Duration = Duration::from_secs(1);

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
    let conns = Conns::new(MAX_CONNECTIONS);
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    rt.spawn(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return tracing::error!("metrics endpoint: {e}"),
        };
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("metrics endpoint: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(place) = conns.admit() else {
                if let Ok(permit) = refusing.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(REFUSAL_TIME, refuse(stream)).await;
                        drop(permit);
                    });
                }
                continue;
            };
            let source = source.clone();
            tokio::spawn(async move {
                let conn = place.conn.clone();
                let service = {
                    let conn = conn.clone();
                    hyper::service::service_fn(move |req| {
                        answer_on(conn.clone(), req, source.clone())
                    })
                };
                let http = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    r = http => if let Err(e) = r {
                        tracing::debug!("metrics connection: {e}");
                    },
                    _ = conn.evicted.notified() => {
                        tracing::debug!("metrics connection closed to make room for a newer one");
                    }
                    _ = tokio::time::sleep(CONNECTION_LIFETIME) => {
                        tracing::debug!("metrics connection closed after its lifetime");
                    }
                }
                drop(place);
            });
        }
    });
}

/// Tells a client that every place is answering a request: `503`, then
/// its request is read off (so that closing does not reset the
/// connection before it reads the answer).
async fn refuse(mut s: TcpStream) {
    let body = "every connection is answering a scrape; retry\n";
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(head.as_bytes()).await.is_err() || s.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 1024];
    while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
}

/// Answers one request of `conn` (which is not evicted meanwhile); its
/// [`MAX_REQUESTS`]th closes the connection.
async fn answer_on(
    conn: Arc<Conn>,
    req: Request<Incoming>,
    source: Source,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let busy = conn.answering();
    let mut r = answer(req, source).await?;
    if busy.nth >= MAX_REQUESTS {
        r.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    Ok(r)
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
