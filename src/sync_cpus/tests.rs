use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;

/// The tests that set the process's one target take turns.
pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

/// A `/sys` and `/proc` as this machine has them: one virtio disk (254:0,
/// partition 254:1) whose PCI function has a configuration interrupt (35,
/// fired once, routed to CPU 0) and one queue's (36, routed to CPU 1); an
/// NVMe-like disk (259:0) with a queue interrupt per CPU; a loop device
/// (7:0) with no interrupts of its own.
fn machine(root: &Path, queue_counts: &str) {
    let pci = root.join("sys/devices/pci0000:00/0000:00:02.0");
    let vda = pci.join("virtio1/block/vda");
    std::fs::create_dir_all(vda.join("vda1")).unwrap();
    std::fs::write(vda.join("vda1/partition"), "1\n").unwrap();
    for irq in ["35", "36"] {
        std::fs::create_dir_all(pci.join("msi_irqs")).unwrap();
        std::fs::write(pci.join("msi_irqs").join(irq), "msix\n").unwrap();
    }
    let nvme = root.join("sys/devices/pci0000:00/0000:00:04.0");
    std::fs::create_dir_all(nvme.join("nvme/nvme0/nvme0n1")).unwrap();
    std::fs::create_dir_all(nvme.join("msi_irqs")).unwrap();
    for irq in ["40", "41"] {
        std::fs::write(nvme.join("msi_irqs").join(irq), "msix\n").unwrap();
    }
    let lo = root.join("sys/devices/virtual/block/loop0");
    std::fs::create_dir_all(&lo).unwrap();
    std::fs::create_dir_all(root.join("sys/dev/block")).unwrap();
    for (dev, to) in [
        ("254:0", vda.clone()),
        ("254:1", vda.join("vda1")),
        ("259:0", nvme.join("nvme/nvme0/nvme0n1")),
        ("7:0", lo),
    ] {
        symlink(to, root.join("sys/dev/block").join(dev)).unwrap();
    }
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::write(
        root.join("proc/interrupts"),
        format!(
            "           CPU0       CPU1       \n \
             28:          0          0 PCI-MSIX-0000:00:01.0   0-edge      virtio0-config\n \
             35:          0          1 PCI-MSIX-0000:00:02.0   0-edge      virtio1-config\n \
             36:   {queue_counts} PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n \
             40:       5000          0 PCI-MSIX-0000:00:04.0   0-edge      nvme0q1\n \
             41:          0       4000 PCI-MSIX-0000:00:04.0   1-edge      nvme0q2\n\
             NMI:          0          0   Non-maskable interrupts\n"
        ),
    )
    .unwrap();
    for (irq, cpus) in [("35", "0"), ("36", "1"), ("40", "0"), ("41", "1")] {
        let d = root.join("proc/irq").join(irq);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("effective_affinity_list"), format!("{cpus}\n")).unwrap();
    }
}

fn cpus_of(root: &Path, major: u32, minor: u32, allowed: &[usize]) -> Option<Vec<usize>> {
    completion_cpus(&root.join("sys"), &root.join("proc"), major, minor, allowed)
}

#[test]
fn a_one_queue_disk_completes_on_the_cpu_its_queue_interrupt_is_routed_to() {
    let t = tempfile::tempdir().unwrap();
    machine(t.path(), "0   16962082");
    // The disk and its partition alike; the configuration interrupt, fired
    // once, does not count.
    assert_eq!(cpus_of(t.path(), 254, 0, &[0, 1]), Some(vec![1]));
    assert_eq!(cpus_of(t.path(), 254, 1, &[0, 1]), Some(vec![1]));
    // Routed to the only CPU the daemon may use: nothing to gain.
    assert_eq!(cpus_of(t.path(), 254, 1, &[1]), None);
    // Routed outside what the daemon may use: nowhere to go.
    assert_eq!(cpus_of(t.path(), 254, 1, &[0, 2]), None);
}

