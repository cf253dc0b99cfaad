#!/usr/bin/env python3
"""What a GlusterFS brick needs from the file system under it, checked on an alignfs mount.

GlusterFS's posix translator tags every file and directory with `trusted.gfid` (set with
XATTR_CREATE, also on symlinks), keeps a hard-link tree under `.glusterfs/xx/yy/<gfid>`,
stores replication changelogs in `trusted.afr.*`, preallocates with fallocate, reads
statvfs for its reserve checks, and heals by comparing ctime and link counts, so those
must be right immediately after link, rename and unlink (no stale cached attributes).
Run as root (trusted.* needs CAP_SYS_ADMIN). Prints one line per check and exits 1 if any
failed.

usage: brick_requirements.py DIR   (an empty or new directory on an alignfs mount)
"""

import ctypes
import errno
import os
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
libc.lgetxattr.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
libc.lgetxattr.restype = ctypes.c_ssize_t
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2

results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} brick: {name}{': ' + str(detail) if detail and not ok else ''}", flush=True)


def raises(errno_value, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except OSError as e:
        return e.errno == errno_value
    return False


def ctime(path):
    return os.lstat(path).st_ctime_ns


def later(before):
    """Make the next change land on a new nanosecond timestamp even on a coarse clock."""
    while time.time_ns() <= before + 1_000_000:
        time.sleep(0.001)


def xattrs(root):
    gfid = os.urandom(16)
    f = f"{root}/file"
    d = f"{root}/dir"
    s = f"{root}/link"
    with open(f, "wb") as out:
        out.write(b"x" * 10_000)
    os.mkdir(d)
    os.symlink("file", s)
    for path in (f, d, s):
        os.setxattr(path, "trusted.gfid", gfid, os.XATTR_CREATE, follow_symlinks=False)
    check(
        "trusted.gfid on a file, a directory and a symlink",
        all(os.getxattr(p, "trusted.gfid", follow_symlinks=False) == gfid for p in (f, d, s)),
    )
    check("XATTR_CREATE on an existing name fails with EEXIST",
          raises(errno.EEXIST, os.setxattr, f, "trusted.gfid", b"other", os.XATTR_CREATE))
    check("XATTR_REPLACE of a missing name fails with ENODATA",
          raises(errno.ENODATA, os.setxattr, f, "trusted.none", b"v", os.XATTR_REPLACE))
    # AFR's changelog: 12-byte counters rewritten on every write transaction.
    for i in range(200):
        os.setxattr(f, "trusted.afr.gv0-client-1", i.to_bytes(12, "big"))
    check("trusted.afr changelog rewritten 200 times", os.getxattr(f, "trusted.afr.gv0-client-1") == (199).to_bytes(12, "big"))
    os.setxattr(f, "security.selinux", b"system_u:object_r:glusterd_brick_t:s0\0")
    check("security.* attributes", os.getxattr(f, "security.selinux").startswith(b"system_u"))
    names = set(os.listxattr(f))
    check("listxattr names every attribute", {"trusted.gfid", "trusted.afr.gv0-client-1", "security.selinux"} <= names, names)
    size = libc.lgetxattr(s.encode(), b"trusted.gfid", None, 0)
    check("a size query (NULL buffer) returns the value's length", size == 16, size)
    small = ctypes.create_string_buffer(4)
    too_small = libc.lgetxattr(f.encode(), b"trusted.gfid", small, 4) == -1 and ctypes.get_errno() == errno.ERANGE
    check("a too-small buffer fails with ERANGE", too_small)
    before = ctime(f)
    later(before)
    os.setxattr(f, "trusted.glusterfs.test", b"1")
    check("setxattr advances ctime", ctime(f) > before)
    os.removexattr(f, "trusted.glusterfs.test")
    check("removexattr", raises(errno.ENODATA, os.getxattr, f, "trusted.glusterfs.test"))
    big = os.urandom(1024)
    os.setxattr(d, "trusted.glusterfs.dht", big)
    check("a 1 KiB value on a directory (DHT layouts are smaller)", os.getxattr(d, "trusted.glusterfs.dht") == big)


def links_and_times(root):
    f = f"{root}/data"
    with open(f, "wb") as out:
        out.write(b"gluster" * 1000)
    tree = f"{root}/.glusterfs/ab/cd"
    os.makedirs(tree)
    handle = f"{tree}/abcd0000-1111-2222-3333-444455556666"
    before = ctime(f)
    later(before)
    os.link(f, handle)
    st = os.lstat(f)
    check("link: nlink 2 at once on both names", st.st_nlink == 2 and os.lstat(handle).st_nlink == 2)
    check("link: same inode", st.st_ino == os.lstat(handle).st_ino)
    check("link: ctime advanced", st.st_ctime_ns > before)
    with open(handle, "r+b") as out:
        out.write(b"G")
    with open(f, "rb") as inp:
        check("link: data written through one name reads through the other", inp.read(1) == b"G")

    moved = f"{root}/moved"
    before = ctime(f)
    later(before)
    os.rename(f, moved)
    st = os.lstat(moved)
    check("rename: ctime of the renamed file advanced", st.st_ctime_ns > before)
    check("rename: nlink unchanged", st.st_nlink == 2)
    check("rename: the old name is gone", not os.path.lexists(f))

    # Rename over an existing name: the replaced file loses a link, at once.
    victim = f"{root}/victim"
    with open(victim, "wb") as out:
        out.write(b"v")
    keep = f"{root}/victim-keep"
    os.link(victim, keep)
    before = ctime(keep)
    later(before)
    os.rename(moved, victim)
    st = os.lstat(keep)
    check("rename over a name: the replaced inode drops to nlink 1", st.st_nlink == 1, st.st_nlink)
    check("rename over a name: the replaced inode's ctime advanced", st.st_ctime_ns > before)

    before = ctime(handle)
    later(before)
    os.unlink(victim)
    st = os.lstat(handle)
    check("unlink: the remaining name has nlink 1 at once", st.st_nlink == 1, st.st_nlink)
    check("unlink: its ctime advanced", st.st_ctime_ns > before)
    # GlusterFS unlinks the gfid handle last; the inode must go then.
    os.unlink(handle)
    check("unlink of the last name", not os.path.lexists(handle))

    # Directory handles are symlinks in the .glusterfs tree.
    os.mkdir(f"{root}/adir")
    os.symlink("../../00/00/00000000-0000-0000-0000-000000000001/adir", f"{tree}/dirhandle")
    check("a directory handle symlink", os.readlink(f"{tree}/dirhandle").endswith("/adir"))
    parent_before = os.lstat(root).st_nlink
    os.rmdir(f"{root}/adir")
    check("rmdir: the parent's nlink drops at once", os.lstat(root).st_nlink == parent_before - 1)


def fallocate(root):
    path = f"{root}/prealloc"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.posix_fallocate(fd, 0, 1 << 20)
        check("fallocate grows the file", os.fstat(fd).st_size == 1 << 20)
        ok = libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20) == 0
        check("fallocate KEEP_SIZE keeps the size", ok and os.fstat(fd).st_size == 1 << 20, ctypes.get_errno())
        os.pwrite(fd, b"y" * 65536, 0)
        ok = libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 32768) == 0
        check("fallocate PUNCH_HOLE zeroes the range", ok and os.pread(fd, 32768, 4096) == bytes(32768), ctypes.get_errno())
        check("bytes around the hole are kept", os.pread(fd, 4096, 0) == b"y" * 4096 and os.pread(fd, 4096, 36864) == b"y" * 4096)
    finally:
        os.close(fd)


