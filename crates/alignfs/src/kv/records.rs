//! NVStore's metadata as KV records (docs/NVSTORE.md, "Records").
//!
//! Keys hold their integers big-endian, so a keyspace iterates in (object, block, order)
//! order and an object's or a block's records share a prefix that one range delete
//! removes. Values use the little-endian codec of every other on-media structure.
//! Decoding never panics: a record that does not check out is a [`Short`] naming what is
//! wrong, which the store reports with the record's key.

use std::collections::BTreeMap;

use crate::codec::{Decoder, Encoder, Short};
use crate::map::SsdBlock;
use crate::meta::{FileKind, Ino, InodeData, TimeNs, MAX_NAME_BYTES as NAME_MAX, MAX_SYMLINK_BYTES, XATTR_NAME_MAX, XATTR_VALUE_MAX};

pub const BLOCK_KEY_BYTES: usize = 16;
pub const BLOCK_VALUE_BYTES: usize = 13;
pub const FRAGMENT_KEY_BYTES: usize = 20;
pub const ONODE_BYTES: usize = 12;

/// `on` bit 0: the block has fragments, laid over it in order.
const ON_FRAGMENTS: u8 = 1;
/// `on` bit 1: the block is shared by clones.
const ON_SHARED: u8 = 2;

fn exact<const N: usize>(bytes: &[u8], what: &str) -> Result<[u8; N], Short> {
    bytes.try_into().map_err(|_| Short { at: 0, what: format!("{what} is {} bytes, not {N}", bytes.len()) })
}

fn be_u64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes.try_into().expect("8 bytes"))
}

/// The prefix every record of `object` in a keyspace keyed by object id starts with.
pub fn object_prefix(object: Ino) -> [u8; 8] {
    object.0.to_be_bytes()
}

/// The object a key of a keyspace keyed by object id alone names.
pub fn decode_object_key(key: &[u8]) -> Result<Ino, Short> {
    Ok(Ino(be_u64(&exact::<8>(key, "an object key")?)))
}

/// One block of one object: the flattened block map's key, and the prefix of that
/// block's fragments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub object: Ino,
    pub lblock: u64,
}

impl BlockKey {
    pub fn encode(&self) -> [u8; BLOCK_KEY_BYTES] {
        let mut key = [0u8; BLOCK_KEY_BYTES];
        key[..8].copy_from_slice(&self.object.0.to_be_bytes());
        key[8..].copy_from_slice(&self.lblock.to_be_bytes());
        key
    }

    pub fn decode(key: &[u8]) -> Result<BlockKey, Short> {
        let key: [u8; BLOCK_KEY_BYTES] = exact(key, "a block-map key")?;
        Ok(BlockKey { object: Ino(be_u64(&key[..8])), lblock: be_u64(&key[8..]) })
    }
}

/// Where a block lives: the flattened block map's value (csum, paddr, on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockValue {
    /// CRC32C of the SSD block's bytes (0 when there is no block).
    pub csum: u32,
    /// `None`: the block has fragments only and reads zeros under them.
    pub block: Option<SsdBlock>,
    pub fragments: bool,
    pub shared: bool,
}

impl BlockValue {
    pub fn encode(&self) -> [u8; BLOCK_VALUE_BYTES] {
        let mut value = [0u8; BLOCK_VALUE_BYTES];
        value[..4].copy_from_slice(&self.csum.to_le_bytes());
        value[4..12].copy_from_slice(&self.block.map_or(0, |b| b.0).to_le_bytes());
        value[12] = if self.fragments { ON_FRAGMENTS } else { 0 } | if self.shared { ON_SHARED } else { 0 };
        value
    }

    pub fn decode(value: &[u8]) -> Result<BlockValue, Short> {
        let value: [u8; BLOCK_VALUE_BYTES] = exact(value, "a block-map value")?;
        let mut d = Decoder::new(&value);
        let (csum, paddr, on) = (d.u32()?, d.u64()?, d.u8()?);
        if on & !(ON_FRAGMENTS | ON_SHARED) != 0 {
            return d.fail(format!("unknown `on` bits {on:#x}"));
        }
        let (fragments, shared) = (on & ON_FRAGMENTS != 0, on & ON_SHARED != 0);
        let block = (paddr != 0).then_some(SsdBlock(paddr));
        match block {
            None if shared => d.fail("a shared block without a physical block"),
            None if !fragments => d.fail("neither a physical block nor fragments (a hole has no record)"),
            None if csum != 0 => d.fail("a checksum without a physical block"),
            _ => Ok(BlockValue { csum, block, fragments, shared }),
        }
    }
}

