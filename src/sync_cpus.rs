//! A small file's fsync runs on the CPUs that take the disk's completion
//! interrupts.
//!
//! Why: a thread that waits in `fdatasync` sleeps until the disk's
//! completion interrupt wakes it. When that interrupt lands on another
//! CPU, the wake-up crosses CPUs; on a virtual machine whose idle vCPUs
//! halt in the host (the usual `haltpoll` setting) that costs a round trip
//! through the host, tens of microseconds a sync. A device with fewer
//! queues than CPUs (a virtio disk with one queue) takes every completion
//! on the CPU its interrupt is routed to, so a sync made from that CPU is
//! woken where the interrupt arrives. Measured here (benches/PROFILE.md,
//! "thirteenth look"): the same `fdatasync` loop 167 µs p50 from the
//! interrupt's CPU, 236 from the other; durable small files by four
//! writers 10–15% faster with 17–22% less daemon CPU a file, by one writer
//! 1–14% faster.
//!
//! So the stream's worker, for the one-step fsync of a small file (its
//! commit and the WAL's sync, `DataStreamer::sync_whole`), is moved to
//! the CPUs that took the metadata store's device's completion interrupts
//! ([`run`]), and put back after. Nothing else changes: the same calls,
//! the same errors, the same order. Other syncs stay where they are: an
//! append's fsync moved the same way measured no better. Devices with a
//! queue per CPU (NVMe), devices without interrupts of their own (loop,
//! device mapper, tmpfs, FUSE) and routings that cover every CPU the
//! daemon may use leave the thread where it is. The routing is read again
//! every [`REFRESH`] (an operator or `irqbalance` may move the interrupt).
//! `-o sync_cpus=LIST` names the CPUs instead (a disk behind device mapper
//! has no interrupts of its own to read), `-o sync_cpus=off` turns it off.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// How long a routing read from `/proc` is trusted.
pub const REFRESH: Duration = Duration::from_secs(10);

/// Fewer interrupts than this in all, and the device has not shown where
/// its completions land.
const ENOUGH: u64 = 100;

/// An interrupt counts toward the device's routing when it took at least
/// this share of the device's interrupts: a configuration interrupt that
/// fired once is not where completions land.
const SIGNIFICANT_PERMILLE: u64 = 10;

static MOVED: AtomicU64 = AtomicU64::new(0);
static TARGET: Mutex<Option<Target>> = Mutex::new(None);

/// The device whose interrupts decide, and what was last read of them.
struct Target {
    /// `None`: CPUs named by the operator, never read again.
    dir: Option<PathBuf>,
    cpus: Option<CpuSet>,
    read_at: Instant,
}

/// Where a small file's fsync is made (`-o sync_cpus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// From the CPUs the data directory's disk's interrupts are routed to.
    Auto,
    /// From these CPUs.
    Cpus(Vec<usize>),
    /// Wherever the worker is.
    Off,
}

impl Placement {
    /// `auto`, `off`, or a CPU list as the kernel writes them (`0-3,6`),
    /// every CPU one this process may run on.
    pub fn parse(s: &str) -> Result<Placement, String> {
        match s {
            "auto" => Ok(Placement::Auto),
            "off" => Ok(Placement::Off),
            _ => {
                let cpus = parse_cpu_list(s)
                    .filter(|c| !c.is_empty())
                    .ok_or("expected auto, off or a list of CPUs such as 1 or 0-3,6")?;
                let allowed = allowed_cpus();
                match cpus.iter().find(|c| !allowed.contains(c)) {
                    Some(c) => Err(format!("CPU {c} is not one this process may run on")),
                    None => Ok(Placement::Cpus(cpus)),
                }
            }
        }
    }
}

/// Sets where a small file's fsync is made; `dir`: the metadata store's
/// directory, whose disk `Auto` reads the routing of.
pub fn configure(placement: &Placement, dir: &Path) {
    let (dir, cpus) = match placement {
        Placement::Off => {
            *lock(&TARGET) = None;
            return;
        }
        Placement::Auto => (Some(dir.to_path_buf()), routing_of(dir)),
        Placement::Cpus(c) => (None, Some(c.clone())),
    };
    *lock(&TARGET) = Some(Target {
        dir,
        cpus: cpus.map(|c| cpu_set(&c)),
        read_at: Instant::now(),
    });
}

/// For a thread pool's `on_thread_start`: a new thread inherits the
/// CPUs of the thread that made it, and a pool grows from whichever of
/// its threads asks for one, possibly in the middle of [`run`]; without
/// this the new thread would stay on the sync's CPUs for good. Takes the
/// CPUs of the calling thread (the daemon's, before anything moved it).
pub fn unpinned_start() -> impl Fn() + Send + Sync + 'static {
    let all = sched_getaffinity(Pid::from_raw(0)).ok();
    move || {
        if let Some(set) = &all {
            let _ = sched_setaffinity(Pid::from_raw(0), set);
        }
    }
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    sched_getaffinity(Pid::from_raw(0)).map_or_else(
        |_| Vec::new(),
        |set| {
            (0..CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .collect()
        },
    )
}

fn cpu_set(cpus: &[usize]) -> CpuSet {
    let mut set = CpuSet::new();
    for &c in cpus {
        let _ = set.set(c);
    }
    set
}

/// Syncs [`run`] moved to the interrupt's CPUs (`leasefs stats`:
/// `syncs_on_completion_cpus`).
pub fn moved() -> u64 {
    MOVED.load(Ordering::Relaxed)
}

