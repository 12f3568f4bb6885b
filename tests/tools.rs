//! Ordinary Unix tools against a real mount (docs/SEMANTICS.md "Files and directories"): what a
//! user does first with any filesystem must simply work, and leave the
//! same bytes, names, links and attributes a local filesystem would.

mod common;
use common::*;

/// A scratch directory outside the mount (in the fixture's temp dir).
fn scratch(m: &Mount, name: &str) -> String {
    let p = m.dir.path().join(name);
    std::fs::create_dir_all(&p).unwrap();
    p.display().to_string()
}

#[test]
fn cp_r_of_a_real_tree_reads_back_identical() {
    let m = Mount::new();
    m.sh_ok("cp -r /usr/include/linux tree && diff -r /usr/include/linux tree");
    // And the copy survives a remount (nothing served from caches only).
    let mut m = m;
    m.unmount();
    m.mount();
    m.sh_ok("diff -r /usr/include/linux tree");
}

#[test]
fn cat_reads_back_what_was_written() {
    let m = Mount::new();
    m.sh_ok("printf 'line one\\nline two\\n' > f");
    assert_eq!(m.sh_ok("cat f"), "line one\nline two\n");
    assert_eq!(
        m.sh_ok("cat f f"),
        "line one\nline two\nline one\nline two\n"
    );
}

#[test]
fn dd_of_20_mib_random_data_compares_equal() {
    let m = Mount::new();
    let s = scratch(&m, "src");
    m.sh_ok(&format!(
        "dd if=/dev/urandom of={s}/r bs=1M count=20 status=none && \
         dd if={s}/r of=r bs=1M status=none && cmp r {s}/r && \
         dd if=/dev/urandom bs=1M count=20 status=none | tee {s}/r2 | dd of=r2 bs=1M iflag=fullblock status=none && \
         cmp r2 {s}/r2"
    ));
    assert_eq!(m.sh_ok("stat -c %s r r2"), "20971520\n20971520\n");
}

#[test]
fn tee_writes_what_it_reads() {
    let m = Mount::new();
    let out = m.sh_ok("seq 1 5000 | tee t1 t2 | md5sum; md5sum < t1; md5sum < t2");
    let l: Vec<&str> = out.lines().collect();
    assert_eq!(l.len(), 3, "{out}");
    assert!(l[0] == l[1] && l[1] == l[2], "{out}");
    m.sh_ok("seq 1 5000 | cmp - t1");
}

#[test]
fn echo_append_several_times_accumulates_in_order() {
    let m = Mount::new();
    m.sh_ok("for i in $(seq 1 20); do echo line$i >> f; done");
    let want: String = (1..=20).map(|i| format!("line{i}\n")).collect();
    assert_eq!(m.sh_ok("cat f"), want);
}

#[test]
fn tar_pipe_copies_a_tree_identically() {
    let m = Mount::new();
    m.sh_ok("mkdir dst && tar cf - -C /usr/share/doc bash | tar xf - -C dst && diff -r /usr/share/doc/bash dst/bash");
}

#[test]
fn tar_x_of_an_archive_extracts_identical_files() {
    let m = Mount::new();
    let s = scratch(&m, "arch");
    m.sh_ok(&format!("tar cf {s}/a.tar -C /usr/share/doc bash && tar xf {s}/a.tar && diff -r /usr/share/doc/bash bash"));
}