def statvfs(root):
    st = os.statvfs(root)
    check("statvfs: sane geometry", st.f_bsize > 0 and st.f_frsize > 0 and 0 < st.f_bfree <= st.f_blocks and st.f_bavail <= st.f_bfree)
    check("statvfs: inode counts and name length", st.f_files > 0 and st.f_ffree > 0 and st.f_namemax >= 255)
    path = f"{root}/space"
    before = os.statvfs(root).f_bfree
    with open(path, "wb") as out:
        out.write(os.urandom(64 << 20))
        out.flush()
        os.fsync(out.fileno())
    used = os.statvfs(root).f_bfree
    os.unlink(path)
    frsize = st.f_frsize
    # FUSE sends a file's last release after close() returns: its blocks are freed when
    # the daemon sees it, a moment after the unlink on a loaded machine.
    deadline = time.time() + 5
    while (after := os.statvfs(root).f_bfree) < before - (4 << 20) // frsize and time.time() < deadline:
        time.sleep(0.05)
    check("statvfs: 64 MiB written shows as used", (before - used) * frsize >= 60 << 20, (before - used) * frsize)
    check("statvfs: and free again after unlink", after >= before - (4 << 20) // frsize, (before, after))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    for part in (xattrs, links_and_times, fallocate, statvfs):
        sub = f"{root}/{part.__name__}"
        os.mkdir(sub)
        try:
            part(sub)
        except OSError as e:
            check(f"{part.__name__} raised", False, e)
    failed = results.count(False)
    print(f"brick requirements: {len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