/// The CPUs a sync should run on now, if not wherever it is.
fn target_cpus() -> Option<CpuSet> {
    let mut t = lock(&TARGET);
    let t = t.as_mut()?;
    if let Some(dir) = &t.dir
        && t.read_at.elapsed() >= REFRESH
    {
        t.cpus = routing_of(dir).map(|c| cpu_set(&c));
        t.read_at = Instant::now();
    }
    t.cpus
}

/// Runs `f` (a commit and its sync) on the CPUs that take the
/// store device's completions, then puts the thread back where it was
/// allowed to run (a FUSE ring's thread back on its own CPU). A thread
/// already confined to those CPUs runs `f` where it is. A failure to move
/// changes nothing but the place.
pub fn run<T>(f: impl FnOnce() -> T) -> T {
    let Some(set) = target_cpus() else {
        return f();
    };
    let me = Pid::from_raw(0);
    let Ok(old) = sched_getaffinity(me) else {
        return f();
    };
    // Already there: a sync within a sync, or a thread of that CPU.
    if old == set || sched_setaffinity(me, &set).is_err() {
        return f();
    }
    MOVED.fetch_add(1, Ordering::Relaxed);
    // Put back even if `f` panics (the stream's worker survives a panic).
    struct Back(CpuSet);
    impl Drop for Back {
        fn drop(&mut self) {
            if let Err(e) = sched_setaffinity(Pid::from_raw(0), &self.0) {
                tracing::warn!("cannot put a thread back on its CPUs after a sync: {e}");
            }
        }
    }
    let _back = Back(old);
    f()
}

/// The CPUs that took `dir`'s device's completion interrupts, when they
/// are fewer than the CPUs this process may run on: where [`run`] moves a
/// sync of what `dir` holds (public for the tests that check it ran).
pub fn routing_of(dir: &Path) -> Option<Vec<usize>> {
    let dev = std::fs::metadata(dir).ok()?.dev();
    let allowed = allowed_cpus();
    let major = u32::try_from(nix::sys::stat::major(dev)).ok()?;
    let minor = u32::try_from(nix::sys::stat::minor(dev)).ok()?;
    completion_cpus(
        Path::new("/sys"),
        Path::new("/proc"),
        major,
        minor,
        &allowed,
    )
}

/// Where the block device `major:minor` takes its completions, read from
/// `sys` and `proc` (roots given so that tests can build them): the
/// interrupts of the PCI function above the device (its `msi_irqs`), those
/// that fired at least [`SIGNIFICANT_PERMILLE`] of the device's
/// interrupts, and the CPUs each is routed to now
/// (`/proc/irq/N/effective_affinity_list`), within `allowed`. `None` when
/// any of it is missing, or when it covers every allowed CPU.
pub(crate) fn completion_cpus(
    sys: &Path,
    proc_: &Path,
    major: u32,
    minor: u32,
    allowed: &[usize],
) -> Option<Vec<usize>> {
    let mut block = std::fs::canonicalize(sys.join(format!("dev/block/{major}:{minor}"))).ok()?;
    if block.join("partition").exists() {
        block.pop();
    }
    let devices = std::fs::canonicalize(sys.join("devices")).ok()?;
    let irqs: Vec<u32> = block
        .ancestors()
        .take_while(|a| a.starts_with(&devices))
        .find_map(|a| std::fs::read_dir(a.join("msi_irqs")).ok())?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let counts = interrupt_counts(
        &std::fs::read_to_string(proc_.join("interrupts")).ok()?,
        &irqs,
    );
    let all: u64 = counts.iter().map(|(_, n)| n).sum();
    if all < ENOUGH {
        return None;
    }
    let mut cpus = Vec::new();
    for (irq, n) in counts {
        if n * 1000 < all * SIGNIFICANT_PERMILLE {
            continue;
        }
        let list =
            std::fs::read_to_string(proc_.join(format!("irq/{irq}/effective_affinity_list")))
                .ok()?;
        cpus.extend(parse_cpu_list(list.trim())?);
    }
    cpus.retain(|c| allowed.contains(c));
    cpus.sort_unstable();
    cpus.dedup();
    (!cpus.is_empty() && cpus.len() < allowed.len()).then_some(cpus)
}

/// The interrupts `irqs` with their counts summed over the CPUs, from the
/// text of `/proc/interrupts`.
fn interrupt_counts(text: &str, irqs: &[u32]) -> Vec<(u32, u64)> {
    let mut lines = text.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|l| {
            let (irq, rest) = l.trim_start().split_once(':')?;
            let irq: u32 = irq.parse().ok()?;
            irqs.contains(&irq).then(|| {
                let n = rest
                    .split_whitespace()
                    .take(cpus)
                    .map_while(|f| f.parse::<u64>().ok())
                    .sum();
                (irq, n)
            })
        })
        .collect()
}

/// `0-3,5` → [0, 1, 2, 3, 5]; `None` for anything else.
fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > CpuSet::count() {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// Sets the target directly (no device behind it); `None` turns
/// placement off. Callers take turns through [`tests::SERIAL`].
#[cfg(test)]
pub(crate) fn set_for_test(cpus: Option<Vec<usize>>) {
    *lock(&TARGET) = cpus.map(|cpus| Target {
        dir: None,
        cpus: Some(cpu_set(&cpus)),
        read_at: Instant::now(),
    });
}

#[cfg(test)]
pub(crate) mod tests;
