//! The system calls the subcommands need that `std` does not offer as such
//! (open with exactly the flags asked for, the lease ioctls, xattrs, times
//! by path, CLOCK_MONOTONIC, SIGINT's disposition), and errno names as
//! `errno.h` spells them, which is what the tests compare.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The lease ioctls of a leasefs descriptor (docs/SEMANTICS.md "Leases").
pub const IOC_CLIENT_RENEWAL: u64 = 0x4C01;
pub const IOC_RENEW: u64 = 0x4C02;
pub const IOC_EPOCH: u64 = 0x8008_4C03;
pub const IOC_RENEW_VALID: u64 = 0x8008_4C04;

/// `EBUSY`, `EINTR`, ...: the name of an error's errno, its number when
/// the name is unknown, and the error kind for errors of no system call.
pub fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => match nix::errno::Errno::from_raw(n) {
            nix::errno::Errno::UnknownErrno => n.to_string(),
            name => format!("{name:?}"),
        },
        None => format!("{:?}", e.kind()),
    }
}

/// An `EINVAL` for input this program cannot use (a bad command line).
pub fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn cstr(p: &[u8]) -> io::Result<CString> {
    CString::new(p).map_err(|_| einval())
}

fn cpath(p: &Path) -> io::Result<CString> {
    cstr(p.as_os_str().as_bytes())
}

/// A negative return of a system call as the error it set.
fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// open(2) with these flags (plus `O_CLOEXEC`) and mode 0644, as given:
/// no flag is added or refused (`O_RDONLY | O_TRUNC` reaches the kernel).
pub fn open(path: &Path, flags: libc::c_int) -> io::Result<File> {
    open_mode(path, flags, 0o644)
}

/// [`open`] with the mode a created file gets.
pub fn open_mode(path: &Path, flags: libc::c_int, mode: u32) -> io::Result<File> {
    let c = cpath(path)?;
    // SAFETY: a NUL-terminated path that lives across the call; the
    // descriptor returned is owned by the File from here on.
    let fd =
        check(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    // SAFETY: `fd` is a descriptor this call just opened and nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// close(2) itself, so that its error is seen (dropping a File hides it,
/// and on leasefs `close` is where a failed flush or commit shows). The
/// descriptor is gone either way.
pub fn close(f: File) -> io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: the descriptor `into_raw_fd` just released; closed once.
    check(unsafe { libc::close(fd) }).map(drop)
}

/// An ioctl without argument (the lease renewal requests).
pub fn ioctl(f: &File, request: u64) -> io::Result<()> {
    // SAFETY: these requests take no argument; the 0 is never dereferenced.
    check(unsafe { libc::ioctl(f.as_raw_fd(), request as libc::c_ulong, 0) }).map(drop)
}

/// An ioctl that reads a u64 (`IOC_EPOCH`, `IOC_RENEW_VALID`).
pub fn ioctl_u64(f: &File, request: u64) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the request writes 8 bytes, the size of `v`, which outlives the call.
    check(unsafe { libc::ioctl(f.as_raw_fd(), request as libc::c_ulong, &mut v as *mut u64) })?;
    Ok(v)
}

pub fn setxattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let (p, n) = (cpath(path)?, cstr(name.as_bytes())?);
    // SAFETY: path and name are NUL-terminated, value is `value.len()`
    // readable bytes; all live across the call.
    check(unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

pub fn removexattr(path: &Path, name: &str) -> io::Result<()> {
    let (p, n) = (cpath(path)?, cstr(name.as_bytes())?);
    // SAFETY: both strings are NUL-terminated and live across the call.
    check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
}

/// utimensat(2) by path: access and modification time `secs`.
pub fn utime(path: &Path, secs: i64) -> io::Result<()> {
    let p = cpath(path)?;
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: a NUL-terminated path and two timespecs, alive across the call.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) }).map(drop)
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the
/// machine, so that the tests can order what several processes did.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// [`monotonic_ns`] in seconds.
pub fn monotonic_secs() -> f64 {
    monotonic_ns() as f64 / 1e9
}

extern "C" fn on_sigint(_: libc::c_int) {}

/// SIGINT interrupts a blocked system call (it fails with `EINTR`, as
/// Ctrl-C does to a program with a handler) instead of ending the process.
pub fn interrupt_on_sigint() {
    // SAFETY: a handler that does nothing (async-signal-safe), installed
    // without SA_RESTART so that the interrupted call returns EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// SIGINT ends the process (its default action), however it was started.
pub fn die_on_sigint() {
    // SAFETY: restores the default disposition of one signal.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
}
