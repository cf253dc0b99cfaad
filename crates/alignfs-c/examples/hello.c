/* The alignfs C API in one small program: open a volume, write and read files, list a
 * directory, handle errors. CI builds and runs it (scripts/test.sh).
 *
 *   alignfs mkfs --fast /dev/shm/fast:64M --ssd /var/tmp/ssd.img:1G
 *   cc -Icrates/alignfs-c/include crates/alignfs-c/examples/hello.c \
 *      -Ltarget/release -lalignfs_c -Wl,-rpath,$PWD/target/release -o hello
 *   ./hello /dev/shm/fast /var/tmp/ssd.img
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alignfs.h"

static int failures, passes;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    passes += ok != 0;
    if (!ok) {
        failures++;
        printf("     last error: %s\n", alignfs_last_error());
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FAST SSD\n", argv[0]);
        return 2;
    }
    alignfs_volume *v;
    int rc = alignfs_volume_open(argv[1], argv[2], &v);
    if (rc < 0) {
        fprintf(stderr, "open volume: %s (%s)\n", alignfs_last_error(), strerror(-rc));
        return 1;
    }
    alignfs_volume *second;
    check(alignfs_volume_open(argv[1], argv[2], &second) == -EBUSY, "a second open of the volume is refused with EBUSY");

    check(alignfs_mkdir(v, "/data", 0755) == 0, "mkdir /data");
    int fd = alignfs_open(v, "/data/hello.txt", O_CREAT | O_RDWR | O_TRUNC, 0644);
    check(fd >= ALIGNFS_FD_BASE, "open(O_CREAT) gives a descriptor above the kernel's range");

    /* An unaligned write across a 32 KiB block: residue in the fast tier, the middle on the SSD. */
    size_t len = 100000;
    char *data = malloc(len);
    for (size_t i = 0; i < len; i++) data[i] = (char)(i * 7 + 3);
    check(alignfs_pwrite(v, fd, data, len, 12345) == (ssize_t)len, "pwrite 100000 bytes at 12345");
    check(alignfs_fsync(v, fd) == 0, "fsync");

    char *back = calloc(1, len);
    check(alignfs_pread(v, fd, back, len, 12345) == (ssize_t)len && memcmp(back, data, len) == 0, "pread returns the same bytes");

    char head[5] = "HEAD", tail[5] = "TAIL";
    struct iovec out[2] = {{head, 4}, {tail, 4}};
    check(alignfs_pwritev(v, fd, out, 2, 0) == 8, "pwritev of two buffers");
    char a[4], b[4];
    struct iovec in[2] = {{a, 4}, {b, 4}};
    check(alignfs_preadv(v, fd, in, 2, 0) == 8 && memcmp(a, "HEAD", 4) == 0 && memcmp(b, "TAIL", 4) == 0, "preadv reads them back");

    check(alignfs_lseek(v, fd, -5, SEEK_END) == 12345 + (off_t)len - 5, "lseek(SEEK_END)");
    char last[5];
    check(alignfs_read(v, fd, last, 5) == 5 && memcmp(last, data + len - 5, 5) == 0, "read at the position");
    check(alignfs_read(v, fd, last, 5) == 0, "read at end of file returns 0");

    struct stat st;
    check(alignfs_fstat(v, fd, &st) == 0 && st.st_size == 12345 + (off_t)len && S_ISREG(st.st_mode), "fstat: size and type");
    check(alignfs_ftruncate(v, fd, 1000) == 0 && alignfs_stat(v, "/data/hello.txt", &st) == 0 && st.st_size == 1000, "ftruncate to 1000");
    check(alignfs_close(v, fd) == 0, "close");
    check(alignfs_close(v, fd) == -EBADF, "closing it again gives EBADF");

    int ro = alignfs_open(v, "/data/hello.txt", O_RDONLY, 0);
    check(alignfs_write(v, ro, "x", 1) == -EBADF, "writing a read-only descriptor gives EBADF");
    alignfs_close(v, ro);

    check(alignfs_rename(v, "/data/hello.txt", "/data/renamed.txt") == 0, "rename");
    alignfs_dir *dir;
    int seen = 0, entries = 0;
    check(alignfs_opendir(v, "/data", &dir) == 0, "opendir");
    struct alignfs_dirent entry;
    while (alignfs_readdir(dir, &entry) == 1) {
        entries++;
        if (strcmp(entry.name, "renamed.txt") == 0 && entry.type == DT_REG) seen = 1;
    }
    alignfs_closedir(dir);
    check(seen && entries == 3, "readdir lists ., .. and renamed.txt");

    check(alignfs_open(v, "/missing", O_RDONLY, 0) == -ENOENT, "opening a missing file gives ENOENT");
    check(strlen(alignfs_last_error()) > 0, "and a message");
    check(alignfs_open(v, "/data", O_WRONLY, 0) == -EISDIR, "opening a directory for writing gives EISDIR");
    check(alignfs_rmdir(v, "/data") == -ENOTEMPTY, "rmdir of a non-empty directory gives ENOTEMPTY");
    check(alignfs_pread(v, 42, back, 1, 0) == -EBADF, "an unknown descriptor gives EBADF");
    check(alignfs_unlink(v, "/data/renamed.txt") == 0 && alignfs_rmdir(v, "/data") == 0, "unlink and rmdir");

    check(alignfs_volume_close(v) == 0, "close the volume");
    free(data);
    free(back);
    printf("suite totals: %d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
