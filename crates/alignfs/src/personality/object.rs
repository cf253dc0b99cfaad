//! The object-store personality: named objects written at any offset, read, truncated,
//! listed in name order by prefix, removed, and cloned without copying data. Objects are
//! the engine's files in one flat directory; a whole-object put is written under a
//! staging name and renamed into place, so a crash leaves the old object or the new one.
//!
//! Names are 1–255 bytes without `/` or NUL (the namespace's rules); the `nvstore`
//! profile brings its own name map in a KV store.
//!
//! ```
//! use std::sync::Arc;
//! use alignfs::device::{PmemRegion, SimSsd};
//! use alignfs::personality::ObjectStore;
//! use alignfs::{Devices, FormatOptions, VolumeOptions};
//!
//! let devices = Devices::new(Arc::new(PmemRegion::anonymous(4 << 20).unwrap()), Arc::new(SimSsd::new(32 << 20)));
//! ObjectStore::format(&devices, &FormatOptions::default()).unwrap();
//! let store = ObjectStore::open(devices, VolumeOptions::default()).unwrap();
//! store.put(b"photos.2026", b"jpeg bytes").unwrap();
//! store.clone_object(b"photos.2026", b"backup.photos").unwrap();
//! assert_eq!(store.get(b"backup.photos").unwrap(), b"jpeg bytes");
//! let names: Vec<Vec<u8>> = store.list(b"photos.").unwrap().into_iter().map(|o| o.name).collect();
//! assert_eq!(names, [b"photos.2026".to_vec()]);
//! store.close().unwrap();
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::layout::Superblock;
use crate::meta::{FileKind, Ino};
use crate::volume::{Devices, FormatOptions, RenameFlags, Volume, VolumeOptions};

/// The directory holding the objects, and the one holding puts not yet renamed in.
const OBJECTS: &[u8] = b"objects";
const STAGING: &[u8] = b"staging";

/// What `stat` and `list` say of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub name: Vec<u8>,
    pub size: u64,
    pub mtime_ns: i64,
}

pub struct ObjectStore {
    volume: Volume,
    objects: Ino,
    staging: Ino,
    next_staged: AtomicU64,
}

impl ObjectStore {
    pub fn format(devices: &Devices, options: &FormatOptions) -> Result<Superblock> {
        let superblock = Volume::format(devices, options)?;
        let volume = Volume::open(devices.clone(), VolumeOptions { background: false, ..VolumeOptions::default() })?;
        volume.mkdir(Ino::ROOT, OBJECTS, 0o700, 0, 0)?;
        volume.mkdir(Ino::ROOT, STAGING, 0o700, 0, 0)?;
        volume.close()?;
        Ok(superblock)
    }

    /// Open the store. Puts a crash interrupted are dropped.
    pub fn open(devices: Devices, options: VolumeOptions) -> Result<ObjectStore> {
        let read_only = options.read_only;
        let volume = Volume::open(devices, options)?;
        let dir = |name: &[u8]| {
            volume.lookup(Ino::ROOT, name).map(|a| a.ino).map_err(|e| match e {
                Error::NotFound => Error::WrongPersonality("the volume holds no object store (format it with ObjectStore::format)".into()),
                other => other,
            })
        };
        let (objects, staging) = (dir(OBJECTS)?, dir(STAGING)?);
        if !read_only {
            for entry in volume.readdir(staging)? {
                volume.unlink(staging, &entry.name)?;
            }
        }
        Ok(ObjectStore { volume, objects, staging, next_staged: AtomicU64::new(0) })
    }

    fn check_name(name: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > 255 || name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".." {
            return Err(Error::InvalidName(format!(
                "object name {:?} must be 1-255 bytes without '/' or NUL, and not . or ..",
                String::from_utf8_lossy(name)
            )));
        }
        Ok(())
    }

    fn object(&self, name: &[u8]) -> Result<Ino> {
        Self::check_name(name)?;
        Ok(self.volume.lookup(self.objects, name)?.ino)
    }

    /// A new, empty object; `Exists` if the name is taken.
    pub fn create(&self, name: &[u8]) -> Result<()> {
        Self::check_name(name)?;
        self.volume.create_file(self.objects, name, 0o600, 0, 0).map(drop)
    }