/// One unaligned write's piece of one block; `order` sorts a block's pieces oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FragmentKey {
    pub block: BlockKey,
    pub order: u32,
}

impl FragmentKey {
    pub fn encode(&self) -> [u8; FRAGMENT_KEY_BYTES] {
        let mut key = [0u8; FRAGMENT_KEY_BYTES];
        key[..BLOCK_KEY_BYTES].copy_from_slice(&self.block.encode());
        key[BLOCK_KEY_BYTES..].copy_from_slice(&self.order.to_be_bytes());
        key
    }

    pub fn decode(key: &[u8]) -> Result<FragmentKey, Short> {
        let key: [u8; FRAGMENT_KEY_BYTES] = exact(key, "a fragment key")?;
        let order = u32::from_be_bytes(key[BLOCK_KEY_BYTES..].try_into().expect("4 bytes"));
        Ok(FragmentKey { block: BlockKey::decode(&key[..BLOCK_KEY_BYTES])?, order })
    }
}

/// A fragment's value: the bytes of one block range `inoff..inoff + len` as a write left
/// them. Zeros before and after the written bytes are not stored: `bytes` sit at
/// `inoff + lead`, the rest of the range is zero (a new block's first write zero-fills
/// its page, and those zeros would otherwise cost a block's worth of KV traffic).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FragmentValue {
    pub inoff: u16,
    pub len: u16,
    pub lead: u16,
    pub bytes: Vec<u8>,
}

impl FragmentValue {
    /// The value recording `data` at `inoff`, its leading and trailing zeros trimmed.
    pub fn of(inoff: u16, data: &[u8]) -> FragmentValue {
        let lead = data.iter().position(|&b| b != 0).unwrap_or(data.len());
        let end = data.iter().rposition(|&b| b != 0).map_or(lead, |last| last + 1);
        FragmentValue { inoff, len: data.len() as u16, lead: lead as u16, bytes: data[lead..end].to_vec() }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(6 + self.bytes.len());
        e.u16(self.inoff).u16(self.len).u16(self.lead).raw(&self.bytes);
        e.bytes
    }

    /// A fragment of a `block_bytes` block: a non-empty range inside the block, its bytes
    /// inside the range.
    pub fn decode(value: &[u8], block_bytes: u32) -> Result<FragmentValue, Short> {
        let mut d = Decoder::new(value);
        let (inoff, len, lead) = (d.u16()?, d.u16()?, d.u16()?);
        let bytes = d.take(d.remaining())?;
        if len == 0 || u32::from(inoff) + u32::from(len) > block_bytes {
            return d.fail(format!("{len} bytes at {inoff} do not fit a {block_bytes}-byte block"));
        }
        if usize::from(lead) + bytes.len() > usize::from(len) {
            return d.fail(format!("{} bytes at {lead} overrun the fragment's {len}", bytes.len()));
        }
        Ok(FragmentValue { inoff, len, lead, bytes: bytes.to_vec() })
    }

    /// The block range it covers.
    pub fn range(&self) -> (u32, u32) {
        (u32::from(self.inoff), u32::from(self.inoff) + u32::from(self.len))
    }

    /// Write the fragment's range into `block` (the whole block's bytes).
    pub fn lay_over(&self, block: &mut [u8]) {
        let (start, end) = self.range();
        let range = &mut block[start as usize..end as usize];
        range.fill(0);
        let lead = usize::from(self.lead);
        range[lead..lead + self.bytes.len()].copy_from_slice(&self.bytes);
    }
}

/// The decoupled onode: the record a write touches only when it changes the size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Onode {
    pub size: u64,
    /// No flag is defined yet; a decoder refuses any, so a newer store's flags are never
    /// silently ignored.
    pub flags: u32,
}

impl Onode {
    pub fn encode(&self) -> [u8; ONODE_BYTES] {
        let mut value = [0u8; ONODE_BYTES];
        value[..8].copy_from_slice(&self.size.to_le_bytes());
        value[8..].copy_from_slice(&self.flags.to_le_bytes());
        value
    }

    pub fn decode(value: &[u8]) -> Result<Onode, Short> {
        let value: [u8; ONODE_BYTES] = exact(value, "an onode")?;
        let mut d = Decoder::new(&value);
        let (size, flags) = (d.u64()?, d.u32()?);
        if flags != 0 {
            return d.fail(format!("unknown onode flags {flags:#x}"));
        }
        Ok(Onode { size, flags })
    }
}

