//! The object-store personality: buckets of named objects, written at any offset, read,
//! truncated, listed in name order by prefix, removed, cloned without copying data, and
//! changed several at a time in transactions that a crash keeps whole or drops whole.
//!
//! A bucket is a directory of the engine's namespace and an object a file in it. A new
//! object's bytes go to a *staged* object (a file under a directory that opening the
//! store empties), which a transaction then publishes under its name, together with its
//! attributes and any removals, in one metadata record.
//!
//! Object names are UTF-8 without NUL, like S3 keys, and may hold `/`. They are stored
//! as directory entries under an encoding that keeps their byte order (so a listing is a
//! range of the directory): `/` becomes the two bytes `. 0xFF` (0xFF never occurs in
//! UTF-8), every other byte stays. An encoded name holds at most 255 bytes, so a name
//! of 255 bytes has no `/`, and each `/` costs one byte more; `.` and `..` are refused.
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
//! store.create_bucket(b"photos").unwrap();
//! let photos = store.bucket(b"photos").unwrap();
//! photos.put(b"2026/june.jpg", b"jpeg bytes").unwrap();
//! photos.clone_object(&photos, b"2026/june.jpg", b"backup/june.jpg").unwrap();
//! assert_eq!(photos.get(b"backup/june.jpg").unwrap(), b"jpeg bytes");
//!
//! // Two objects replaced and one removed, all or nothing.
//! let (a, b) = (store.stage().unwrap(), store.stage().unwrap());
//! a.write(0, b"new a").unwrap();
//! b.write(0, b"new b").unwrap();
//! let mut transaction = store.transaction();
//! transaction.publish(a, &photos, b"a").unwrap();
//! transaction.publish(b, &photos, b"b").unwrap();
//! transaction.remove(&photos, b"backup/june.jpg").unwrap();
//! transaction.commit().unwrap();
//!
//! let names: Vec<Vec<u8>> = photos.list(b"", None, usize::MAX).unwrap().into_iter().map(|o| o.name).collect();
//! assert_eq!(names, [b"2026/june.jpg".to_vec(), b"a".to_vec(), b"b".to_vec()]);
//! drop(photos);
//! store.close().unwrap();
//! ```

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result, TransactionProblem};
use crate::layout::Superblock;
use crate::meta::{FileKind, Ino};
use crate::volume::{Devices, FormatOptions, NamespaceChange, Volume, VolumeOptions, MAX_CHANGES, MAX_NAME_BYTES};

/// The directory holding the buckets, and the one holding staged objects.
const BUCKETS: &[u8] = b"buckets";
const STAGING: &[u8] = b"staging";

/// What `stat` and `list` say of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub name: Vec<u8>,
    pub size: u64,
    pub mtime_ns: i64,
}

/// What `buckets` says of a bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketInfo {
    pub name: Vec<u8>,
    pub created_ns: i64,
}

pub struct ObjectStore {
    volume: Volume,
    buckets: Ino,
    staging: Ino,
    next_staged: AtomicU64,
}

impl ObjectStore {
    pub fn format(devices: &Devices, options: &FormatOptions) -> Result<Superblock> {
        let superblock = Volume::format(devices, options)?;
        let volume = Volume::open(devices.clone(), VolumeOptions { background: false, ..VolumeOptions::default() })?;
        volume.mkdir(Ino::ROOT, BUCKETS, 0o700, 0, 0)?;
        volume.mkdir(Ino::ROOT, STAGING, 0o700, 0, 0)?;
        volume.close()?;
        Ok(superblock)
    }