    /// Replace (or create) the whole object: written under a staging name, then renamed
    /// into place, so readers and a crash see the old object or the new one.
    pub fn put(&self, name: &[u8], data: &[u8]) -> Result<()> {
        Self::check_name(name)?;
        let (staged, ino) = self.stage()?;
        let written = self.volume.write(ino, 0, data).and_then(|_| self.volume.fsync(ino));
        if let Err(e) = written {
            let _ = self.volume.unlink(self.staging, &staged);
            return Err(e);
        }
        self.volume.rename(self.staging, &staged, self.objects, name, RenameFlags::default())
    }

    /// Write `data` at `offset` of an existing object, growing it as needed.
    pub fn write(&self, name: &[u8], offset: u64, data: &[u8]) -> Result<()> {
        self.volume.write(self.object(name)?, offset, data).map(drop)
    }

    /// Read into `buf` from `offset`; returns the bytes read (short at the end).
    pub fn read(&self, name: &[u8], offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.volume.read(self.object(name)?, offset, buf)
    }

    /// The whole object.
    pub fn get(&self, name: &[u8]) -> Result<Vec<u8>> {
        let ino = self.object(name)?;
        let size = self.volume.getattr(ino)?.size;
        let mut out = vec![0u8; usize::try_from(size).map_err(|_| Error::TooLarge(format!("object of {size} bytes")))?];
        let n = self.volume.read(ino, 0, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    pub fn stat(&self, name: &[u8]) -> Result<ObjectInfo> {
        let attr = self.volume.getattr(self.object(name)?)?;
        Ok(ObjectInfo { name: name.to_vec(), size: attr.size, mtime_ns: attr.mtime })
    }

    pub fn truncate(&self, name: &[u8], size: u64) -> Result<()> {
        self.volume.truncate(self.object(name)?, size)
    }

    pub fn remove(&self, name: &[u8]) -> Result<()> {
        Self::check_name(name)?;
        self.volume.unlink(self.objects, name)
    }

    /// Objects whose names start with `prefix`, in byte order of their names.
    pub fn list(&self, prefix: &[u8]) -> Result<Vec<ObjectInfo>> {
        let mut out = Vec::new();
        for entry in self.volume.readdir(self.objects)? {
            if entry.kind == FileKind::File && entry.name.starts_with(prefix) {
                let attr = self.volume.getattr(entry.ino)?;
                out.push(ObjectInfo { name: entry.name, size: attr.size, mtime_ns: attr.mtime });
            }
        }
        // Directory entries come in byte order of their names already.
        Ok(out)
    }

    /// Make `dst` (replaced or created) a copy of `src` that shares its blocks. Like a
    /// put, the copy is made under a staging name and renamed into place, so readers and
    /// a crash see the old `dst` or the whole copy.
    pub fn clone_object(&self, src: &[u8], dst: &[u8]) -> Result<()> {
        let source = self.object(src)?;
        Self::check_name(dst)?;
        let staged = self.stage()?;
        if let Err(e) = self.volume.clone_file(source, staged.1) {
            let _ = self.volume.unlink(self.staging, &staged.0);
            return Err(e);
        }
        self.volume.rename(self.staging, &staged.0, self.objects, dst, RenameFlags::default())
    }

    /// A new, empty object under a fresh staging name: (name, inode).
    fn stage(&self) -> Result<(Vec<u8>, Ino)> {
        let staged = format!("{}", self.next_staged.fetch_add(1, Ordering::Relaxed)).into_bytes();
        let ino = self.volume.create_file(self.staging, &staged, 0o600, 0, 0)?.ino;
        Ok((staged, ino))
    }

    /// Make every acknowledged write to the object durable.
    pub fn sync(&self, name: &[u8]) -> Result<()> {
        self.volume.fsync(self.object(name)?)
    }

    /// The engine underneath: counters, `check`, `report`.
    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    /// Give up the object view for the engine underneath.
    pub fn into_volume(self) -> Volume {
        self.volume
    }

    pub fn close(self) -> Result<()> {
        self.volume.close()
    }

    /// Stop as a crash of the process would (tests): nothing is flushed or closed.
    pub fn simulate_crash(self) {
        self.volume.simulate_crash();
    }
}
