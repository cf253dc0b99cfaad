//! A/B checkpoint slots holding the whole metadata state.
//!
//! Slot: header (64 B: magic u32 | generation u64 | next_seq u64 | payload_len u64 |
//! payload_crc u32 | header_crc u32 | zero pad) then the payload. A new checkpoint goes to
//! the slot not holding the newest one, payload first, header last, so a crash while
//! writing leaves the newest checkpoint intact.

use std::collections::{BTreeMap, HashSet};

use super::encoding::{decode_attr, decode_entry, encode_attr, encode_entry, xattr_name};
use super::MetaMedium;
use crate::codec::{crc32c, Decoder, Encoder, Short};
use crate::error::{Error, Result};
use crate::map::{BlockEntry, FileMap};
use crate::meta::{FileKind, Ino, Inode, InodeData, MetaState, XATTR_VALUE_MAX};

const MAGIC: u32 = u32::from_le_bytes(*b"ACKP");
const HEADER_BYTES: u64 = 64;

pub struct CheckpointSlots {
    slots: [Box<dyn MetaMedium>; 2],
    /// Absolute offsets of the slots (for error messages).
    offsets: [u64; 2],
    device: String,
    newest: Option<Newest>,
}

/// Where the newest checkpoint is.
#[derive(Clone, Copy)]
struct Newest {
    slot: usize,
    generation: u64,
    /// Its payload bytes: how full a slot is (sizing the fast tier).
    bytes: u64,
}

/// The newest valid checkpoint.
pub struct LoadedCheckpoint {
    pub generation: u64,
    pub next_seq: u64,
    pub state: MetaState,
    pub counters: Vec<u64>,
}

struct SlotHeader {
    generation: u64,
    next_seq: u64,
    len: u64,
    crc: u32,
}

impl CheckpointSlots {
    pub fn new(a: Box<dyn MetaMedium>, b: Box<dyn MetaMedium>, offsets: [u64; 2], device: String) -> CheckpointSlots {
        CheckpointSlots { slots: [a, b], offsets, device, newest: None }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.slots[0].len_bytes() - HEADER_BYTES
    }

    pub fn generation(&self) -> u64 {
        self.newest.map_or(0, |n| n.generation)
    }

    pub fn used_bytes(&self) -> u64 {
        self.newest.map_or(0, |n| n.bytes)
    }

    fn header(&self, slot: usize) -> Option<SlotHeader> {
        let mut raw = [0u8; HEADER_BYTES as usize];
        self.slots[slot].read(0, &mut raw);
        let mut d = Decoder::new(&raw);
        let (magic, generation, next_seq, len, crc) = (d.u32().ok()?, d.u64().ok()?, d.u64().ok()?, d.u64().ok()?, d.u32().ok()?);
        let header_crc = d.u32().ok()?;
        let ok = magic == MAGIC && header_crc == crc32c(&raw[..32]) && len <= self.capacity_bytes();
        ok.then_some(SlotHeader { generation, next_seq, len, crc })
    }

    /// Load the newest checkpoint whose header is intact. Its payload must check out: a
    /// damaged newest checkpoint is an error (falling back to the older slot would replay
    /// a journal that no longer matches it).
    pub fn load(&mut self, pages_per_block: usize, page_bytes: u32) -> Result<LoadedCheckpoint> {
        let headers = [self.header(0), self.header(1)];
        let newest = (0..2).filter(|&s| headers[s].is_some()).max_by_key(|&s| headers[s].as_ref().map(|h| h.generation));
        let Some(slot) = newest else {
            return Err(Error::corrupt("checkpoint", &self.device, self.offsets[0], "neither checkpoint slot has a valid header"));
        };
        let header = headers[slot].as_ref().expect("chosen slot has a header");
        let mut payload = vec![0u8; header.len as usize];
        self.slots[slot].read(HEADER_BYTES, &mut payload);
        let at = self.offsets[slot];
        if crc32c(&payload) != header.crc {
            return Err(Error::corrupt(
                "checkpoint",
                &self.device,
                at,
                format!("generation {} payload checksum mismatch", header.generation),
            ));
        }
        let (state, counters) = decode_state(&payload, pages_per_block, page_bytes)
            .map_err(|s| Error::corrupt("checkpoint", &self.device, at + HEADER_BYTES + s.at as u64, s.what))?;
        self.newest = Some(Newest { slot, generation: header.generation, bytes: header.len });
        Ok(LoadedCheckpoint { generation: header.generation, next_seq: header.next_seq, state, counters })
    }

    /// Write `payload` as the next generation, covering the journal up to `next_seq`.
    pub fn write(&mut self, payload: &[u8], next_seq: u64) -> Result<()> {
        if payload.len() as u64 > self.capacity_bytes() {
            return Err(Error::MetadataFull(format!(
                "checkpoint of {} bytes exceeds its slot of {} bytes; format with a larger fast tier (or, for a profile that keeps its metadata on the SSD, a larger SSD)",
                payload.len(),
                self.capacity_bytes()
            )));
        }
        let (slot, generation) = match self.newest {
            Some(current) => (1 - current.slot, current.generation + 1),
            None => (0, 1),
        };
        self.slots[slot].write_durable(HEADER_BYTES, payload)?;
        let mut e = Encoder::new();
        e.u32(MAGIC).u64(generation).u64(next_seq).u64(payload.len() as u64).u32(crc32c(payload));
        let header_crc = crc32c(&e.bytes);
        e.u32(header_crc);
        e.bytes.resize(HEADER_BYTES as usize, 0);
        self.slots[slot].write_durable(0, &e.bytes)?;
        self.newest = Some(Newest { slot, generation, bytes: payload.len() as u64 });
        Ok(())
    }