    /// Open the store. Staged objects a crash left unpublished are dropped.
    pub fn open(devices: Devices, options: VolumeOptions) -> Result<ObjectStore> {
        let read_only = options.read_only;
        let volume = Volume::open(devices, options)?;
        let dir = |name: &[u8]| {
            volume.lookup(Ino::ROOT, name).map(|a| a.ino).map_err(|e| match e {
                Error::NotFound => Error::WrongPersonality("the volume holds no object store (format it with ObjectStore::format)".into()),
                other => other,
            })
        };
        let (buckets, staging) = (dir(BUCKETS)?, dir(STAGING)?);
        if !read_only {
            for entry in volume.readdir(staging)? {
                volume.unlink(staging, &entry.name)?;
            }
            // Emptied at every open: a staged object's commits need no sync of their own.
            volume.set_scratch_dir(staging)?;
        }
        Ok(ObjectStore { volume, buckets, staging, next_staged: AtomicU64::new(0) })
    }

    /// A new, empty bucket; `Exists` if the name is taken. Bucket names follow the rules
    /// of file names (1–255 bytes, no `/` or NUL, not `.` or `..`).
    pub fn create_bucket(&self, bucket: &[u8]) -> Result<()> {
        check_bucket_name(bucket)?;
        self.volume.mkdir(self.buckets, bucket, 0o700, 0, 0).map(drop)
    }

    /// Remove an empty bucket: `NotEmpty` while it holds objects.
    pub fn remove_bucket(&self, bucket: &[u8]) -> Result<()> {
        check_bucket_name(bucket)?;
        self.volume.rmdir(self.buckets, bucket)
    }

    /// Every bucket, in byte order of their names.
    pub fn buckets(&self) -> Result<Vec<BucketInfo>> {
        let mut out = Vec::new();
        for entry in self.volume.readdir(self.buckets)? {
            let attr = self.volume.getattr(entry.ino)?;
            out.push(BucketInfo { name: entry.name, created_ns: attr.ctime });
        }
        Ok(out)
    }

    /// The bucket named `bucket`; `NotFound` if there is none.
    pub fn bucket(&self, bucket: &[u8]) -> Result<Bucket<'_>> {
        check_bucket_name(bucket)?;
        let attr = self.volume.lookup(self.buckets, bucket)?;
        if attr.kind != FileKind::Dir {
            return Err(Error::NotFound);
        }
        Ok(Bucket { store: self, ino: attr.ino, name: bucket.to_vec() })
    }

    /// A new, empty object that no name shows yet; a transaction publishes it. Dropped
    /// unpublished, it is removed (and a crash removes it at the next open).
    pub fn stage(&self) -> Result<Staged<'_>> {
        let name = format!("{}", self.next_staged.fetch_add(1, Ordering::Relaxed)).into_bytes();
        let ino = self.volume.create_file(self.staging, &name, 0o600, 0, 0)?.ino;
        Ok(Staged { store: self, name, ino, attribute: None, published: false })
    }

    /// An empty transaction; nothing changes until [`Transaction::commit`].
    pub fn transaction(&self) -> Transaction<'_> {
        Transaction { store: self, changes: Vec::new(), staged: Vec::new() }
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

/// An object pinned by [`Bucket::open`], with what it was when pinned.
#[derive(Debug)]
pub struct ObjectHandle {
    ino: Ino,
    pub size: u64,
    pub mtime_ns: i64,
    pub attribute: Option<Vec<u8>>,
}

impl ObjectStore {
    /// Read the pinned object into `buf` from `offset`; returns the bytes read.
    pub fn read_pinned(&self, handle: &ObjectHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.volume.read(handle.ino, offset, buf)
    }

    /// Unpin an object; a version no name shows any more goes away with its last pin.
    pub fn release(&self, handle: ObjectHandle) -> Result<()> {
        self.volume.release_handle(handle.ino)
    }
}

fn check_bucket_name(bucket: &[u8]) -> Result<()> {
    if bucket.is_empty()
        || bucket.len() > MAX_NAME_BYTES
        || bucket.contains(&b'/')
        || bucket.contains(&0)
        || bucket == b"."
        || bucket == b".."
    {
        return Err(Error::InvalidName(format!(
            "bucket name {:?} must be 1-255 bytes without '/' or NUL, and not . or ..",
            String::from_utf8_lossy(bucket)
        )));
    }
    Ok(())
}

