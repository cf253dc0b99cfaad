//! Conversions between engine attributes and the kernel's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alignfs::meta::TimeNs;
use alignfs::{Attr, FileKind};
use fuser::{FileAttr, FileType, INodeNo};

pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

pub fn kind_from_mode(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => return None,
    })
}

pub fn system_time(ns: TimeNs) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns.unsigned_abs())
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_nanos(ns.unsigned_abs())).unwrap_or(UNIX_EPOCH)
    }
}

pub fn time_ns(t: SystemTime) -> TimeNs {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// `stat` as the kernel wants it. The engine does not count per-file allocation, so
/// `blocks` (512-byte sectors) is the size rounded up to 4 KiB pages, as `du` expects of a
/// file without holes.
pub fn file_attr(a: &Attr, io_bytes: u64) -> FileAttr {
    let allocated = if a.kind == FileKind::File { a.size.div_ceil(4096) * 4096 } else { 0 };
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: allocated / 512,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: u32::try_from(io_bytes).unwrap_or(u32::MAX),
        flags: 0,
    }
}

/// The attributes of a negative entry: only the node number (0) is read.
pub fn absent() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// access(2) for a caller without supplementary groups (the FUSE request carries none).
/// Only consulted when the mount runs without `default_permissions`.
pub fn may_access(a: &Attr, uid: u32, gid: u32, mask: i32) -> bool {
    let want = (mask & 0o7) as u16;
    if want == 0 {
        return true;
    }
    if uid == 0 {
        // Root may do anything except execute a file no one may execute.
        return want & 0o1 == 0 || a.kind == FileKind::Dir || a.perm & 0o111 != 0;
    }
    let bits = if uid == a.uid {
        (a.perm >> 6) & 0o7
    } else if gid == a.gid {
        (a.perm >> 3) & 0o7
    } else {
        a.perm & 0o7
    };
    bits & want == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for ns in [0, 1, 1_700_000_000_123_456_789, -1, -1_000_000_007] {
            assert_eq!(time_ns(system_time(ns)), ns);
        }
    }

    #[test]
    fn modes_map_to_kinds() {
        assert_eq!(kind_from_mode(libc::S_IFIFO | 0o644), Some(FileKind::Fifo));
        assert_eq!(kind_from_mode(0o644), Some(FileKind::File));
        assert_eq!(kind_from_mode(0o170000), None);
    }
}