    /// Make a slot's header invalid (format time).
    pub fn clear(&mut self) -> Result<()> {
        for slot in &self.slots {
            slot.write_durable(0, &[0u8; HEADER_BYTES as usize])?;
        }
        self.newest = None;
        Ok(())
    }
}

/// What a checkpoint records of the live state. With a persistent residue store that is
/// the state itself; with a volatile one (`scrap`) it is what survives a crash: no residue
/// units, and each file's size as last journaled.
pub trait DurableView {
    fn entry(&self, entry: &BlockEntry) -> Option<BlockEntry>;
    fn size(&self, ino: Ino, size: u64) -> u64;
}

/// The live state as it is.
pub struct AsIs;

impl DurableView for AsIs {
    fn entry(&self, entry: &BlockEntry) -> Option<BlockEntry> {
        Some(entry.clone())
    }
    fn size(&self, _ino: Ino, size: u64) -> u64 {
        size
    }
}

/// Serialize the whole state as `view` sees it. Callers hold the commit lock, so it is
/// consistent.
pub fn encode_state(state: &MetaState, counters: &[u64], view: &dyn DurableView) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u64(state.next_ino.load(std::sync::atomic::Ordering::SeqCst));
    e.u32(counters.len() as u32);
    for &c in counters {
        e.u64(c);
    }
    let inodes = state.snapshot();
    e.u64(inodes.len() as u64);
    for inode in inodes {
        let data = inode.data.lock();
        let mut attr = data.attr.clone();
        attr.size = view.size(inode.ino, attr.size);
        encode_attr(&mut e, &attr);
        e.u64(data.parent.0).blob(&data.target);
        e.u64(data.entries.len() as u64);
        for (name, ino) in &data.entries {
            e.blob(name).u64(ino.0);
        }
        e.u64(data.xattrs.len() as u64);
        for (name, value) in &data.xattrs {
            e.blob(name).blob(value);
        }
        drop(data);
        let map = inode.map.lock();
        let entries: Vec<(u64, BlockEntry)> = map.iter().filter_map(|(&lb, entry)| Some((lb, view.entry(entry)?))).collect();
        e.u64(entries.len() as u64);
        for (lblock, entry) in &entries {
            e.u64(*lblock);
            encode_entry(&mut e, entry);
        }
    }
    e.bytes
}

/// Decode a state and check that the namespace hangs together.
pub fn decode_state(bytes: &[u8], pages_per_block: usize, page_bytes: u32) -> Result<(MetaState, Vec<u64>), Short> {
    let mut d = Decoder::new(bytes);
    let next_ino = d.u64()?;
    let ncounters = d.u32()? as usize;
    if ncounters > 1024 {
        return d.fail(format!("{ncounters} counters"));
    }
    let counters = (0..ncounters).map(|_| d.u64()).collect::<Result<Vec<_>, _>>()?;
    let count = d.count(60)?;
    let state = MetaState::default();
    state.next_ino.store(next_ino, std::sync::atomic::Ordering::SeqCst);
    let mut seen = HashSet::new();
    let mut references = Vec::new();
    for _ in 0..count {
        let attr = decode_attr(&mut d)?;
        if !seen.insert(attr.ino) || attr.ino.0 == 0 || attr.ino.0 >= next_ino {
            return d.fail(format!("inode {} duplicated or out of range", attr.ino.0));
        }
        let parent = Ino(d.u64()?);
        let target = d.blob(4096)?.to_vec();
        let nentries = d.count(12)?;
        if nentries > 0 && attr.kind != FileKind::Dir {
            return d.fail(format!("inode {} has entries but is not a directory", attr.ino.0));
        }
        let mut entries = BTreeMap::new();
        for _ in 0..nentries {
            let name = d.blob(255)?.to_vec();
            let ino = Ino(d.u64()?);
            references.push((attr.ino, ino));
            if entries.insert(name, ino).is_some() {
                return d.fail(format!("directory {} repeats a name", attr.ino.0));
            }
        }
        let nxattrs = d.count(8)?;
        let mut xattrs = BTreeMap::new();
        for _ in 0..nxattrs {
            let name = xattr_name(&mut d)?;
            let value = d.blob(XATTR_VALUE_MAX)?.to_vec();
            if xattrs.insert(name, value).is_some() {
                return d.fail(format!("inode {} repeats an extended attribute", attr.ino.0));
            }
        }
        let nmap = d.count(10)?;
        if nmap > 0 && attr.kind != FileKind::File {
            return d.fail(format!("inode {} has data blocks but is not a regular file", attr.ino.0));
        }
        let mut map = FileMap::new();
        for _ in 0..nmap {
            let lblock = d.u64()?;
            let entry = decode_entry(&mut d, pages_per_block, page_bytes)?;
            if map.insert(lblock, entry).is_some() {
                return d.fail(format!("inode {} maps block {lblock} twice", attr.ino.0));
            }
        }
        state.inodes.write().insert(attr.ino, std::sync::Arc::new(Inode::new(InodeData { attr, entries, parent, target, xattrs }, map)));
    }
    if d.remaining() != 0 {
        return d.fail(format!("{} trailing bytes", d.remaining()));
    }
    match state.get(Ino::ROOT) {
        Some(root) if root.kind == FileKind::Dir => {}
        _ => return d.fail("no root directory"),
    }
    if let Some((dir, ino)) = references.iter().find(|(_, ino)| state.get(*ino).is_none()) {
        return d.fail(format!("directory {} names missing inode {}", dir.0, ino.0));
    }
    Ok((state, counters))
}
