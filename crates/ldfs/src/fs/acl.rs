//! POSIX ACLs in their extended attribute form, kept as Linux keeps them
//! (fs/posix_acl.c). Under FUSE_POSIX_ACL the kernel enforces ACLs but
//! leaves their upkeep to the file system: the mode follows an access ACL
//! (one equal to the mode bits is not stored), chmod rewrites the ACL, and
//! new inodes inherit their directory's default ACL.
//!
//! The form (`posix_acl_xattr`): a u32 version (2), then entries of u16
//! tag, u16 permissions, u32 id, little endian, sorted by tag and id.

/// The access ACL's attribute.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's attribute (directories only).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl(Vec<Entry>);

impl Acl {
    /// Parses an ACL attribute value; `None` if it is not one, or not one
    /// Linux takes (`posix_acl_valid`): the kernel could not read it back.
    pub fn parse(v: &[u8]) -> Option<Acl> {
        if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) || v[..4] != VERSION.to_le_bytes() {
            return None;
        }
        let entries: Vec<Entry> = v[4..]
            .chunks(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        // Owner, named users, owning group, named groups, mask, other:
        // each class in that order, the three of the mode bits once, a
        // mask at most once, and one if there are named entries.
        let rank = |tag| match tag {
            USER_OBJ => Some(0),
            USER => Some(1),
            GROUP_OBJ => Some(2),
            GROUP => Some(3),
            MASK => Some(4),
            OTHER => Some(5),
            _ => None,
        };
        let mut last = None;
        let (mut named, mut mask) = (false, false);
        for e in &entries {
            let r = rank(e.tag)?;
            let once = matches!(e.tag, USER_OBJ | GROUP_OBJ | MASK | OTHER);
            if e.perm & !7 != 0 || last > Some(r) || (once && last == Some(r)) {
                return None;
            }
            named |= matches!(e.tag, USER | GROUP);
            mask |= e.tag == MASK;
            last = Some(r);
        }
        let has = |tag| entries.iter().any(|e| e.tag == tag);
        if !(has(USER_OBJ) && has(GROUP_OBJ) && has(OTHER)) || (named && !mask) {
            return None;
        }
        Some(Acl(entries))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            b.extend_from_slice(&e.tag.to_le_bytes());
            b.extend_from_slice(&e.perm.to_le_bytes());
            b.extend_from_slice(&e.id.to_le_bytes());
        }
        b
    }

    /// `posix_acl_equiv_mode`: the permission bits the ACL gives the owner,
    /// the group class (its mask if it has one) and others, and whether the
    /// ACL says more than those bits (named entries or a mask). `None` if an
    /// owner, group or other entry is missing.
    pub fn mode(&self) -> Option<(u32, bool)> {
        let (mut user, mut group, mut other, mut mask) = (None, None, None, None);
        let mut extended = false;
        for e in &self.0 {
            let p = (e.perm & 7) as u32;
            match e.tag {
                USER_OBJ => user = Some(p),
                GROUP_OBJ => group = Some(p),
                OTHER => other = Some(p),
                MASK => {
                    mask = Some(p);
                    extended = true;
                }
                USER | GROUP => extended = true,
                _ => return None,
            }
        }
        Some(((user? << 6) | (mask.or(group)? << 3) | other?, extended))
    }

    /// `__posix_acl_chmod`: the owner, group class (mask, else group) and
    /// other entries take the permission bits of `mode`.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.0.iter().any(|e| e.tag == MASK);
        for e in &mut self.0 {
            let bits = match e.tag {
                USER_OBJ => mode >> 6,
                MASK => mode >> 3,
                GROUP_OBJ if !has_mask => mode >> 3,
                OTHER => mode,
                _ => continue,
            };
            e.perm = (bits & 7) as u16;
        }
    }

    /// `posix_acl_create_masq`: a directory's default ACL made into a new
    /// inode's access ACL, each class's permissions limited by the create
    /// mode, and the mode limited by the ACL. Returns whether the ACL says
    /// more than the mode (only then is it stored).
    pub fn create_masq(&mut self, mode: &mut u32) -> bool {
        let mut extended = false;
        let (mut group_obj, mut mask_obj) = (None, None);
        for (k, e) in self.0.iter_mut().enumerate() {
            let p = e.perm as u32;
            match e.tag {
                USER_OBJ => {
                    let p = p & ((*mode >> 6) | !7);
                    e.perm = p as u16;
                    *mode &= (p << 6) | !0o700;
                }
                USER | GROUP => extended = true,
                GROUP_OBJ => group_obj = Some(k),
                OTHER => {
                    let p = p & (*mode | !7);
                    e.perm = p as u16;
                    *mode &= p | !0o007;
                }
                MASK => {
                    mask_obj = Some(k);
                    extended = true;
                }
                _ => {}
            }
        }
        if let Some(k) = mask_obj.or(group_obj) {
            let e = &mut self.0[k];
            let p = e.perm as u32 & ((*mode >> 3) | !7);
            e.perm = p as u16;
            *mode &= (p << 3) | !0o070;
        }
        extended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl(entries
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect())
    }

    #[test]
    fn mode_chmod_and_inheritance_as_linux() {
        let minimal = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]);
        assert_eq!(Acl::parse(&minimal.encode()), Some(minimal.clone()));
        assert_eq!(minimal.mode(), Some((0o744, false)));
        let mut named = acl(&[
            (USER_OBJ, 6, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 4, 0),
        ]);
        assert_eq!(named.mode(), Some((0o674, true)));
        named.chmod(0o640);
        assert_eq!(named.mode(), Some((0o640, true)));
        // The group entry keeps its permissions: the mask took the bits.
        assert_eq!(named.0[2].perm, 5);
        let mut m = 0o100666;
        let mut inherited = named.clone();
        assert!(inherited.create_masq(&mut m));
        assert_eq!(m, 0o100640);
        let mut m = 0o040755;
        let mut plain = minimal.clone();
        assert!(!plain.create_masq(&mut m));
        assert_eq!((m, plain.mode()), (0o040744, Some((0o744, false))));
        assert_eq!(Acl::parse(b"\x02\0\0\0\x01\0"), None);
    }
}