#[test]
fn devices_with_a_queue_per_cpu_or_no_interrupts_leave_syncs_where_they_are() {
    let t = tempfile::tempdir().unwrap();
    machine(t.path(), "0   16962082");
    assert_eq!(cpus_of(t.path(), 259, 0, &[0, 1]), None, "NVMe-like");
    assert_eq!(cpus_of(t.path(), 7, 0, &[0, 1]), None, "loop");
    assert_eq!(cpus_of(t.path(), 8, 0, &[0, 1]), None, "unknown device");
    let quiet = tempfile::tempdir().unwrap();
    machine(quiet.path(), "0   0");
    assert_eq!(
        cpus_of(quiet.path(), 254, 0, &[0, 1]),
        None,
        "only the configuration interrupt fired: nothing to go by yet"
    );
}

#[test]
fn cpu_lists_parse_as_the_kernel_writes_them() {
    assert_eq!(parse_cpu_list("1"), Some(vec![1]));
    assert_eq!(parse_cpu_list("0-3,5"), Some(vec![0, 1, 2, 3, 5]));
    assert_eq!(parse_cpu_list("3-1"), None);
    assert_eq!(parse_cpu_list("x"), None);
    let text = "  CPU0 CPU1\n 36:  7  9  PCI-MSIX  1-edge  q\n 37: 1 1 x\n";
    assert_eq!(interrupt_counts(text, &[36]), vec![(36, 16)]);
}

#[test]
fn a_sync_runs_on_the_target_cpus_and_the_thread_goes_back_after() {
    let _turn = lock(&SERIAL);
    let me = Pid::from_raw(0);
    let before = sched_getaffinity(me).unwrap();
    let allowed: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| before.is_set(c).unwrap_or(false))
        .collect();
    if allowed.len() < 2 {
        eprintln!("one CPU: nothing to move to");
        return;
    }
    let target = allowed[allowed.len() - 1];
    set_for_test(Some(vec![target]));
    let before_moves = moved();
    let inside = run(|| sched_getaffinity(me).unwrap());
    let nested = run(|| run(|| sched_getaffinity(me).unwrap()));
    set_for_test(None);
    let after = sched_getaffinity(me).unwrap();
    let on = |s: &CpuSet| -> Vec<usize> {
        (0..CpuSet::count())
            .filter(|&c| s.is_set(c).unwrap_or(false))
            .collect()
    };
    assert_eq!(on(&inside), vec![target]);
    assert_eq!(on(&nested), vec![target], "a nested sync stays put");
    assert_eq!(on(&after), allowed, "put back");
    assert!(moved() >= before_moves + 2, "counted");
}

#[test]
fn a_pool_thread_made_during_a_sync_starts_on_every_cpu() {
    let _turn = lock(&SERIAL);
    let me = Pid::from_raw(0);
    let allowed = allowed_cpus();
    if allowed.len() < 2 {
        eprintln!("one CPU: nothing to move to");
        return;
    }
    let on = |s: &CpuSet| -> Vec<usize> {
        (0..CpuSet::count())
            .filter(|&c| s.is_set(c).unwrap_or(false))
            .collect()
    };
    let target = allowed[allowed.len() - 1];
    // The pool's threads are made on demand, by the thread that asks: here
    // one in the middle of a sync, on the sync's CPU.
    let with = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .on_thread_start(unpinned_start())
        .build()
        .unwrap();
    set_for_test(Some(vec![target]));
    let (fresh, inherited) = run(|| {
        let get = move || on(&sched_getaffinity(me).unwrap());
        let fresh = with.block_on(with.spawn_blocking(get)).unwrap();
        // Which thread makes a pool's thread is the pool's business; a
        // thread made here always inherits.
        let inherited = std::thread::spawn(get).join().unwrap();
        (fresh, inherited)
    });
    set_for_test(None);
    assert_eq!(inherited, vec![target], "what the hook is for");
    assert_eq!(fresh, allowed, "a new pool thread on every CPU");
}
