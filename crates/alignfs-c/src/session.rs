//! An open volume used in-process, with POSIX-style descriptors: the safe core behind the
//! C functions (and the preload shim that will sit on them).
//!
//! Paths are inside the volume (`/dir/file`; a relative path starts at the volume's root)
//! and symbolic links are not followed. The calling process owns the volume, so there are
//! no permission checks beyond the descriptor's access mode.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use alignfs::paths::open_paths;
use alignfs::profile::Personality;
use alignfs::volume::{DirEntry, FallocateMode, RenameFlags, SetAttrRequest};
use alignfs::{Attr, Error, FileKind, Ino, Result, Volume, VolumeOptions};
use parking_lot::Mutex;

/// The first descriptor number handed out. Kernel descriptors stay below `nr_open`, whose
/// ceiling is 2^30 - 64 on Linux, so these never collide with real ones.
pub const FD_BASE: i32 = 1 << 30;

/// Writes are cut into pieces of this size, so one huge call does not build one huge
/// SSD image in memory.
const WRITE_PIECE: usize = 8 << 20;

struct OpenFile {
    ino: Ino,
    kind: FileKind,
    readable: bool,
    writable: bool,
    append: bool,
    /// The file position of `read`/`write`/`lseek`; the lock also orders those calls.
    position: Mutex<u64>,
    /// The path it was opened by (directories: the base of `*at` calls).
    path: String,
    /// The `O_*` flags it was opened with (`F_GETFL`).
    flags: i32,
}

pub struct Session {
    volume: Volume,
    files: Mutex<HashMap<i32, Arc<OpenFile>>>,
    next_fd: AtomicI32,
    uid: u32,
    gid: u32,
}