/// What namespace operations change of an object: everything but its size and blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrRecord {
    pub kind: FileKind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub atime: TimeNs,
    pub mtime: TimeNs,
    pub ctime: TimeNs,
    /// The parent directory (directories only).
    pub parent: Ino,
    /// A symbolic link's target.
    pub target: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl AttrRecord {
    /// The record of an object's attributes as they are in memory.
    pub fn of(data: &InodeData) -> AttrRecord {
        let a = &data.attr;
        AttrRecord {
            kind: a.kind,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            parent: data.parent,
            target: data.target.clone(),
            xattrs: data.xattrs.clone(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u8(self.kind as u8).u16(self.perm).u32(self.uid).u32(self.gid).u32(self.nlink);
        e.i64(self.atime).i64(self.mtime).i64(self.ctime).u64(self.parent.0).blob(&self.target);
        e.u64(self.xattrs.len() as u64);
        for (name, value) in &self.xattrs {
            e.blob(name).blob(value);
        }
        e.bytes
    }

    pub fn decode(value: &[u8]) -> Result<AttrRecord, Short> {
        let mut d = Decoder::new(value);
        let code = d.u8()?;
        let Some(kind) = FileKind::from_code(code) else { return d.fail(format!("unknown file kind {code}")) };
        let (perm, uid, gid, nlink) = (d.u16()?, d.u32()?, d.u32()?, d.u32()?);
        let (atime, mtime, ctime, parent) = (d.i64()?, d.i64()?, d.i64()?, Ino(d.u64()?));
        let target = d.blob(MAX_SYMLINK_BYTES)?.to_vec();
        let count = d.count(8)?;
        let mut xattrs = BTreeMap::new();
        for _ in 0..count {
            let name = d.blob(XATTR_NAME_MAX)?.to_vec();
            let value = d.blob(XATTR_VALUE_MAX)?.to_vec();
            if name.is_empty() || xattrs.insert(name, value).is_some() {
                return d.fail("an empty or repeated extended attribute name");
            }
        }
        if d.remaining() != 0 {
            return d.fail(format!("{} bytes after the record", d.remaining()));
        }
        Ok(AttrRecord { kind, perm, uid, gid, nlink, atime, mtime, ctime, parent, target, xattrs })
    }
}

/// A name in a directory: the name map's key (parent id, name); its value is the object id.
pub fn encode_name_key(parent: Ino, name: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + name.len());
    key.extend_from_slice(&parent.0.to_be_bytes());
    key.extend_from_slice(name);
    key
}

pub fn decode_name_key(key: &[u8]) -> Result<(Ino, &[u8]), Short> {
    if key.len() < 9 || key.len() > 8 + NAME_MAX {
        return Err(Short { at: 0, what: format!("a name key of {} bytes (a name takes 1 to {NAME_MAX})", key.len()) });
    }
    Ok((Ino(be_u64(&key[..8])), &key[8..]))
}

pub fn encode_object_id(object: Ino) -> [u8; 8] {
    object.0.to_le_bytes()
}

pub fn decode_object_id(value: &[u8]) -> Result<Ino, Short> {
    Ok(Ino(u64::from_le_bytes(exact(value, "an object id")?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_as_their_numbers() {
        let a = BlockKey { object: Ino(1), lblock: 0xff };
        let b = BlockKey { object: Ino(1), lblock: 0x100 };
        let c = BlockKey { object: Ino(2), lblock: 0 };
        assert!(a.encode() < b.encode() && b.encode() < c.encode());
        let f = |order| FragmentKey { block: b, order }.encode();
        assert!(f(255) < f(256));
        assert!(f(0).starts_with(&b.encode()) && b.encode().starts_with(&object_prefix(Ino(1))));
        assert!(encode_name_key(Ino(2), b"a") > encode_name_key(Ino(1), b"zzz"));
    }

    #[test]
    fn records_round_trip() {
        let key = FragmentKey { block: BlockKey { object: Ino(7), lblock: 9 }, order: 3 };
        assert_eq!(FragmentKey::decode(&key.encode()).unwrap(), key);
        for value in [
            BlockValue { csum: 0xdead_beef, block: Some(SsdBlock(42)), fragments: false, shared: false },
            BlockValue { csum: 1, block: Some(SsdBlock(42)), fragments: true, shared: true },
            BlockValue { csum: 0, block: None, fragments: true, shared: false },
        ] {
            assert_eq!(BlockValue::decode(&value.encode()).unwrap(), value);
        }
        let onode = Onode { size: 1 << 40, flags: 0 };
        assert_eq!(Onode::decode(&onode.encode()).unwrap(), onode);
        let attrs = AttrRecord {
            kind: FileKind::File,
            perm: 0o640,
            uid: 1,
            gid: 2,
            nlink: 1,
            atime: 3,
            mtime: 4,
            ctime: -5,
            parent: Ino::ROOT,
            target: Vec::new(),
            xattrs: [(b"user.etag".to_vec(), b"abc".to_vec())].into(),
        };
        assert_eq!(AttrRecord::decode(&attrs.encode()).unwrap(), attrs);
        let fragment = FragmentValue::of(4000, &[0, 0, 1, 2, 0, 3, 0]);
        assert_eq!((fragment.lead, fragment.len, fragment.bytes.as_slice()), (2, 7, &[1, 2, 0, 3][..]));
        assert_eq!(FragmentValue::decode(&fragment.encode(), 4096).unwrap(), fragment);
        let mut block = vec![9u8; 4096];
        fragment.lay_over(&mut block);
        assert_eq!(&block[3999..4008], &[9, 0, 0, 1, 2, 0, 3, 0, 9]);
        let zeros = FragmentValue::of(0, &[0; 4096]);
        assert_eq!((zeros.len, zeros.bytes.len(), zeros.encode().len()), (4096, 0, 6));
        assert_eq!(decode_name_key(&encode_name_key(Ino(5), b"obj")).unwrap(), (Ino(5), &b"obj"[..]));
        assert_eq!(decode_object_id(&encode_object_id(Ino(77))).unwrap(), Ino(77));
    }

    #[test]
    fn bad_records_are_errors() {
        assert!(BlockKey::decode(&[0; 15]).is_err());
        assert!(FragmentKey::decode(&[0; 21]).is_err());
        let mut value = BlockValue { csum: 0, block: Some(SsdBlock(1)), fragments: false, shared: false }.encode();
        value[12] = 4;
        assert!(BlockValue::decode(&value).unwrap_err().what.contains("unknown"));
        let hole = BlockValue { csum: 0, block: None, fragments: false, shared: false }.encode();
        assert!(BlockValue::decode(&hole).unwrap_err().what.contains("hole"));
        let shared_nothing = BlockValue { csum: 0, block: None, fragments: true, shared: true }.encode();
        assert!(BlockValue::decode(&shared_nothing).is_err());
        assert!(FragmentValue::decode(&FragmentValue::of(4095, &[1; 2]).encode(), 4096).is_err());
        assert!(FragmentValue::decode(&FragmentValue::of(0, &[]).encode(), 4096).is_err());
        let overrun = FragmentValue { inoff: 0, len: 2, lead: 1, bytes: vec![1, 1] };
        assert!(FragmentValue::decode(&overrun.encode(), 4096).unwrap_err().what.contains("overrun"));
        assert!(FragmentValue::decode(&[1], 4096).is_err());
        assert!(Onode::decode(&Onode { size: 1, flags: 1 }.encode()).is_err());
        assert!(decode_name_key(&Ino(1).0.to_be_bytes()).is_err());
        let mut attrs = AttrRecord::decode(
            &AttrRecord {
                kind: FileKind::Dir,
                perm: 0o755,
                uid: 0,
                gid: 0,
                nlink: 2,
                atime: 0,
                mtime: 0,
                ctime: 0,
                parent: Ino::ROOT,
                target: Vec::new(),
                xattrs: BTreeMap::new(),
            }
            .encode(),
        )
        .unwrap()
        .encode();
        attrs[0] = 99;
        assert!(AttrRecord::decode(&attrs).unwrap_err().what.contains("kind"));
    }

    /// Whatever the bytes, decoding returns, never panics.
    #[test]
    fn decoders_take_any_bytes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(20);
        for _ in 0..20_000 {
            let len = rng.random_range(0..64);
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let _ = BlockKey::decode(&bytes);
            let _ = BlockValue::decode(&bytes);
            let _ = FragmentKey::decode(&bytes);
            let _ = FragmentValue::decode(&bytes, 4096);
            let _ = Onode::decode(&bytes);
            let _ = AttrRecord::decode(&bytes);
            let _ = decode_name_key(&bytes);
            let _ = decode_object_id(&bytes);
            let _ = decode_object_key(&bytes);
        }
    }
}
