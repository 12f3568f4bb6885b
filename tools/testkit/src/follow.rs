//! `testkit follow PATH OUT TOTAL`: a reader following a file as it grows
//! (as `tail -f` does, by polling): one descriptor opened at the start,
//! read to its end every 10 ms. It says `size N` each time `stat` shows a
//! new size, at once, so that the test can pace its writer by what the
//! reader saw; once it has read TOTAL bytes (or after 30 s) it saves what
//! it read to OUT and says `done`.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn follow(path: &Path, out: &Path, total: usize) -> io::Result<()> {
    let mut f = File::open(path)?;
    let mut stdout = io::stdout().lock();
    let mut data = Vec::new();
    let mut last = None;
    let mut buf = vec![0u8; 1 << 20];
    let deadline = Instant::now() + Duration::from_secs(30);
    while data.len() < total && Instant::now() < deadline {
        let size = std::fs::metadata(path)?.len();
        if last != Some(size) {
            writeln!(stdout, "size {size}")?;
            stdout.flush()?;
            last = Some(size);
        }
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(out, &data)?;
    writeln!(stdout, "done")?;
    stdout.flush()
}

pub fn run(path: &Path, out: &Path, total: usize) -> ExitCode {
    match follow(path, out, total) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testkit follow {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}