/// The bytes that stand for `/` in a directory entry: they sort between `.` followed by
/// any UTF-8 byte and `0`, as `/` does.
const SLASH: [u8; 2] = [b'.', 0xFF];

/// The directory entry of an object name (see the module's comment).
pub fn encode_name(name: &[u8]) -> Result<Vec<u8>> {
    let invalid = |why: &str| Error::InvalidName(format!("object name {:?} {why}", String::from_utf8_lossy(name)));
    if name.is_empty() {
        return Err(invalid("is empty"));
    }
    if std::str::from_utf8(name).is_err() {
        return Err(invalid("is not UTF-8"));
    }
    if name.contains(&0) {
        return Err(invalid("holds a NUL byte"));
    }
    if name == b"." || name == b".." {
        return Err(invalid("is reserved"));
    }
    let entry = encode_for_seek(name);
    if entry.len() > MAX_NAME_BYTES {
        return Err(Error::NameTooLong);
    }
    Ok(entry)
}

/// The object name of a directory entry [`encode_name`] made.
pub fn decode_name(entry: &[u8]) -> Vec<u8> {
    let mut name = Vec::with_capacity(entry.len());
    let mut i = 0;
    while i < entry.len() {
        if entry[i..].starts_with(&SLASH) {
            name.push(b'/');
            i += 2;
        } else {
            name.push(entry[i]);
            i += 1;
        }
    }
    name
}

/// A bucket of an open store. A bucket removed meanwhile makes every call fail with
/// `NotFound`.
pub struct Bucket<'s> {
    store: &'s ObjectStore,
    ino: Ino,
    name: Vec<u8>,
}

