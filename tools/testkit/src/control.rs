//! Raw clients of the daemon's control socket (docs/SEMANTICS.md "The
//! control socket"), for what the leasefs commands never send:
//!
//! - `testkit control SOCK REQUEST`: sends REQUEST as one line and prints
//!   the answer line.
//! - `testkit control-idle SOCK N`: opens N connections and sends nothing
//!   on them, then opens one more and prints `extra ANSWER` (what the
//!   daemon says to it); then waits for the daemon to drop the idle ones
//!   and prints `dropped after SECS`.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

fn answer_line(conn: &UnixStream) -> io::Result<String> {
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    Ok(line.trim().to_string())
}

fn report(r: io::Result<()>, what: &str) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testkit {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

pub fn request(sock: &Path, req: &str) -> ExitCode {
    let r = (|| -> io::Result<()> {
        let mut conn = UnixStream::connect(sock)?;
        conn.write_all(format!("{req}\n").as_bytes())?;
        println!("{}", answer_line(&conn)?);
        Ok(())
    })();
    report(r, "control")
}

pub fn idle(sock: &Path, n: usize) -> ExitCode {
    let r = (|| -> io::Result<()> {
        // The daemon takes connections in the order they were made, so the
        // idle ones are counted before the extra one is looked at.
        let conns = (0..n)
            .map(|_| UnixStream::connect(sock))
            .collect::<io::Result<Vec<_>>>()?;
        let extra = UnixStream::connect(sock)?;
        println!("extra {}", answer_line(&extra)?);
        io::stdout().flush()?;
        let t0 = Instant::now();
        for c in &conns {
            answer_line(c)?;
        }
        println!("dropped after {:.1}", t0.elapsed().as_secs_f64());
        Ok(())
    })();
    report(r, "control-idle")
}