/// GNU tar sets each file's mtime through its still-open descriptor
/// (futimens) before closing it; `tar d` then compares sizes, modes and
/// modification times with the archive.
#[test]
fn tar_x_preserves_modification_times() {
    let m = Mount::new();
    let s = scratch(&m, "arch");
    m.sh_ok(&format!(
        "tar cf {s}/a.tar -C /usr/share/doc bash && tar xf {s}/a.tar"
    ));
    let o = m.sh(&format!("tar df {s}/a.tar"));
    assert!(
        o.status.success(),
        "tar d finds differences after tar x:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn rsync_a_into_the_mount_copies_a_tree_identically() {
    let m = Mount::new();
    m.sh_ok("rsync -a /usr/include/linux/ r/ && diff -r /usr/include/linux r");
}

/// rsync -a keeps modification times, so a second run has nothing to do.
#[test]
fn rsync_a_preserves_mtimes_so_a_second_run_transfers_nothing() {
    let m = Mount::new();
    m.sh_ok("rsync -a /usr/share/doc/bash/ r/");
    let again = m.sh_ok("rsync -ai /usr/share/doc/bash/ r/");
    assert!(
        again.trim().is_empty(),
        "second rsync -a transferred again:\n{again}"
    );
}

#[test]
fn mv_within_and_across_directories_replaces_existing_files() {
    let m = Mount::new();
    m.sh_ok("mkdir a b && echo one > a/x && echo two > a/y && echo three > b/z");
    // Within a directory, replacing an existing name.
    m.sh_ok("mv a/x a/y");
    assert_eq!(m.sh_ok("ls a"), "y\n");
    assert_eq!(m.sh_ok("cat a/y"), "one\n");
    // Across directories, replacing an existing name.
    m.sh_ok("mv a/y b/z");
    assert_eq!(m.sh_ok("ls a; echo --; ls b"), "--\nz\n");
    assert_eq!(m.sh_ok("cat b/z"), "one\n");
    // A directory into another one.
    m.sh_ok("mv b a/");
    assert_eq!(m.sh_ok("cat a/b/z"), "one\n");
    // Survives a remount.
    let mut m = m;
    m.unmount();
    m.mount();
    assert_eq!(m.sh_ok("find . | sort"), ".\n./a\n./a/b\n./a/b/z\n");
    assert_eq!(m.sh_ok("cat a/b/z"), "one\n");
}

fn replica_count(m: &Mount) -> usize {
    m.datanodes
        .iter()
        .map(|d| {
            ["finalized", "rbw"]
                .iter()
                .filter_map(|s| std::fs::read_dir(d.join(s)).ok())
                .flatten()
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().ends_with(".meta"))
                .count()
        })
        .sum()
}

#[test]
fn rm_r_removes_the_tree_and_its_replicas() {
    let m = Mount::new();
    m.sh_ok("mkdir -p t/a/b && for i in 1 2 3; do echo $i > t/a/b/f$i; seq 1 $i > t/a/g$i; done");
    // Small files closed: their replicas are held in memory until the
    // block journal's checkpoint writes them (docs/SEMANTICS.md).
    assert!(
        wait_until(std::time::Duration::from_secs(5), || replica_count(&m)
            >= 6 * 3),
        "each file has a replica on each datanode"
    );
    m.sh_ok("rm -r t");
    assert_eq!(m.sh_ok("ls -A"), "");
    assert!(
        wait_until(std::time::Duration::from_secs(5), || replica_count(&m) == 0),
        "replicas left behind after rm -r: {}",
        replica_count(&m)
    );
}

#[test]
fn ls_l_and_stat_report_sizes() {
    let m = Mount::new();
    m.sh_ok("head -c 12345 /dev/urandom > f; : > empty; head -c 70000 /dev/zero > g");
    assert_eq!(
        m.sh_ok("stat -c '%n %s' f empty g"),
        "f 12345\nempty 0\ng 70000\n"
    );
    let ls = m.sh_ok("ls -l f empty g");
    let sizes: Vec<&str> = ls
        .lines()
        .map(|l| l.split_whitespace().nth(4).unwrap())
        .collect();
    assert_eq!(sizes, ["0", "12345", "70000"], "{ls}"); // ls sorts: empty f g
    assert_eq!(m.sh_ok("wc -c < f"), "12345\n");
}

#[test]
fn user_xattr_set_then_get() {
    let m = Mount::new();
    m.sh_ok("echo x > f && setfattr -n user.x -v y f && setfattr -n user.long -v \"$(seq 1 300 | tr -d '\\n')\" f");
    assert_eq!(m.sh_ok("getfattr --only-values -n user.x f"), "y");
    let dump = m.sh_ok("getfattr -d f");
    assert!(dump.contains("user.x=\"y\""), "{dump}");
    m.sh_ok("setfattr -x user.x f");
    assert!(
        !m.sh("getfattr -n user.x f").status.success(),
        "removed xattr still readable"
    );
}

#[test]
fn symlinks_resolve_and_readlink_returns_the_target() {
    let m = Mount::new();
    m.sh_ok("mkdir d && echo hi > d/f && ln -s d/f l && ln -s /nonexistent dangling");
    assert_eq!(m.sh_ok("readlink l"), "d/f\n");
    assert_eq!(m.sh_ok("cat l"), "hi\n");
    assert_eq!(m.sh_ok("stat -c %F l"), "symbolic link\n");
    assert_eq!(m.sh_ok("readlink dangling"), "/nonexistent\n");
    assert!(!m.sh("cat dangling").status.success());
}

