//! `testkit agent`: one process standing for one program of a test (a
//! writer holding a file, a reader, a stopped or killed holder), driven
//! line by line. It first says `ready PID`; then each command line gets
//! one answer line: `ok [VALUE]`, or `err ERRNO_NAME MS` with the errno
//! of the failed call and the milliseconds the command took. Paths are
//! relative to the working directory the test gave.
//!
//! ```text
//! open PATH FLAGS      r w x(=O_RDWR) a c t n(=O_NONBLOCK) e(=O_EXCL)  ok MS
//!                      (the new descriptor becomes the current one; one it
//!                      replaces stays open, as in a program that opens again)
//! write TEXT           one write(2) of TEXT and a newline           ok BYTES
//! put TEXT             one write(2) of TEXT, no newline             ok BYTES
//! pwrite OFF TEXT      one pwrite(2) of TEXT at OFF                 ok BYTES
//! rep N TEXT           N times TEXT and a newline, all of it        ok
//! fill N CHAR          N bytes of CHAR in writes of 64 KiB at most  ok
//! burst N CHAR         one write(2) of N bytes of CHAR              ok BYTES MS
//! write-from SRC OFF LEN|-   bytes OFF.. of the file SRC, all of them  ok BYTES
//! seek OFF             lseek(2) from the start                      ok POS
//! ftruncate LEN | fsync | close                                      ok [MS]
//! futimes SECS         futimens(2): both times SECS                 ok
//! utime PATH SECS      utimensat(2) by path                         ok
//! client-renewal | renew | epoch | ioctl REQUEST    the lease ioctls ok [EPOCH]
//! renew-valid          renew; how long no one else can have it      ok MS
//! setxattr PATH NAME HEX | removexattr PATH NAME                     ok
//! copy SRC DST MODE    a new file DST (octal MODE) with SRC's bytes  ok BYTES
//! spawn PATH ARG...    starts a program (no descriptor of ours)      ok PID
//! running PID | kill PID    of a program it spawned (kill reaps it)  ok yes|no / ok
//! exit                                                               ok
//! ```
//!
//! SIGINT interrupts the command under way, which then fails with `EINTR`
//! (with `--sigint-default` it ends the process instead).

use std::fs::{File, FileTimes};
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::sys;

/// What one command answers after `ok`.
type Answer = io::Result<String>;

struct Agent {
    fd: Option<File>,
    /// Descriptors an `open` replaced: still open, as the program's.
    older: Vec<File>,
    children: Vec<Child>,
}

pub fn run(sigint_default: bool) -> ExitCode {
    if sigint_default {
        sys::die_on_sigint();
    } else {
        sys::interrupt_on_sigint();
    }
    let mut out = io::stdout().lock();
    if say(&mut out, &format!("ready {}", std::process::id())).is_err() {
        return ExitCode::FAILURE;
    }
    let mut agent = Agent {
        fd: None,
        older: Vec::new(),
        children: Vec::new(),
    };
    // `lines()` reads again after an interrupted read: a SIGINT that
    // arrives between commands ends no command.
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (cmd, arg) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let t0 = Instant::now();
        let answer = match agent.command(cmd, arg, t0) {
            Some(Ok(v)) if v.is_empty() => "ok".to_string(),
            Some(Ok(v)) => format!("ok {v}"),
            Some(Err(e)) => format!("err {} {}", sys::errno_name(&e), ms(t0)),
            None => format!("err EINVAL unknown command {cmd}"),
        };
        if say(&mut out, &answer).is_err() || cmd == "exit" {
            break;
        }
    }
    for c in &mut agent.children {
        let _ = c.kill();
        let _ = c.wait();
    }
    ExitCode::SUCCESS
}

fn say(out: &mut impl Write, line: &str) -> io::Result<()> {
    writeln!(out, "{line}")?;
    out.flush()
}

fn ms(t0: Instant) -> u128 {
    t0.elapsed().as_millis()
}

/// The next whitespace-separated field, parsed.
fn field<T: std::str::FromStr>(it: &mut std::str::SplitWhitespace<'_>) -> io::Result<T> {
    it.next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(sys::einval)
}

