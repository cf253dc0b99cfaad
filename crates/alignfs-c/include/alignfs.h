/* alignfs C API: open an alignfs volume inside your process and use it without FUSE.
 *
 * Link with -lalignfs_c (target/release/libalignfs_c.so). Every function returns a
 * non-negative value on success and -errno on failure; alignfs_last_error() then holds a
 * message for the calling thread. A null pointer where one is required gives -EFAULT.
 *
 * Paths are inside the volume ("/dir/file"; a relative path starts at the root) and
 * symbolic links are not followed. One process holds a volume at a time: opening one that
 * a mount or another process holds gives -EBUSY. Descriptors are >= ALIGNFS_FD_BASE, a
 * range the kernel's descriptors never reach. Functions are safe to call from several
 * threads at once; a volume handle must not be used after alignfs_volume_close.
 *
 * Durability (README, "Durability promise"): on an `orch` volume a write is durable when
 * it returns, and alignfs_fsync only retries an SSD flush that failed. On a `scrap`
 * volume (its SSD named, the fast-tier path ignored) data is durable after alignfs_fsync
 * or alignfs_fdatasync, which write the file's scrap pages to the SSD.
 *
 * A block volume (`alignfs mkfs --profile uhs`, the volume `alignfs nbd` serves) opens
 * with alignfs_block_open instead; alignfs_volume_open refuses it with -EINVAL.
 */
#ifndef ALIGNFS_H
#define ALIGNFS_H

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ALIGNFS_FD_BASE (1 << 30)

typedef struct AlignfsVolume alignfs_volume;
typedef struct AlignfsDir alignfs_dir;

struct alignfs_dirent {
    uint64_t ino;
    uint8_t type;   /* DT_REG, DT_DIR, ... from <dirent.h> */
    char name[256]; /* NUL-terminated */
};

/* Open the volume formatted on these devices (alignfs mkfs); the handle goes to *out. */
int alignfs_volume_open(const char *fast, const char *ssd, alignfs_volume **out);
/* Close open descriptors, flush, checkpoint. The handle is gone even on error. */
int alignfs_volume_close(alignfs_volume *volume);
/* The calling thread's last error message ("" if none); valid until its next call. */
const char *alignfs_last_error(void);

/* Files. flags are O_RDONLY/O_WRONLY/O_RDWR with O_CREAT, O_EXCL, O_TRUNC, O_APPEND,
 * O_DIRECTORY (others are accepted and ignored). */
int alignfs_open(alignfs_volume *volume, const char *path, int flags, mode_t mode);
int alignfs_close(alignfs_volume *volume, int fd);
int alignfs_dup(alignfs_volume *volume, int fd);
ssize_t alignfs_read(alignfs_volume *volume, int fd, void *buf, size_t len);
ssize_t alignfs_write(alignfs_volume *volume, int fd, const void *buf, size_t len);
ssize_t alignfs_pread(alignfs_volume *volume, int fd, void *buf, size_t len, off_t offset);
ssize_t alignfs_pwrite(alignfs_volume *volume, int fd, const void *buf, size_t len, off_t offset);
ssize_t alignfs_preadv(alignfs_volume *volume, int fd, const struct iovec *iov, int iovcnt, off_t offset);
ssize_t alignfs_pwritev(alignfs_volume *volume, int fd, const struct iovec *iov, int iovcnt, off_t offset);
off_t alignfs_lseek(alignfs_volume *volume, int fd, off_t offset, int whence);
int alignfs_fsync(alignfs_volume *volume, int fd);
int alignfs_fdatasync(alignfs_volume *volume, int fd);
int alignfs_ftruncate(alignfs_volume *volume, int fd, off_t length);
int alignfs_truncate(alignfs_volume *volume, const char *path, off_t length);
int alignfs_fstat(alignfs_volume *volume, int fd, struct stat *out);
int alignfs_stat(alignfs_volume *volume, const char *path, struct stat *out);

/* Names. */
int alignfs_unlink(alignfs_volume *volume, const char *path);
int alignfs_rename(alignfs_volume *volume, const char *from, const char *to);
int alignfs_mkdir(alignfs_volume *volume, const char *path, mode_t mode);
int alignfs_rmdir(alignfs_volume *volume, const char *path);

/* Directories: a snapshot of the entries, "." and ".." first. alignfs_readdir returns 1
 * with *entry filled, 0 at the end. */
int alignfs_opendir(alignfs_volume *volume, const char *path, alignfs_dir **out);
int alignfs_readdir(alignfs_dir *dir, struct alignfs_dirent *entry);
void alignfs_closedir(alignfs_dir *dir);

/* Block volumes: one address space of alignfs_block_size() bytes, read and written at
 * any byte offset and length inside it (whole requests or nothing: -EINVAL past the end).
 * On a `uhs` volume a write is durable when it returns; alignfs_block_flush makes every
 * write that returned durable on any profile. */
typedef struct AlignfsBlock alignfs_block;

#define ALIGNFS_BLOCK_READ_ONLY 1 /* writes and trims give -EROFS */

int alignfs_block_open(const char *fast, const char *ssd, int flags, alignfs_block **out);
/* Flush and close. The handle is gone even on error. */
int alignfs_block_close(alignfs_block *volume);
int64_t alignfs_block_size(const alignfs_block *volume);
/* 512 or 4096: what `alignfs nbd` advertises as the minimum block size. */
int alignfs_block_sector_size(const alignfs_block *volume);
int alignfs_block_read(const alignfs_block *volume, void *buf, size_t len, uint64_t offset);
int alignfs_block_write(const alignfs_block *volume, const void *buf, size_t len, uint64_t offset);
int alignfs_block_flush(const alignfs_block *volume);
/* The range reads as zeros afterwards; its whole blocks are freed. */
int alignfs_block_trim(const alignfs_block *volume, uint64_t offset, uint64_t len);

#ifdef __cplusplus
}
#endif

#endif
