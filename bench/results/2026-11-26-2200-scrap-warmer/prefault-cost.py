import mmap, time, sys
n = 4 << 30
for huge in (False, True):
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge: m.madvise(mmap.MADV_HUGEPAGE)
    t = time.time(); m.madvise(23, 0, n); dt = time.time() - t  # MADV_POPULATE_WRITE
    print("huge" if huge else "4k", f"{dt:.2f} s for 4 GiB")
    m.close()
