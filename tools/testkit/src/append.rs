//! `testkit append SRC DST`: a writer that appends SRC's bytes to DST
//! (`O_APPEND`) from DST's current length, piece by piece with fsyncs, and
//! after each fsync that returned appends DST's length to a side file
//! (outside the mount): what the writer was told is durable. The tests of
//! crashes and failing datanodes compare the file with it.
//!
//! It says `started POS` once DST is open, then `ok LEN` at the end, or
//! `err ERRNO_NAME POS STAGE` (STAGE: open, write, fsync or close) when a
//! call fails. Pieces are `--piece` bytes with an fsync every
//! `--fsync-every` pieces (0: only at the end) and `--sleep-ms` after each,
//! or, with `--random SEED`, 1 to 8192 bytes with an fsync after 30 % of
//! them and up to 4 ms between them.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::sys;

pub struct Pace {
    pub piece: usize,
    pub sleep_ms: u64,
    pub fsync_every: usize,
    pub random: Option<u64>,
}

/// xorshift64*: the same pieces for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Writer<'a> {
    src: &'a [u8],
    side: File,
    pos: usize,
    stage: &'static str,
}

impl Writer<'_> {
    fn synced(&mut self, f: &File) -> io::Result<()> {
        self.stage = "fsync";
        f.sync_all()?;
        writeln!(self.side, "{}", self.pos)
    }

    fn write(&mut self, f: &mut File, len: usize) -> io::Result<()> {
        self.stage = "write";
        let end = (self.pos + len).min(self.src.len());
        self.pos += f.write(&self.src[self.pos..end])?;
        Ok(())
    }

    fn run(&mut self, dst: &Path, pace: &Pace) -> io::Result<()> {
        let mut f = sys::open(dst, libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND)?;
        self.pos = f.metadata()?.len() as usize;
        println!("started {}", self.pos);
        io::stdout().flush()?;
        let mut rng = pace.random.map(|s| Rng(s | 1));
        let mut n = 0;
        while self.pos < self.src.len() {
            match &mut rng {
                Some(r) => {
                    self.write(&mut f, 1 + (r.next() % 8192) as usize)?;
                    if r.unit() < 0.3 {
                        self.synced(&f)?;
                    }
                    std::thread::sleep(Duration::from_secs_f64(r.unit() * 0.004));
                }
                None => {
                    self.write(&mut f, pace.piece)?;
                    n += 1;
                    if pace.fsync_every > 0 && n % pace.fsync_every == 0 {
                        self.synced(&f)?;
                    }
                    if pace.sleep_ms > 0 {
                        std::thread::sleep(Duration::from_millis(pace.sleep_ms));
                    }
                }
            }
        }
        self.synced(&f)?;
        self.stage = "close";
        sys::close(f)
    }
}

pub fn run(src: &Path, dst: &Path, side: &Path, pace: &Pace) -> ExitCode {
    let opened = std::fs::read(src).and_then(|s| {
        let side = OpenOptions::new().create(true).append(true).open(side)?;
        Ok((s, side))
    });
    let (src, side) = match opened {
        Ok(v) => v,
        Err(e) => {
            eprintln!("testkit append: {}: {e}", src.display());
            return ExitCode::from(2);
        }
    };
    let mut w = Writer {
        src: &src,
        side,
        pos: 0,
        stage: "open",
    };
    match w.run(dst, pace) {
        Ok(()) => println!("ok {}", w.pos),
        Err(e) => println!("err {} {} {}", sys::errno_name(&e), w.pos, w.stage),
    }
    ExitCode::SUCCESS
}