impl<'s> Bucket<'s> {
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    fn volume(&self) -> &'s Volume {
        &self.store.volume
    }

    fn object(&self, name: &[u8]) -> Result<Ino> {
        Ok(self.volume().lookup(self.ino, &encode_name(name)?)?.ino)
    }

    /// A new, empty object; `Exists` if the name is taken.
    pub fn create(&self, name: &[u8]) -> Result<()> {
        self.volume().create_file(self.ino, &encode_name(name)?, 0o600, 0, 0).map(drop)
    }

    /// Replace (or create) the whole object: written staged, then published, so readers
    /// and a crash see the old object or the new one.
    pub fn put(&self, name: &[u8], data: &[u8]) -> Result<()> {
        let staged = self.store.stage()?;
        staged.write(0, data)?;
        let mut transaction = self.store.transaction();
        transaction.publish(staged, self, name)?;
        transaction.commit()
    }

    /// Write `data` at `offset` of an existing object, growing it as needed.
    pub fn write(&self, name: &[u8], offset: u64, data: &[u8]) -> Result<()> {
        self.volume().write(self.object(name)?, offset, data).map(drop)
    }

    /// Read into `buf` from `offset`; returns the bytes read (short at the end).
    pub fn read(&self, name: &[u8], offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.volume().read(self.object(name)?, offset, buf)
    }

    /// The whole object.
    pub fn get(&self, name: &[u8]) -> Result<Vec<u8>> {
        let ino = self.object(name)?;
        let size = self.volume().getattr(ino)?.size;
        let mut out = vec![0u8; usize::try_from(size).map_err(|_| Error::TooLarge(format!("object of {size} bytes")))?];
        let n = self.volume().read(ino, 0, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    pub fn stat(&self, name: &[u8]) -> Result<ObjectInfo> {
        let attr = self.volume().getattr(self.object(name)?)?;
        Ok(ObjectInfo { name: name.to_vec(), size: attr.size, mtime_ns: attr.mtime })
    }

    /// Pin the object as it is now: reads through the handle see this version even if a
    /// put replaces or a removal drops the name meanwhile. Give it back with
    /// [`ObjectStore::release`].
    pub fn open(&self, name: &[u8]) -> Result<ObjectHandle> {
        let ino = self.object(name)?;
        let attr = self.volume().open_handle(ino)?;
        let attribute = match self.attribute_of(ino) {
            Ok(attribute) => attribute,
            Err(e) => {
                let _ = self.volume().release_handle(ino);
                return Err(e);
            }
        };
        Ok(ObjectHandle { ino, size: attr.size, mtime_ns: attr.mtime, attribute })
    }

    /// The attribute a transaction published with the object, if any.
    pub fn attribute(&self, name: &[u8]) -> Result<Option<Vec<u8>>> {
        self.attribute_of(self.object(name)?)
    }

    fn attribute_of(&self, ino: Ino) -> Result<Option<Vec<u8>>> {
        match self.volume().getxattr(ino, ATTRIBUTE) {
            Ok(value) => Ok(Some(value)),
            Err(Error::NoAttribute) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn truncate(&self, name: &[u8], size: u64) -> Result<()> {
        self.volume().truncate(self.object(name)?, size)
    }

    pub fn remove(&self, name: &[u8]) -> Result<()> {
        self.volume().unlink(self.ino, &encode_name(name)?)
    }

    /// Up to `limit` objects whose names start with `prefix`, after `after` (if given),
    /// in byte order of their names.
    pub fn list(&self, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<ObjectInfo>> {
        // Entries sort as the names they encode, so the objects wanted are one range of
        // the directory, from the later of `prefix` and just after `after`, read a page
        // at a time.
        let (mut cursor, mut inclusive) = match after {
            Some(after) if after >= prefix => (encode_for_seek(after), false),
            _ => (encode_for_seek(prefix), true),
        };
        let mut out = Vec::new();
        while out.len() < limit {
            let start = if inclusive { Bound::Included(cursor.as_slice()) } else { Bound::Excluded(cursor.as_slice()) };
            let page = self.volume().readdir_from(self.ino, start, 256)?;
            let Some(last) = page.last() else { break };
            let next_cursor = last.name.clone();
            for entry in page {
                let name = decode_name(&entry.name);
                if !name.starts_with(prefix) {
                    return Ok(out);
                }
                let attr = self.volume().getattr(entry.ino)?;
                out.push(ObjectInfo { name, size: attr.size, mtime_ns: attr.mtime });
                if out.len() == limit {
                    break;
                }
            }
            (cursor, inclusive) = (next_cursor, false);
        }
        Ok(out)
    }

    /// Make `dst` (replaced or created) a copy of `source`'s object `src` that shares its
    /// blocks. Made staged and published, so readers and a crash see the old `dst` or the
    /// whole copy.
    pub fn clone_object(&self, source: &Bucket<'_>, src: &[u8], dst: &[u8]) -> Result<()> {
        let staged = self.store.stage()?;
        staged.clone_from(source, src)?;
        let mut transaction = self.store.transaction();
        transaction.publish(staged, self, dst)?;
        transaction.commit()
    }

    /// Make every acknowledged write to the object durable.
    pub fn sync(&self, name: &[u8]) -> Result<()> {
        self.volume().fsync(self.object(name)?)
    }
}

/// The directory-entry encoding of any bytes, unchecked: what [`encode_name`] stores, and
/// the bound of a listing (a prefix or cursor need not be a valid name).
fn encode_for_seek(name: &[u8]) -> Vec<u8> {
    let mut entry = Vec::with_capacity(name.len() + 8);
    for &byte in name {
        match byte {
            b'/' => entry.extend_from_slice(&SLASH),
            other => entry.push(other),
        }
    }
    entry
}

/// The extended attribute holding what a transaction publishes with an object (for the
/// S3 gateway: its ETag, content type and user metadata).
const ATTRIBUTE: &[u8] = b"user.alignfs.object";

/// An object being filled before a transaction publishes it (see [`ObjectStore::stage`]).
pub struct Staged<'s> {
    store: &'s ObjectStore,
    name: Vec<u8>,
    ino: Ino,
    attribute: Option<Vec<u8>>,
    published: bool,
}

impl Staged<'_> {
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.store.volume.write(self.ino, offset, data).map(drop)
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.store.volume.read(self.ino, offset, buf)
    }

    pub fn size(&self) -> Result<u64> {
        Ok(self.store.volume.getattr(self.ino)?.size)
    }

    /// Make the staged object a copy of `source`'s object `name`, sharing its blocks.
    pub fn clone_from(&self, source: &Bucket<'_>, name: &[u8]) -> Result<()> {
        self.store.volume.clone_file(source.object(name)?, self.ino)
    }

    /// Put `source`'s whole object `name` at `offset` of the staged object, past its
    /// data; returns its size. At a multiple of the block size the object's blocks are
    /// shared, elsewhere copied. (Assembling a multipart upload from its parts.)
    pub fn append_from(&self, source: &Bucket<'_>, name: &[u8], offset: u64) -> Result<u64> {
        let ino = source.object(name)?;
        if offset % self.store.volume.geometry().block() == 0 {
            return self.store.volume.clone_into(ino, self.ino, offset);
        }
        let mut buf = vec![0u8; 8 << 20];
        let mut done = 0u64;
        loop {
            let got = self.store.volume.read(ino, done, &mut buf)?;
            if got == 0 {
                return Ok(done);
            }
            self.store.volume.write(self.ino, offset + done, &buf[..got])?;
            done += got as u64;
        }
    }

    /// The attribute published with the object (replacing the one it may have had).
    pub fn set_attribute(&mut self, value: &[u8]) {
        self.attribute = Some(value.to_vec());
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if !self.published {
            // Best effort: what stays is removed at the next open.
            let _ = self.store.volume.unlink(self.store.staging, &self.name);
        }
    }
}

/// Changes to several objects committed together: a crash keeps all or none of them.
/// Each name may appear once; the changes are checked when added and again, against the
/// store as it is then, at the commit.
pub struct Transaction<'s> {
    store: &'s ObjectStore,
    changes: Vec<NamespaceChange>,
    staged: Vec<Staged<'s>>,
}

