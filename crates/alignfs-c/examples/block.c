/* The block half of the alignfs C API: open a uhs volume in-process, write, read back,
 * trim, flush. CI builds and runs it (scripts/test.sh).
 *
 *   alignfs mkfs --profile uhs --fast /dev/shm/uhs-fast:64M --ssd /var/tmp/uhs.img:1G --nvm-range 0-1M
 *   cc -Icrates/alignfs-c/include crates/alignfs-c/examples/block.c \
 *      -Ltarget/release -lalignfs_c -Wl,-rpath,$PWD/target/release -o block
 *   ./block /dev/shm/uhs-fast /var/tmp/uhs.img
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    alignfs_block *v;
    int rc = alignfs_block_open(argv[1], argv[2], 0, &v);
    if (rc < 0) {
        fprintf(stderr, "open block volume: %s (%s)\n", alignfs_last_error(), strerror(-rc));
        return 1;
    }
    int64_t size = alignfs_block_size(v);
    check(size > (1 << 22), "the volume has a size");
    int sector = alignfs_block_sector_size(v);
    check(sector == 512 || sector == 4096, "and a sector size of 512 or 4096");

    /* A small write (the NVM buffer), a large unaligned one (whole blocks to the SSD, the
     * ends to the buffer), and one at the start (the NVM range, if mkfs gave one). */
    size_t len = 300000;
    char *data = malloc(len), *back = malloc(len);
    for (size_t i = 0; i < len; i++) data[i] = (char)(i * 13 + 1);
    check(alignfs_block_write(v, data, 4096, 8 << 20) == 0, "a 4 KiB write");
    check(alignfs_block_write(v, data, len, (2 << 20) + 100) == 0, "a 300000-byte write at an odd offset");
    check(alignfs_block_write(v, "superblock", 10, 1024) == 0, "a write at the start");
    check(alignfs_block_flush(v) == 0, "flush");
    check(alignfs_block_read(v, back, len, (2 << 20) + 100) == 0 && memcmp(back, data, len) == 0, "the large write reads back");
    check(alignfs_block_read(v, back, 10, 1024) == 0 && memcmp(back, "superblock", 10) == 0, "so does the one at the start");

    check(alignfs_block_trim(v, 8 << 20, 4096) == 0, "trim the 4 KiB write");
    char zeros[4096] = {0};
    check(alignfs_block_read(v, back, 4096, 8 << 20) == 0 && memcmp(back, zeros, 4096) == 0, "it reads as zeros");

    check(alignfs_block_read(v, back, 2, (uint64_t)size - 1) == -EINVAL, "a read past the end gives EINVAL");
    check(strstr(alignfs_last_error(), "outside") != NULL, "and a message saying why");
    alignfs_volume *files;
    check(alignfs_volume_open(argv[1], argv[2], &files) == -EBUSY, "the volume is held while open");

    check(alignfs_block_close(v) == 0, "close");
    free(data);
    free(back);
    printf("suite totals: %d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
