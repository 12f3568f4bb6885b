//! Permissions kept as a Linux filesystem keeps them (docs/SEMANTICS.md,
//! "ACLs" and "Setuid, setgid and capabilities"): modes that `cp -a` and
//! `rsync -aAX` set through ACLs, ACLs the kernel enforces for other users,
//! default ACLs inherited by new nodes, and setuid/setgid bits that a write
//! or truncation by another user clears. Unprivileged steps run as
//! `nobody:nogroup` through `setpriv`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `getfacl` of a path: its entries, without the header naming the file.
fn getfacl(p: &Path) -> String {
    let o = Command::new("getfacl")
        .args(["--omit-header", "--absolute-names"])
        .arg(p)
        .output()
        .expect("run getfacl");
    assert!(
        o.status.success(),
        "getfacl {}: {}",
        p.display(),
        stderr(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether the ACL xattr is stored (listed), not only derived from the mode.
fn stores_acl(p: &Path) -> bool {
    let o = Command::new("getfattr")
        .args(["--absolute-names", "-m", "system.posix_acl_access"])
        .arg(p)
        .output()
        .expect("run getfattr");
    String::from_utf8_lossy(&o.stdout).contains("system.posix_acl_access")
}

/// Every path under `root` (itself included), relative to it.
fn walk(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![std::path::PathBuf::new()];
    let mut i = 0;
    while i < out.len() {
        let p = root.join(&out[i]);
        if p.is_dir() && !p.is_symlink() {
            let mut names: Vec<_> = std::fs::read_dir(&p)
                .unwrap()
                .map(|e| out[i].join(e.unwrap().file_name()))
                .collect();
            names.sort();
            out.extend(names);
        }
        i += 1;
    }
    out
}

/// GNU cp sets the final mode of what it copies with
/// `fsetxattr(system.posix_acl_access)` of an ACL equivalent to the mode;
/// the mode must come out as on the source, not as the 0600/0700 cp
/// created the file or directory with.
#[test]
fn cp_a_keeps_modes() {
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    std::fs::create_dir_all(s.join("tree/private")).unwrap();
    std::fs::create_dir_all(s.join("tree/shared")).unwrap();
    for (rel, m) in [
        ("tree/a", 0o644),
        ("tree/run", 0o755),
        ("tree/private/key", 0o600),
        ("tree/shared/ro", 0o444),
        ("tree/shared/g", 0o664),
        ("tree/private", 0o700),
        ("tree/shared", 0o2775),
        ("tree", 0o750),
    ] {
        let p = s.join(rel);
        if !p.exists() {
            std::fs::write(&p, rel).unwrap();
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
    }
    let m = Mount::new();
    let cp = Command::new("cp")
        .arg("-a")
        .arg(s.join("tree"))
        .arg("/usr/share/doc/adduser")
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert!(cp.status.success(), "cp -a: {}", stderr(&cp));
    for (from, to) in [
        (s.join("tree"), m.path("tree")),
        ("/usr/share/doc/adduser".into(), m.path("adduser")),
    ] {
        for rel in walk(&from) {
            let (a, b) = (from.join(&rel), to.join(&rel));
            if a.is_symlink() {
                continue;
            }
            assert_eq!(
                format!("{:o}", mode(&b)),
                format!("{:o}", mode(&a)),
                "mode of {}",
                b.display()
            );
            assert!(!stores_acl(&b), "{}: a plain mode is no ACL", b.display());
        }
    }
}

/// rsync -aAX copies ACLs (access and default) and user attributes: they
/// arrive intact, and the modes with them.
#[test]
fn rsync_aax_keeps_acls_and_attributes() {
    let src = tempfile::tempdir().unwrap();
    let s = src.path().join("src");
    std::fs::create_dir_all(s.join("d")).unwrap();
    std::fs::write(s.join("a"), b"a").unwrap();
    std::fs::write(s.join("plain"), b"p").unwrap();
    let setup = Command::new("bash")
        .arg("-c")
        .arg(
            "chmod 640 a && chmod 604 plain && setfacl -m u:nobody:r,g:nogroup:rw a \
             && setfacl -d -m u:nobody:rwx d && setfattr -n user.note -v hello plain",
        )
        .current_dir(&s)
        .output()
        .unwrap();
    assert!(setup.status.success(), "setup: {}", stderr(&setup));
    let m = Mount::new();
    let rsync = Command::new("rsync")
        .arg("-aAX")
        .arg(format!("{}/", s.display()))
        .arg(m.path("dst"))
        .output()
        .unwrap();
    assert!(rsync.status.success(), "rsync -aAX: {}", stderr(&rsync));
    for rel in ["a", "plain", "d"] {
        let (a, b) = (s.join(rel), m.path(&format!("dst/{rel}")));
        assert_eq!(getfacl(&b), getfacl(&a), "ACLs of {rel}");
        assert_eq!(mode(&b), mode(&a), "mode of {rel}");
    }
    assert!(getfacl(&m.path("dst/a")).contains("user:nobody:r--"));
    assert!(getfacl(&m.path("dst/d")).contains("default:user:nobody:rwx"));
    assert_eq!(m.xattr("dst/plain", "user.note").as_deref(), Some("hello"));
    assert!(!stores_acl(&m.path("dst/plain")));
}

/// The kernel enforces an ACL entry for another user: `nobody` reads a
/// 0600 file once `setfacl -m u:nobody:r` grants it, and not before; the
/// mode's group bits show the mask; `chmod` rewrites the mask.
#[test]
fn acl_entry_lets_nobody_read() {
    let m = Mount::new();
    m.open_to_all();
    m.sh_ok("printf secret > f && chmod 600 f");
    let read = || m.sh_as_nobody("cat f");
    let denied = read();
    assert!(!denied.status.success(), "nobody read a 0600 file");
    assert!(
        stderr(&denied).contains("Permission denied"),
        "{}",
        stderr(&denied)
    );

    m.sh_ok("setfacl -m u:nobody:r f");
    let allowed = read();
    assert!(
        allowed.status.success(),
        "ACL ignored: {}",
        stderr(&allowed)
    );
    assert_eq!(String::from_utf8_lossy(&allowed.stdout), "secret");
    assert_eq!(mode(&m.path("f")), 0o640, "group bits are the mask");
    let acl = getfacl(&m.path("f"));
    assert!(
        acl.contains("user:nobody:r--") && acl.contains("mask::r--"),
        "{acl}"
    );
    assert!(stores_acl(&m.path("f")));

    // chmod sets the mask, which limits the named entry.
    m.sh_ok("chmod 600 f");
    assert!(getfacl(&m.path("f")).contains("mask::---"));
    assert!(!read().status.success(), "the mask no longer allows it");
    m.sh_ok("chmod 640 f");
    assert!(read().status.success());

    // Back to a plain mode: no ACL stored, access gone.
    m.sh_ok("setfacl -b f");
    assert_eq!(mode(&m.path("f")), 0o600);
    assert!(!stores_acl(&m.path("f")));
    assert!(!read().status.success());

    // An ACL that says no more than a mode is that mode.
    m.sh_ok("setfacl -m u::rwx,g::r,o::r f");
    assert_eq!(mode(&m.path("f")), 0o744);
    assert!(!stores_acl(&m.path("f")));

    // Garbage is refused.
    let mut a = Agent::spawn(&m.mnt);
    let r = a.cmd(&format!(
        "setxattr f system.posix_acl_access {}",
        hex(b"\x02\0\0\0junk!")
    ));
    assert_eq!(err_name(&r), Some("EINVAL"), "{r}");
}

/// A directory's default ACL is inherited by what is created in it, and
/// the umask is then ignored (as POSIX says); without one the umask
/// applies. The inherited entry lets nobody write the new file.
#[test]
fn default_acl_is_inherited() {
    let m = Mount::new();
    m.open_to_all();
    m.sh_ok("mkdir d plain && setfacl -d -m u:nobody:rwx d");
    m.sh_ok("umask 077 && touch d/f plain/f && mkdir d/sub plain/sub");
    assert_eq!(mode(&m.path("plain/f")), 0o600);
    assert_eq!(mode(&m.path("plain/sub")), 0o700);
    assert_eq!(
        mode(&m.path("d/f")),
        0o664,
        "umask ignored under a default ACL"
    );
    assert_eq!(mode(&m.path("d/sub")), 0o775);
    let f = getfacl(&m.path("d/f"));
    assert!(f.contains("user:nobody:rwx\t#effective:rw-"), "{f}");
    let sub = getfacl(&m.path("d/sub"));
    assert!(
        sub.contains("user:nobody:rwx") && sub.contains("default:user:nobody:rwx"),
        "{sub}"
    );
    // The kernel enforces the inherited entry.
    let w = m.sh_as_nobody("echo hi >> d/f && mkdir d/sub/n");
    assert!(w.status.success(), "{}", stderr(&w));
    assert!(!m.sh_as_nobody("echo hi >> plain/f").status.success());
    // A symlink takes no ACL.
    m.sh_ok("ln -s f d/l");
    assert!(m.path("d/l").is_symlink());
}

/// A setuid/setgid program that a member of its group appends to or
/// truncates loses both bits, as on ext4; root (CAP_FSETID) keeps them;
/// setgid without group execute (mandatory locking) stays for members.
#[test]
fn setuid_cleared_by_another_users_write_or_truncate() {
    let m = Mount::new();
    m.open_to_all();
    m.sh_ok("printf '#!/bin/sh\\n' > prog && chgrp nogroup prog");
    let reset = |bits: &str| m.sh_ok(&format!("chmod {bits} prog"));

    reset("06775");
    let w = m.sh_as_nobody("printf 'echo hi\\n' >> prog");
    assert!(w.status.success(), "{}", stderr(&w));
    assert_eq!(
        format!("{:o}", mode(&m.path("prog"))),
        "775",
        "after append"
    );

    reset("06775");
    let t = m.sh_as_nobody("truncate -s 0 prog");
    assert!(t.status.success(), "{}", stderr(&t));
    assert_eq!(
        format!("{:o}", mode(&m.path("prog"))),
        "775",
        "after truncate"
    );

    reset("06775");
    let o = m.sh_as_nobody(": > prog");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        format!("{:o}", mode(&m.path("prog"))),
        "775",
        "after O_TRUNC"
    );

    reset("06775");
    m.sh_ok("printf 'echo root\\n' >> prog && truncate -s 3 prog");
    assert_eq!(
        format!("{:o}", mode(&m.path("prog"))),
        "6775",
        "root keeps them"
    );

    reset("02664");
    let w = m.sh_as_nobody("printf x >> prog");
    assert!(w.status.success(), "{}", stderr(&w));
    assert_eq!(format!("{:o}", mode(&m.path("prog"))), "2664");
}

/// The kernel's cached attributes follow: right after another user's
/// write cleared setuid and setgid, `stat -c %a` (a statx of the mode
/// alone, which the kernel answers from its cache) shows the mode
/// without them, every time. Before, the kernel showed the old mode for
/// up to its attribute lifetime (1 s) in most tries, and `cp -a` and
/// backup tools copy what stat shows.
#[test]
fn stat_shows_setuid_cleared_at_once() {
    let m = Mount::new();
    m.open_to_all();
    m.sh_ok("printf '#!/bin/sh\\n' > prog && chgrp nogroup prog");
    let mut stale = Vec::new();
    for i in 0..40 {
        m.sh_ok("chmod 06777 prog && stat -c %a prog >/dev/null");
        let w = m.sh_as_nobody("printf x >> prog");
        assert!(w.status.success(), "{}", stderr(&w));
        let shown = m.sh_ok("stat -c %a prog").trim().to_string();
        if shown != "777" {
            stale.push(format!("try {i}: {shown}"));
        }
    }
    assert!(stale.is_empty(), "stat showed the old mode: {stale:?}");
}

/// File capabilities go with any change of the data, as on ext4.
#[test]
fn capabilities_cleared_by_a_write() {
    let m = Mount::new();
    m.sh_ok("printf x > prog && chmod 755 prog");
    // VFS_CAP_REVISION_2, effective, permitted CAP_NET_RAW.
    let cap: Vec<u8> = [0x0200_0001u32, 1 << 13, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    Agent::spawn(&m.mnt).ok(&format!("setxattr prog security.capability {}", hex(&cap)));
    assert!(m.xattr("prog", "security.capability").is_some());
    m.sh_ok("printf y >> prog");
    assert_eq!(m.xattr("prog", "security.capability"), None);
}
