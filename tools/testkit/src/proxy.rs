//! `testkit proxy TARGET`: a TCP proxy on loopback between one daemon and a
//! service it needs (etcd, an S3 endpoint), for the partition tests
//! (`tests/common/proxy.rs` drives it). It prints `listening PORT` once bound,
//! then takes one command a line on standard input and answers `ok` once
//! it is in force:
//!
//! - `pause`: nothing is forwarded either way (connections stay open, the
//!   bytes wait: a network that stopped delivering), new connections too;
//! - `resume`: everything waiting is delivered, forwarding goes on;
//! - `cut`: every connection is closed and new ones are closed as soon as
//!   they are accepted (a partition that resets);
//! - `heal`: connections are accepted and forwarded again.
//!
//! It exits when standard input ends. Only loopback addresses are used.

use std::io::{BufRead, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex};

#[derive(Default)]
struct State {
    paused: bool,
    cut: bool,
    /// Every socket of every live connection, to shut down on `cut`.
    socks: Vec<TcpStream>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, State> {
    s.0.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn run(target: &str) -> ExitCode {
    let listener = match TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => {
            eprintln!("testkit proxy: bind: {e}");
            return ExitCode::from(2);
        }
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    println!("listening {port}");
    let _ = std::io::stdout().flush();
    let shared: Shared = Arc::default();
    let s = shared.clone();
    let target = target.to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            if lock(&s).cut {
                let _ = conn.shutdown(Shutdown::Both);
                continue;
            }
            let Ok(up) = TcpStream::connect(&target) else {
                continue;
            };
            let _ = conn.set_nodelay(true);
            let _ = up.set_nodelay(true);
            {
                let mut st = lock(&s);
                for sock in [&conn, &up] {
                    if let Ok(c) = sock.try_clone() {
                        st.socks.push(c);
                    }
                }
            }
            for (from, to) in [(&conn, &up), (&up, &conn)] {
                if let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) {
                    let s = s.clone();
                    std::thread::spawn(move || pump(from, to, &s));
                }
            }
        }
    });
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        {
            let mut st = lock(&shared);
            match line.trim() {
                "pause" => st.paused = true,
                "resume" => st.paused = false,
                "cut" => {
                    st.cut = true;
                    for sock in st.socks.drain(..) {
                        let _ = sock.shutdown(Shutdown::Both);
                    }
                }
                "heal" => st.cut = false,
                other => {
                    eprintln!("testkit proxy: unknown command {other:?}");
                    continue;
                }
            }
            shared.1.notify_all();
        }
        println!("ok");
        let _ = std::io::stdout().flush();
    }
    ExitCode::SUCCESS
}

/// Copies `from` to `to`, holding each chunk while paused.
fn pump(mut from: TcpStream, mut to: TcpStream, s: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut st = lock(s);
        while st.paused && !st.cut {
            st = s.1.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.cut {
            break;
        }
        drop(st);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