/// Split a volume path into its parent directory's path and the last name.
fn split(path: &str) -> Result<(&str, &str)> {
    let trimmed = path.trim_end_matches('/');
    let (parent, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if name.is_empty() || name == "." || name == ".." {
        return Err(Error::InvalidArgument(format!("{path:?} does not end in a name")));
    }
    Ok((parent, name))
}

impl Session {
    /// Open the volume on these devices. A volume another process (or a mount) holds
    /// fails with `InUse` (EBUSY).
    pub fn open(fast: &Path, ssd: &Path) -> Result<Session> {
        Session::open_with(fast, ssd, VolumeOptions::default())
    }

    /// [`Session::open`] with options (the shim's `byte` switches).
    pub fn open_with(fast: &Path, ssd: &Path, options: VolumeOptions) -> Result<Session> {
        let volume = open_paths(fast, ssd, options, None)?;
        let profile = volume.superblock().profile;
        if profile.personality() == Personality::Block {
            volume.close()?;
            return Err(Error::WrongPersonality(format!(
                "the volume is a {} block volume, not a file system: open it with alignfs_block_open",
                profile.name()
            )));
        }
        let (uid, gid) = process_ids();
        Ok(Session { volume, files: Mutex::new(HashMap::new()), next_fd: AtomicI32::new(FD_BASE), uid, gid })
    }

    /// Close every descriptor still open and the volume (flush, checkpoint).
    pub fn close(self) -> Result<()> {
        for (_, file) in self.files.lock().drain() {
            let _ = self.volume.release_handle(file.ino);
        }
        self.volume.close()
    }

    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    fn file(&self, fd: i32) -> Result<Arc<OpenFile>> {
        self.files.lock().get(&fd).cloned().ok_or(Error::BadDescriptor)
    }

    fn parent_and_name<'p>(&self, path: &'p str) -> Result<(Ino, &'p str)> {
        let (parent, name) = split(path)?;
        Ok((self.volume.resolve(parent)?, name))
    }

    /// `open(2)`: `flags` are the libc `O_*` flags, `mode` the permissions of a new file.
    pub fn open_file(&self, path: &str, flags: i32, mode: u32) -> Result<i32> {
        let access = flags & libc::O_ACCMODE;
        let (readable, writable) = (access != libc::O_WRONLY, access != libc::O_RDONLY);
        let found = match self.volume.resolve(path) {
            Ok(_) if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 => return Err(Error::Exists),
            Ok(ino) => Some(ino),
            Err(Error::NotFound) if flags & libc::O_CREAT != 0 => None,
            Err(e) => return Err(e),
        };
        let ino = match found {
            Some(ino) => ino,
            None => {
                let (parent, name) = self.parent_and_name(path)?;
                match self.volume.create_file(parent, name.as_bytes(), (mode & 0o7777) as u16, self.uid, self.gid) {
                    Ok(attr) => attr.ino,
                    // Another thread created it first: open that one (unless O_EXCL).
                    Err(Error::Exists) if flags & libc::O_EXCL == 0 => self.volume.lookup(parent, name.as_bytes())?.ino,
                    Err(e) => return Err(e),
                }
            }
        };
        let attr = self.volume.getattr(ino)?;
        if flags & libc::O_DIRECTORY != 0 && attr.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        match attr.kind {
            FileKind::Dir if writable => return Err(Error::IsDir),
            FileKind::Dir | FileKind::File => {}
            _ => return Err(Error::Unsupported("only regular files and directories open through the C API".into())),
        }
        self.volume.open_handle(ino)?;
        if flags & libc::O_TRUNC != 0 && writable && attr.kind == FileKind::File && attr.size > 0 {
            if let Err(e) = self.volume.truncate(ino, 0) {
                let _ = self.volume.release_handle(ino);
                return Err(e);
            }
        }
        let fd = match self.new_descriptor() {
            Ok(fd) => fd,
            Err(e) => {
                let _ = self.volume.release_handle(ino);
                return Err(e);
            }
        };
        let file = OpenFile {
            ino,
            kind: attr.kind,
            readable,
            writable,
            append: flags & libc::O_APPEND != 0,
            position: Mutex::new(0),
            path: path.to_string(),
            flags,
        };
        self.files.lock().insert(fd, Arc::new(file));
        Ok(fd)
    }

    pub fn close_fd(&self, fd: i32) -> Result<()> {
        let file = self.files.lock().remove(&fd).ok_or(Error::BadDescriptor)?;
        self.volume.release_handle(file.ino)
    }

    /// A second descriptor for the same open file description (`dup`): it shares the
    /// position and flags.
    pub fn dup(&self, fd: i32) -> Result<i32> {
        let file = self.file(fd)?;
        let new = self.new_descriptor()?;
        self.volume.open_handle(file.ino)?;
        self.files.lock().insert(new, file);
        Ok(new)
    }

    /// The next unused descriptor number; once the range past `FD_BASE` is used up, an
    /// error rather than a number that could collide with the kernel's.
    fn new_descriptor(&self) -> Result<i32> {
        let fd = self.next_fd.fetch_add(1, Ordering::Relaxed);
        if fd < FD_BASE {
            return Err(Error::TooLarge("out of descriptor numbers".into()));
        }
        Ok(fd)
    }

    fn readable_file(&self, fd: i32) -> Result<Arc<OpenFile>> {
        let file = self.file(fd)?;
        match (file.readable, file.kind) {
            (false, _) => Err(Error::BadDescriptor),
            (_, FileKind::Dir) => Err(Error::IsDir),
            _ => Ok(file),
        }
    }

    fn writable_file(&self, fd: i32) -> Result<Arc<OpenFile>> {
        let file = self.file(fd)?;
        if !file.writable {
            return Err(Error::BadDescriptor);
        }
        Ok(file)
    }

    pub fn pread(&self, fd: i32, buf: &mut [u8], offset: u64) -> Result<usize> {
        let file = self.readable_file(fd)?;
        self.volume.read(file.ino, offset, buf)
    }

    /// `pwrite(2)`; as on Linux, a descriptor opened with `O_APPEND` writes at the end.
    pub fn pwrite(&self, fd: i32, data: &[u8], offset: u64) -> Result<usize> {
        let file = self.writable_file(fd)?;
        let offset = if file.append { self.volume.getattr(file.ino)?.size } else { offset };
        self.write_at(&file, data, offset)
    }

    fn write_at(&self, file: &OpenFile, data: &[u8], offset: u64) -> Result<usize> {
        let mut done = 0;
        for piece in data.chunks(WRITE_PIECE) {
            match self.volume.write(file.ino, offset + done as u64, piece) {
                Ok(n) => done += n,
                // Report what was written before a later piece failed, as write(2) does.
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    pub fn read(&self, fd: i32, buf: &mut [u8]) -> Result<usize> {
        let file = self.readable_file(fd)?;
        let mut position = file.position.lock();
        let n = self.volume.read(file.ino, *position, buf)?;
        *position += n as u64;
        Ok(n)
    }

    pub fn write(&self, fd: i32, data: &[u8]) -> Result<usize> {
        let file = self.writable_file(fd)?;
        let mut position = file.position.lock();
        if file.append {
            *position = self.volume.getattr(file.ino)?.size;
        }
        let n = self.write_at(&file, data, *position)?;
        *position += n as u64;
        Ok(n)
    }

    /// `lseek(2)` with `SEEK_SET`, `SEEK_CUR`, `SEEK_END`.
    pub fn lseek(&self, fd: i32, offset: i64, whence: i32) -> Result<u64> {
        let file = self.file(fd)?;
        let mut position = file.position.lock();
        let base = match whence {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => *position as i64,
            libc::SEEK_END => self.volume.getattr(file.ino)?.size as i64,
            _ => return Err(Error::InvalidArgument(format!("lseek whence {whence}"))),
        };
        let target = base.checked_add(offset).filter(|&t| t >= 0).ok_or_else(|| Error::InvalidArgument("lseek before the start".into()))?;
        *position = target as u64;
        Ok(*position)
    }

    pub fn fsync(&self, fd: i32) -> Result<()> {
        self.volume.fsync(self.file(fd)?.ino)
    }

    pub fn ftruncate(&self, fd: i32, size: u64) -> Result<()> {
        let file = self.writable_file(fd)?;
        self.volume.truncate(file.ino, size)
    }

    /// `fallocate(2)` modes 0, `FALLOC_FL_KEEP_SIZE` and punch hole (with keep size).
    pub fn fallocate(&self, fd: i32, mode: i32, offset: u64, len: u64) -> Result<()> {
        let file = self.writable_file(fd)?;
        let mode = match mode {
            0 => FallocateMode::Allocate { keep_size: false },
            libc::FALLOC_FL_KEEP_SIZE => FallocateMode::Allocate { keep_size: true },
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => FallocateMode::PunchHole,
            m => return Err(Error::Unsupported(format!("fallocate mode {m:#x}"))),
        };
        self.volume.fallocate(file.ino, offset, len, mode)
    }

    /// `fchmod`/`fchown`-style attribute changes on an open file.
    pub fn set_attr_fd(&self, fd: i32, request: &SetAttrRequest) -> Result<()> {
        self.volume.setattr(self.file(fd)?.ino, request).map(drop)
    }

    /// `chmod`/`chown`-style attribute changes by path.
    pub fn set_attr(&self, path: &str, request: &SetAttrRequest) -> Result<()> {
        self.volume.setattr(self.volume.resolve(path)?, request).map(drop)
    }

    /// The `O_*` flags `fd` was opened with.
    pub fn open_flags(&self, fd: i32) -> Result<i32> {
        Ok(self.file(fd)?.flags)
    }

    /// The volume path an open directory descriptor names (for `*at` calls).
    pub fn dir_path(&self, fd: i32) -> Result<String> {
        let file = self.file(fd)?;
        if file.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(file.path.clone())
    }

    pub fn fstat(&self, fd: i32) -> Result<Attr> {
        self.volume.getattr(self.file(fd)?.ino)
    }

    pub fn stat(&self, path: &str) -> Result<Attr> {
        self.volume.getattr(self.volume.resolve(path)?)
    }

    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        self.volume.truncate(self.volume.resolve(path)?, size)
    }

    pub fn unlink(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent_and_name(path)?;
        self.volume.unlink(parent, name.as_bytes())
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (from_parent, from_name) = self.parent_and_name(from)?;
        let (to_parent, to_name) = self.parent_and_name(to)?;
        self.volume.rename(from_parent, from_name.as_bytes(), to_parent, to_name.as_bytes(), RenameFlags::default())
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        // `mkdir -p` and fio create each ancestor and expect EEXIST for the root too.
        if split(path).is_err() && self.volume.resolve(path).is_ok() {
            return Err(Error::Exists);
        }
        let (parent, name) = self.parent_and_name(path)?;
        self.volume.mkdir(parent, name.as_bytes(), (mode & 0o7777) as u16, self.uid, self.gid).map(drop)
    }

    pub fn rmdir(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent_and_name(path)?;
        self.volume.rmdir(parent, name.as_bytes())
    }

    /// A directory's entries, `.` and `..` first.
    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let dir = self.volume.resolve(path)?;
        let mut entries = vec![
            DirEntry { name: b".".to_vec(), ino: dir, kind: FileKind::Dir },
            DirEntry { name: b"..".to_vec(), ino: self.volume.parent(dir)?, kind: FileKind::Dir },
        ];
        entries.extend(self.volume.readdir(dir)?);
        Ok(entries)
    }
}

fn process_ids() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and have no preconditions.
    unsafe { (libc::getuid(), libc::getgid()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_parent_and_name() {
        assert_eq!(split("/a/b").unwrap(), ("/a", "b"));
        assert_eq!(split("/a/b/").unwrap(), ("/a", "b"));
        assert_eq!(split("b").unwrap(), ("", "b"));
        assert_eq!(split("/b").unwrap(), ("", "b"));
        assert!(split("/").is_err());
        assert!(split("/a/..").is_err());
    }
}