/// `N REST`: a number, then the rest of the line as it is.
fn count_and_text(arg: &str) -> io::Result<(usize, &str)> {
    let (n, text) = arg.split_once(' ').unwrap_or((arg, ""));
    Ok((n.parse().map_err(|_| sys::einval())?, text))
}

fn flags(letters: &str) -> io::Result<libc::c_int> {
    letters.chars().try_fold(0, |f, c| {
        Ok(f | match c {
            'r' => libc::O_RDONLY,
            'w' => libc::O_WRONLY,
            'x' => libc::O_RDWR,
            'a' => libc::O_APPEND,
            'c' => libc::O_CREAT,
            't' => libc::O_TRUNC,
            'n' => libc::O_NONBLOCK,
            'e' => libc::O_EXCL,
            _ => return Err(sys::einval()),
        })
    })
}

fn hex(s: &str) -> io::Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return Err(sys::einval());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| sys::einval()))
        .collect()
}

fn number(s: &str) -> io::Result<u64> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| sys::einval())
}

/// One byte, given as itself.
fn one_char(s: &str) -> io::Result<u8> {
    match s.as_bytes() {
        [b] => Ok(*b),
        _ => Err(sys::einval()),
    }
}

impl Agent {
    fn fd(&mut self) -> io::Result<&mut File> {
        self.fd
            .as_mut()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    /// Runs one command; `None` for a command it does not know.
    fn command(&mut self, cmd: &str, arg: &str, t0: Instant) -> Option<Answer> {
        let mut it = arg.split_whitespace();
        Some(match cmd {
            "open" => self.open(arg).map(|()| ms(t0).to_string()),
            "write" => self.write_once(format!("{arg}\n").as_bytes()),
            "put" => self.write_once(arg.as_bytes()),
            "pwrite" => self.pwrite(arg),
            "rep" => self.rep(arg),
            "fill" => self.fill(&mut it),
            "burst" => self.burst(&mut it, t0),
            "write-from" => self.write_from(&mut it),
            "seek" => field(&mut it).and_then(|off| {
                let pos = self.fd()?.seek(SeekFrom::Start(off))?;
                Ok(pos.to_string())
            }),
            "ftruncate" => field(&mut it).and_then(|len| {
                self.fd()?.set_len(len)?;
                Ok(String::new())
            }),
            "fsync" => self
                .fd()
                .and_then(|f| f.sync_all())
                .map(|()| ms(t0).to_string()),
            "close" => self.close().map(|()| ms(t0).to_string()),
            "futimes" => field(&mut it).and_then(|secs: u64| {
                let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
                self.fd()?
                    .set_times(FileTimes::new().set_accessed(t).set_modified(t))?;
                Ok(String::new())
            }),
            "utime" => (|| -> Answer {
                let path: String = field(&mut it)?;
                sys::utime(Path::new(&path), field(&mut it)?)?;
                Ok(String::new())
            })(),
            "client-renewal" => self.ioctl(sys::IOC_CLIENT_RENEWAL),
            "renew" => self.ioctl(sys::IOC_RENEW),
            "ioctl" => number(arg).and_then(|r| self.ioctl(r)),
            "epoch" => self
                .fd()
                .and_then(|f| sys::ioctl_u64(f, sys::IOC_EPOCH))
                .map(|e| e.to_string()),
            "renew-valid" => self
                .fd()
                .and_then(|f| sys::ioctl_u64(f, sys::IOC_RENEW_VALID))
                .map(|ms| ms.to_string()),
            "setxattr" => (|| -> Answer {
                let (path, name): (String, String) = (field(&mut it)?, field(&mut it)?);
                let value = hex(it.next().unwrap_or(""))?;
                sys::setxattr(Path::new(&path), &name, &value)?;
                Ok(String::new())
            })(),
            "removexattr" => (|| -> Answer {
                let (path, name): (String, String) = (field(&mut it)?, field(&mut it)?);
                sys::removexattr(Path::new(&path), &name)?;
                Ok(String::new())
            })(),
            "copy" => copy(&mut it),
            "spawn" => self.spawn(&mut it),
            "running" => self.running(&mut it),
            "kill" => self.kill(&mut it),
            "exit" => Ok(String::new()),
            _ => return None,
        })
    }

    fn open(&mut self, arg: &str) -> io::Result<()> {
        let (path, letters) = arg.rsplit_once(' ').ok_or_else(sys::einval)?;
        let f = sys::open(Path::new(path), flags(letters)?)?;
        if let Some(old) = self.fd.replace(f) {
            self.older.push(old);
        }
        Ok(())
    }

    fn write_once(&mut self, data: &[u8]) -> Answer {
        Ok(self.fd()?.write(data)?.to_string())
    }

    fn pwrite(&mut self, arg: &str) -> Answer {
        let (off, text) = arg.split_once(' ').ok_or_else(sys::einval)?;
        let off = off.parse().map_err(|_| sys::einval())?;
        Ok(self.fd()?.write_at(text.as_bytes(), off)?.to_string())
    }

    fn rep(&mut self, arg: &str) -> Answer {
        let (n, text) = count_and_text(arg)?;
        self.fd()?
            .write_all(format!("{text}\n").repeat(n).as_bytes())?;
        Ok(String::new())
    }

    fn fill(&mut self, it: &mut std::str::SplitWhitespace<'_>) -> Answer {
        let n: usize = field(it)?;
        let chunk = vec![one_char(it.next().unwrap_or(""))?; 65536];
        let f = self.fd()?;
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len());
            f.write_all(&chunk[..k])?;
            left -= k;
        }
        Ok(String::new())
    }

    fn burst(&mut self, it: &mut std::str::SplitWhitespace<'_>, t0: Instant) -> Answer {
        let n: usize = field(it)?;
        let data = vec![one_char(it.next().unwrap_or(""))?; n];
        let wrote = self.fd()?.write(&data)?;
        Ok(format!("{wrote} {}", ms(t0)))
    }

    fn write_from(&mut self, it: &mut std::str::SplitWhitespace<'_>) -> Answer {
        let src: String = field(it)?;
        let off: u64 = field(it)?;
        let len = it.next().ok_or_else(sys::einval)?;
        let mut f = File::open(&src)?;
        f.seek(SeekFrom::Start(off))?;
        let mut data = Vec::new();
        match len {
            "-" => f.read_to_end(&mut data)?,
            n => f
                .take(n.parse().map_err(|_| sys::einval())?)
                .read_to_end(&mut data)?,
        };
        self.fd()?.write_all(&data)?;
        Ok(data.len().to_string())
    }

    fn close(&mut self) -> io::Result<()> {
        let f = self
            .fd
            .take()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        sys::close(f)
    }

    fn ioctl(&mut self, request: u64) -> Answer {
        sys::ioctl(self.fd()?, request)?;
        Ok(String::new())
    }

    fn spawn(&mut self, it: &mut std::str::SplitWhitespace<'_>) -> Answer {
        let path = it.next().ok_or_else(sys::einval)?;
        let child = Command::new(path)
            .args(it)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid.to_string())
    }

    fn child(&mut self, it: &mut std::str::SplitWhitespace<'_>) -> io::Result<usize> {
        let pid: u32 = field(it)?;
        self.children
            .iter()
            .position(|c| c.id() == pid)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ECHILD))
    }

    fn running(&mut self, it: &mut std::str::SplitWhitespace<'_>) -> Answer {
        let i = self.child(it)?;
        let alive = self.children[i].try_wait()?.is_none();
        Ok(if alive { "yes" } else { "no" }.to_string())
    }

    fn kill(&mut self, it: &mut std::str::SplitWhitespace<'_>) -> Answer {
        let i = self.child(it)?;
        let mut c = self.children.swap_remove(i);
        let killed = c.kill();
        c.wait()?;
        killed?;
        Ok(String::new())
    }
}

/// `copy SRC DST MODE`: DST created (or emptied) with MODE, SRC's bytes
/// copied in, closed, its close checked.
fn copy(it: &mut std::str::SplitWhitespace<'_>) -> Answer {
    let (src, dst, mode): (String, String, String) = (field(it)?, field(it)?, field(it)?);
    let mode = u32::from_str_radix(&mode, 8).map_err(|_| sys::einval())?;
    let mut from = File::open(&src)?;
    let mut to = sys::open_mode(
        Path::new(&dst),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        mode,
    )?;
    let n = io::copy(&mut from, &mut to)?;
    sys::close(to)?;
    Ok(n.to_string())
}
