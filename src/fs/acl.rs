//! POSIX ACLs: the `system.posix_acl_access` / `system.posix_acl_default`
//! value format and the rules Linux filesystems apply to them (those of
//! the kernel's `fs/posix_acl.c`): an access ACL equivalent to a mode *is*
//! that mode, `chmod` rewrites the owner, mask (or group) and other
//! entries, and a new node in a directory with a default ACL inherits it.
//! The kernel checks permissions against the ACLs (`FUSE_POSIX_ACL`); the
//! daemon keeps modes and ACLs consistent. See docs/SEMANTICS.md, "ACLs".

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// The xattr format version (`POSIX_ACL_XATTR_VERSION`).
const VERSION: u32 = 2;
/// The id stored in entries that have none (owner, group, mask, other).
const UNDEFINED_ID: u32 = u32::MAX;
/// The largest value the kernel reads back (one page): 511 entries.
pub const MAX_ENTRIES: usize = (4096 - 4) / 8;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AclError {
    #[error("ACL of {0} bytes: not a header and whole 8-byte entries")]
    Size(usize),
    #[error("ACL format version {0}, expected 2")]
    Version(u32),
    #[error("ACL with {0} entries, more than {MAX_ENTRIES}")]
    TooMany(usize),
    #[error("ACL entry {index}: {why}")]
    Entry { index: usize, why: &'static str },
    #[error("ACL lacks its {0} entry")]
    Missing(&'static str),
}

impl From<AclError> for crate::error::FsError {
    fn from(e: AclError) -> Self {
        crate::error::FsError::Invalid(e.to_string())
    }
}

/// Entry tags (`ACL_USER_OBJ` ...), in the order a valid ACL lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    UserObj,
    User,
    GroupObj,
    Group,
    Mask,
    Other,
}

impl Tag {
    fn from_u16(v: u16) -> Option<Tag> {
        Some(match v {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    fn to_u16(self) -> u16 {
        match self {
            Tag::UserObj => 0x01,
            Tag::User => 0x02,
            Tag::GroupObj => 0x04,
            Tag::Group => 0x08,
            Tag::Mask => 0x10,
            Tag::Other => 0x20,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    /// rwx as 4, 2, 1.
    pub perm: u16,
    /// A user or group id for `User`/`Group` entries.
    pub id: u32,
}

/// A valid ACL: one owner, group and other entry, named users and groups
/// in between, a mask whenever there is a named entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Parses and validates an xattr value as the kernel does
    /// (`posix_acl_from_xattr`, `posix_acl_valid`). `None`: a value with no
    /// entries, which means "no ACL".
    pub fn parse(v: &[u8]) -> Result<Option<Acl>, AclError> {
        if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) {
            return Err(AclError::Size(v.len()));
        }
        let word = |at: usize| u32::from_le_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
        let version = word(0);
        if version != VERSION {
            return Err(AclError::Version(version));
        }
        let n = (v.len() - 4) / 8;
        if n == 0 {
            return Ok(None);
        }
        if n > MAX_ENTRIES {
            return Err(AclError::TooMany(n));
        }
        let mut entries = Vec::with_capacity(n);
        for index in 0..n {
            let at = 4 + index * 8;
            let tag = u16::from_le_bytes([v[at], v[at + 1]]);
            let perm = u16::from_le_bytes([v[at + 2], v[at + 3]]);
            let tag = Tag::from_u16(tag).ok_or(AclError::Entry {
                index,
                why: "unknown tag",
            })?;
            let id = match tag {
                Tag::User | Tag::Group => word(at + 4),
                _ => UNDEFINED_ID,
            };
            entries.push(Entry { tag, perm, id });
        }
        let acl = Acl { entries };
        acl.validate()?;
        Ok(Some(acl))
    }

    /// The order and completeness rules of `posix_acl_valid`.
    fn validate(&self) -> Result<(), AclError> {
        let mut prev: Option<Tag> = None;
        let mut named = false;
        for (index, e) in self.entries.iter().enumerate() {
            let bad = |why| Err(AclError::Entry { index, why });
            if e.perm & !7 != 0 {
                return bad("permission bits other than rwx");
            }
            let unique = matches!(e.tag, Tag::UserObj | Tag::GroupObj | Tag::Mask | Tag::Other);
            match prev {
                Some(p) if p > e.tag || (p == e.tag && unique) => {
                    return bad("entries out of order or repeated");
                }
                _ => {}
            }
            let expected_before = match e.tag {
                Tag::UserObj => None,
                Tag::User | Tag::GroupObj => Some(Tag::UserObj),
                Tag::Group | Tag::Mask | Tag::Other => Some(Tag::GroupObj),
            };
            if let Some(need) = expected_before
                && prev.is_none_or(|p| p < need)
            {
                return Err(AclError::Missing(match need {
                    Tag::UserObj => "owner",
                    _ => "owning group",
                }));
            }
            named |= matches!(e.tag, Tag::User | Tag::Group);
            prev = Some(e.tag);
        }
        if prev != Some(Tag::Other) {
            return Err(AclError::Missing("other"));
        }
        if named && !self.entries.iter().any(|e| e.tag == Tag::Mask) {
            return Err(AclError::Missing("mask"));
        }
        Ok(())
    }

    /// The xattr value (what the kernel itself writes: version 2, ids only
    /// in named entries).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + 8 * self.entries.len());
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(&e.tag.to_u16().to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The permission bits this ACL stands for, and whether it says no
    /// more than they do (`posix_acl_equiv_mode`): the group bits are the
    /// mask's when there is one.
    pub fn equiv_mode(&self) -> (u32, bool) {
        let mut mode = 0u32;
        let mut equiv = true;
        for e in &self.entries {
            let p = u32::from(e.perm & 7);
            match e.tag {
                Tag::UserObj => mode |= p << 6,
                Tag::GroupObj => mode |= p << 3,
                Tag::Other => mode |= p,
                Tag::Mask => {
                    mode = (mode & !0o070) | (p << 3);
                    equiv = false;
                }
                Tag::User | Tag::Group => equiv = false,
            }
        }
        (mode, equiv)
    }

    /// Rewrites the entries a chmod to `mode` changes (`posix_acl_chmod`):
    /// owner and other from the mode, and the mask, or without a mask the
    /// owning group, from its group bits. Named entries keep their
    /// permissions; the mask limits them.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.entries.iter().any(|e| e.tag == Tag::Mask);
        for e in &mut self.entries {
            match e.tag {
                Tag::UserObj => e.perm = ((mode >> 6) & 7) as u16,
                Tag::Other => e.perm = (mode & 7) as u16,
                Tag::Mask => e.perm = ((mode >> 3) & 7) as u16,
                Tag::GroupObj if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                _ => {}
            }
        }
    }

    /// A directory's default ACL applied to a new node created with
    /// `mode` (`posix_acl_create_masq`): each of the owner, other and mask
    /// (or group) entries keeps only what the mode allows, and the mode
    /// keeps only what they allow. Returns the new node's permission bits
    /// (the other bits of `mode` are kept) and its access ACL, `None` when
    /// that is equivalent to the mode.
    pub fn inherit(&self, mode: u32) -> (u32, Option<Acl>) {
        let mut acl = self.clone();
        let mut m = mode & 0o777;
        let has_mask = acl.entries.iter().any(|e| e.tag == Tag::Mask);
        let mut equiv = true;
        for e in &mut acl.entries {
            let clip = |e: &mut Entry, shift: u32, m: &mut u32| {
                e.perm &= ((*m >> shift) & 7) as u16;
                *m &= !(7 << shift) | (u32::from(e.perm) << shift);
            };
            match e.tag {
                Tag::UserObj => clip(e, 6, &mut m),
                Tag::Other => clip(e, 0, &mut m),
                Tag::Mask => {
                    clip(e, 3, &mut m);
                    equiv = false;
                }
                Tag::GroupObj if !has_mask => clip(e, 3, &mut m),
                Tag::User | Tag::Group => equiv = false,
                Tag::GroupObj => {}
            }
        }
        let mode = (mode & !0o777) | m;
        (mode, (!equiv).then_some(acl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: Tag, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    fn acl(entries: Vec<Entry>) -> Acl {
        let a = Acl { entries };
        a.validate().unwrap();
        a
    }

    fn minimal(mode: u32) -> Acl {
        acl(vec![
            e(Tag::UserObj, ((mode >> 6) & 7) as u16, UNDEFINED_ID),
            e(Tag::GroupObj, ((mode >> 3) & 7) as u16, UNDEFINED_ID),
            e(Tag::Other, (mode & 7) as u16, UNDEFINED_ID),
        ])
    }

    /// `setfacl -m u:65534:r` on a 0600 file, as the kernel encodes it.
    fn with_nobody() -> Acl {
        acl(vec![
            e(Tag::UserObj, 6, UNDEFINED_ID),
            e(Tag::User, 4, 65534),
            e(Tag::GroupObj, 0, UNDEFINED_ID),
            e(Tag::Mask, 4, UNDEFINED_ID),
            e(Tag::Other, 0, UNDEFINED_ID),
        ])
    }

    #[test]
    fn bytes_round_trip_in_the_kernel_format() {
        let a = with_nobody();
        let b = a.to_bytes();
        assert_eq!(b.len(), 4 + 5 * 8);
        assert_eq!(&b[..4], &[2, 0, 0, 0]);
        // The named user: tag 0x02, perm 4, id 65534.
        assert_eq!(&b[12..20], &[2, 0, 4, 0, 0xfe, 0xff, 0, 0]);
        assert_eq!(Acl::parse(&b).unwrap(), Some(a));
        assert_eq!(Acl::parse(&2u32.to_le_bytes()).unwrap(), None);
    }

    #[test]
    fn garbage_is_refused() {
        let good = with_nobody().to_bytes();
        assert!(matches!(Acl::parse(b""), Err(AclError::Size(0))));
        assert!(matches!(Acl::parse(&good[..11]), Err(AclError::Size(11))));
        let mut v1 = good.clone();
        v1[0] = 1;
        assert!(matches!(Acl::parse(&v1), Err(AclError::Version(1))));
        let mut tag = good.clone();
        tag[4] = 0x40;
        assert!(matches!(
            Acl::parse(&tag),
            Err(AclError::Entry { index: 0, .. })
        ));
        let mut perm = good.clone();
        perm[6] = 8;
        assert!(Acl::parse(&perm).is_err());
        // Named user without a mask; other missing; group before owner.
        let no_mask = Acl {
            entries: vec![
                e(Tag::UserObj, 6, UNDEFINED_ID),
                e(Tag::User, 4, 1),
                e(Tag::GroupObj, 0, UNDEFINED_ID),
                e(Tag::Other, 0, UNDEFINED_ID),
            ],
        };
        assert_eq!(
            Acl::parse(&no_mask.to_bytes()),
            Err(AclError::Missing("mask"))
        );
        let no_other = Acl {
            entries: minimal(0o640).entries[..2].to_vec(),
        };
        assert_eq!(
            Acl::parse(&no_other.to_bytes()),
            Err(AclError::Missing("other"))
        );
        let mut swapped = minimal(0o640);
        swapped.entries.swap(0, 1);
        assert!(Acl::parse(&swapped.to_bytes()).is_err());
        let mut twice = minimal(0o640);
        twice.entries.insert(1, e(Tag::UserObj, 7, UNDEFINED_ID));
        assert!(Acl::parse(&twice.to_bytes()).is_err());
        let mut huge = 2u32.to_le_bytes().to_vec();
        huge.resize(4 + 8 * (MAX_ENTRIES + 1), 0);
        assert!(matches!(Acl::parse(&huge), Err(AclError::TooMany(_))));
    }

    #[test]
    fn a_minimal_acl_is_its_mode() {
        for mode in [0o644, 0o600, 0o755, 0o000, 0o777, 0o640] {
            assert_eq!(minimal(mode).equiv_mode(), (mode, true), "{mode:o}");
        }
    }

    #[test]
    fn a_mask_gives_the_group_bits_and_is_not_equivalent() {
        assert_eq!(with_nobody().equiv_mode(), (0o640, false));
        let mut masked = minimal(0o664);
        masked.entries.insert(2, e(Tag::Mask, 4, UNDEFINED_ID));
        assert_eq!(masked.equiv_mode(), (0o644, false));
    }

    #[test]
    fn chmod_rewrites_owner_mask_and_other() {
        let mut a = with_nobody();
        a.chmod(0o755);
        let perms: Vec<(Tag, u16)> = a.entries().iter().map(|e| (e.tag, e.perm)).collect();
        assert_eq!(
            perms,
            vec![
                (Tag::UserObj, 7),
                (Tag::User, 4),
                (Tag::GroupObj, 0),
                (Tag::Mask, 5),
                (Tag::Other, 5)
            ]
        );
        let mut m = minimal(0o600);
        m.chmod(0o751);
        assert_eq!(m.equiv_mode(), (0o751, true));
    }

    #[test]
    fn inheriting_a_default_acl_masks_with_the_mode() {
        // Default u::rwx,u:nobody:rwx,g::r-x,m::rwx,o::r-x; open(0666).
        let dflt = acl(vec![
            e(Tag::UserObj, 7, UNDEFINED_ID),
            e(Tag::User, 7, 65534),
            e(Tag::GroupObj, 5, UNDEFINED_ID),
            e(Tag::Mask, 7, UNDEFINED_ID),
            e(Tag::Other, 5, UNDEFINED_ID),
        ]);
        let (mode, access) = dflt.inherit(libc::S_IFREG | 0o666);
        assert_eq!(mode, libc::S_IFREG | 0o664);
        let access = access.expect("a named entry keeps an access ACL");
        let perms: Vec<u16> = access.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, vec![6, 7, 5, 6, 4]);
        // A minimal default ACL gives the mode it allows, and no ACL.
        let (mode, access) = minimal(0o750).inherit(0o777);
        assert_eq!((mode, access), (0o750, None));
        // Bits above the permissions are kept.
        assert_eq!(minimal(0o700).inherit(0o2775).0, 0o2700);
    }
}