#[test]
fn hard_links_share_content_and_count_links() {
    let m = Mount::new();
    m.sh_ok("mkdir d && echo first > f && ln f d/g");
    assert_eq!(m.sh_ok("stat -c %h f d/g"), "2\n2\n");
    assert_eq!(m.sh_ok("stat -c %i f"), m.sh_ok("stat -c %i d/g"));
    m.sh_ok("echo second >> d/g");
    assert_eq!(m.sh_ok("cat f"), "first\nsecond\n");
    m.sh_ok("rm f");
    assert_eq!(m.sh_ok("stat -c %h d/g"), "1\n");
    assert_eq!(m.sh_ok("cat d/g"), "first\nsecond\n");
}

#[test]
fn mkfifo_creates_a_working_fifo() {
    let m = Mount::new();
    m.sh_ok("mkfifo p");
    assert_eq!(m.sh_ok("stat -c %F p"), "fifo\n");
    assert_eq!(
        m.sh_ok("(echo through > p &) ; timeout 10 cat p"),
        "through\n"
    );
}

#[test]
fn chmod_and_chown_change_mode_and_owner() {
    let m = Mount::new();
    m.sh_ok("echo x > f && chmod 640 f && chown 1234:5678 f");
    assert_eq!(m.sh_ok("stat -c '%a %u %g' f"), "640 1234 5678\n");
    m.sh_ok("chmod u+x,o+r f");
    assert_eq!(m.sh_ok("stat -c %a f"), "744\n");
}

/// Lets the kernel's attribute cache of the mount (1 s) expire, so that
/// the next `stat` asks the daemon. A time and not a condition: nothing
/// outside the kernel shows when its cached attributes lapse.
fn past_attr_cache() {
    let_time_pass(std::time::Duration::from_millis(1100));
}

/// `touch -d` opens the file for writing and sets the times through that
/// descriptor (futimens) before closing it, without writing.
#[test]
fn touch_d_sets_the_modification_time() {
    let m = Mount::new();
    m.sh_ok("echo x > f; touch -d '2001-02-03 04:05:06 UTC' f new");
    assert_eq!(
        m.sh_ok("stat -c '%Y %X' f new"),
        "981173106 981173106\n981173106 981173106\n"
    );
    // Once the attribute caches have expired too.
    past_attr_cache();
    assert_eq!(m.sh_ok("stat -c %Y f new"), "981173106\n981173106\n");
}

/// What `cp -p`, `tar x` and `rsync` do: write, set the times through the
/// open descriptor, close. The times set last are the ones that stay.
#[test]
fn futimens_after_writing_sets_the_modification_time() {
    let m = Mount::new();
    let mut w = Agent::spawn(&m.mnt);
    for cmd in ["open f wc", "put data", "futimes 981173106", "close"] {
        w.ok(cmd);
    }
    assert_eq!(m.sh_ok("stat -c %Y f"), "981173106\n");
    past_attr_cache();
    assert_eq!(m.sh_ok("stat -c %Y f"), "981173106\n");
    m.sh_ok("cp -p /usr/share/doc/bash/copyright c");
    past_attr_cache();
    assert_eq!(
        m.sh_ok("stat -c %Y c"),
        m.sh_ok("stat -c %Y /usr/share/doc/bash/copyright")
    );
}

/// Opening a file for writing and closing it without writing leaves its
/// modification time alone (as on any local filesystem).
#[test]
fn open_for_write_without_writing_keeps_the_mtime() {
    let m = Mount::new();
    m.sh_ok("echo x > f");
    // utime by path: no descriptor is involved.
    let mut w = Agent::spawn(&m.mnt);
    w.ok("utime f 981173106");
    assert_eq!(m.sh_ok("stat -c %Y f"), "981173106\n");
    w.ok("open f w");
    w.ok("close");
    past_attr_cache();
    assert_eq!(m.sh_ok("stat -c %Y f"), "981173106\n");
}

#[test]
fn df_on_the_mount_works() {
    let m = Mount::new();
    let out = m.sh_ok("df -P .");
    let line = out.lines().nth(1).expect("df prints a line for the mount");
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.last().copied(), Some(m.mnt.to_str().unwrap()), "{out}");
    let total: u64 = f[1].parse().unwrap();
    assert!(total > 0, "df reports no capacity: {out}");
    m.sh_ok("df -i . >/dev/null");
}