impl<'s> Transaction<'s> {
    fn push(&mut self, change: NamespaceChange) -> Result<()> {
        if self.changes.len() >= MAX_CHANGES {
            return Err(Error::BadTransaction(TransactionProblem::TooManyChanges { max: MAX_CHANGES, given: MAX_CHANGES + 1 }));
        }
        self.changes.push(change);
        Ok(())
    }

    /// Publish `staged` as `bucket`'s object `name`, replacing any object of that name.
    pub fn publish(&mut self, staged: Staged<'s>, bucket: &Bucket<'_>, name: &[u8]) -> Result<()> {
        let entry = encode_name(name)?;
        if let Some(value) = &staged.attribute {
            self.push(NamespaceChange::SetXattr { ino: staged.ino, name: ATTRIBUTE.to_vec(), value: value.clone() })?;
        }
        self.push(NamespaceChange::Rename {
            from_parent: self.store.staging,
            from_name: staged.name.clone(),
            to_parent: bucket.ino,
            to_name: entry,
        })?;
        self.staged.push(staged);
        Ok(())
    }

    /// Remove `bucket`'s object `name`; the commit fails with `NotFound` if there is none.
    pub fn remove(&mut self, bucket: &Bucket<'_>, name: &[u8]) -> Result<()> {
        let entry = encode_name(name)?;
        self.push(NamespaceChange::Unlink { parent: bucket.ino, name: entry })
    }

    /// Make the staged objects durable, then apply every change in one metadata record.
    /// On an error nothing changed, and the staged objects are dropped.
    pub fn commit(mut self) -> Result<()> {
        for staged in &self.staged {
            self.store.volume.fsync(staged.ino)?;
        }
        self.store.volume.commit_changes(&self.changes)?;
        for staged in &mut self.staged {
            staged.published = true;
        }
        Ok(())
    }
}
