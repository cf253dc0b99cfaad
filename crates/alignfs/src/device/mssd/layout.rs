//! Where the emulated device keeps its DRAM state, and the byte layout of a log entry
//! (docs/format/mssd.md).
//!
//! ```text
//! 0        header: magic, geometry, CRC (64 B); log head (u64 at 64); active TxLog (u64 at 72)
//! 4 KiB    L2P: one u32 per logical page, physical page + 1 (0: unmapped)
//! ...      OOB: 16 B per physical page: logical page (u32), version (u64 at +8)
//! ...      TxLog A, TxLog B: u32 TxIDs of committed transactions, 0 ends each
//! ...      write log: a circular region of 64 B-aligned entries
//! ```

use crate::codec::crc32c;
use crate::error::{Error, Result};
use crate::geometry::MIB;

/// The flash page and the unit of the block interface.
pub const PAGE: u64 = 4096;
/// The unit of the byte interface: a CPU cache line.
pub const LINE: u64 = 64;
/// The index's first layer: the address space cut into partitions of this many bytes.
pub const PARTITION_BYTES: u64 = 16 * MIB;

const MAGIC: &[u8; 8] = b"ALFSMSSD";
/// The flash image's label, in its last page (beyond the flash pages): names the device
/// the image belongs to, so that a flash image is known for what it is without its DRAM.
const FLASH_LABEL_MAGIC: &[u8; 8] = b"ALFSFLSH";
const FLASH_LABEL_BYTES: usize = 28;
const VERSION: u32 = 1;
const STATIC_HEADER: usize = 60;
const HEAD_AT: u64 = 64;
const ACTIVE_TXLOG_AT: u64 = 72;
const OOB_BYTES: u64 = 16;

/// What `alignfs mkfs --profile byte` chooses for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MssdConfig {
    /// Bytes the block interface exposes.
    pub logical_bytes: u64,
    /// The write log in device DRAM (the paper's default: 256 MiB).
    pub log_bytes: u64,
    /// Both TxLogs together (the paper's 2 MiB).
    pub txlog_bytes: u64,
    pub pages_per_erase_block: u32,
    /// Flash beyond the logical size, for garbage collection.
    pub over_provision_percent: u32,
}

impl MssdConfig {
    pub fn new(logical_bytes: u64) -> MssdConfig {
        MssdConfig { logical_bytes, log_bytes: 256 * MIB, txlog_bytes: 2 * MIB, pages_per_erase_block: 64, over_provision_percent: 7 }
    }
}

impl MssdConfig {
    /// The largest device (in whole MiB) whose flash fits `flash_bytes`, with a write log
    /// of `log_bytes`.
    pub fn fitting(flash_bytes: u64, log_bytes: u64) -> Result<MssdConfig> {
        let config = |mib: u64| MssdConfig { log_bytes, ..MssdConfig::new(mib * MIB) };
        let fits = |mib: u64| Layout::new(&config(mib)).is_ok_and(|l| l.image_bytes() <= flash_bytes);
        // Too small a size fails for want of erase blocks, so search down from the top.
        let largest = (1..=flash_bytes / MIB).rev().find(|&mib| fits(mib));
        largest.map(config).ok_or_else(|| Error::BadSize(format!("a flash image of {flash_bytes} bytes holds no memory-semantic SSD")))
    }
}

/// The geometry of one device, fixed at format and read back from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub logical_pages: u32,
    pub flash_pages: u32,
    pub pages_per_erase_block: u32,
    pub txlog_entries: u64,
    pub log_bytes: u64,
    l2p_at: u64,
    oob_at: u64,
    txlog_at: [u64; 2],
    log_at: u64,
    pub dram_bytes: u64,
    /// Chosen at format and mixed into every entry's CRC, so entries a previous format
    /// left in the log region never pass for this one's.
    pub incarnation: u64,
}

fn round_up(value: u64, unit: u64) -> u64 {
    value.div_ceil(unit) * unit
}

impl Layout {
    pub fn new(config: &MssdConfig) -> Result<Layout> {
        let bad = |why: String| Err(Error::Geometry(format!("memory-semantic SSD: {why}")));
        if config.logical_bytes == 0 || config.logical_bytes % PAGE != 0 {
            return bad(format!("the size ({}) must be a positive multiple of 4 KiB", config.logical_bytes));
        }
        let logical_pages = config.logical_bytes / PAGE;
        if logical_pages >= u64::from(u32::MAX) / 2 {
            return bad(format!("{} bytes is beyond the 8 TiB a 32-bit page map addresses", config.logical_bytes));
        }
        if config.log_bytes < MIB || config.log_bytes % LINE != 0 || config.log_bytes > 4096 * MIB {
            return bad(format!("the write log ({} bytes) must be 1 MiB–4 GiB in 64-byte lines", config.log_bytes));
        }
        if config.txlog_bytes < 2 * PAGE || config.txlog_bytes % (2 * PAGE) != 0 {
            return bad(format!("the TxLog ({} bytes) must be a multiple of 8 KiB", config.txlog_bytes));
        }
        let ppeb = u64::from(config.pages_per_erase_block);
        if !(4..=1024).contains(&ppeb) {
            return bad(format!("{ppeb} pages per erase block; 4–1024 are allowed"));
        }
        if config.over_provision_percent > 100 {
            return bad(format!("{}% over-provisioning; at most 100% is allowed", config.over_provision_percent));
        }
        // Garbage collection needs a few whole erase blocks beyond the live data, whatever
        // the percentage says.
        let spare = (logical_pages * u64::from(config.over_provision_percent) / 100).max(4 * ppeb);
        let flash_pages = (logical_pages + spare).div_ceil(ppeb) * ppeb;
        Ok(Layout::place(config, logical_pages as u32, flash_pages as u32))
    }

    /// Lay the regions out for a device of these page counts (checked by the caller).
    fn place(config: &MssdConfig, logical_pages: u32, flash_pages: u32) -> Layout {
        let l2p_at = PAGE;
        let oob_at = l2p_at + round_up(u64::from(logical_pages) * 4, PAGE);
        let half = config.txlog_bytes / 2;
        let txlog_at = oob_at + round_up(u64::from(flash_pages) * OOB_BYTES, PAGE);
        let log_at = txlog_at + 2 * half;
        Layout {
            logical_pages,
            flash_pages,
            pages_per_erase_block: config.pages_per_erase_block,
            txlog_entries: half / 4,
            log_bytes: config.log_bytes,
            l2p_at,
            oob_at,
            txlog_at: [txlog_at, txlog_at + half],
            log_at,
            dram_bytes: log_at + config.log_bytes,
            incarnation: 0,
        }
    }

    pub fn flash_bytes(&self) -> u64 {
        u64::from(self.flash_pages) * PAGE
    }

    /// The flash image: the flash pages and a page for its label.
    pub fn image_bytes(&self) -> u64 {
        self.flash_bytes() + PAGE
    }

    /// The label of this device's flash image (a whole page).
    pub fn encode_flash_label(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PAGE as usize);
        out.extend_from_slice(FLASH_LABEL_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.flash_pages.to_le_bytes());
        out.extend_from_slice(&self.incarnation.to_le_bytes());
        let crc = crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(out.len(), FLASH_LABEL_BYTES);
        out.resize(PAGE as usize, 0);
        out
    }
}

/// The device a DRAM header names (its incarnation); `None` where `head` (the region's
/// first 64 bytes) holds no intact header.
pub fn dram_label(head: &[u8]) -> Option<u64> {
    let bytes = head.get(..64)?;
    if &bytes[..8] != MAGIC {
        return None;
    }
    let stored = u32::from_le_bytes(bytes[STATIC_HEADER..64].try_into().expect("4 bytes"));
    (crc32c(&bytes[..STATIC_HEADER]) == stored).then(|| u64::from_le_bytes(bytes[44..52].try_into().expect("8 bytes")))
}

/// The device a flash image's label names (its incarnation), from the image's last page;
/// `None` where that page holds no label (not a flash image, or one formatted before
/// labels) or a damaged one.
pub fn flash_label(last_page: &[u8]) -> Option<u64> {
    let bytes = last_page.get(..FLASH_LABEL_BYTES)?;
    if &bytes[..8] != FLASH_LABEL_MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
    (crc32c(&bytes[..24]) == crc).then(|| u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes")))
}

impl Layout {
    pub fn erase_blocks(&self) -> u32 {
        self.flash_pages / self.pages_per_erase_block
    }

    pub fn partitions(&self) -> usize {
        (u64::from(self.logical_pages) * PAGE).div_ceil(PARTITION_BYTES) as usize
    }

    pub fn l2p(&self, lpa: u32) -> u64 {
        self.l2p_at + u64::from(lpa) * 4
    }

    pub fn oob(&self, ppa: u32) -> u64 {
        self.oob_at + u64::from(ppa) * OOB_BYTES
    }

    pub fn txlog(&self, which: usize, index: u64) -> u64 {
        self.txlog_at[which] + index * 4
    }

    pub fn txlog_range(&self, which: usize) -> (u64, u64) {
        (self.txlog_at[which], self.txlog_entries * 4)
    }

    /// DRAM offset of the log position `pos` (positions count bytes appended since format).
    pub fn log(&self, pos: u64) -> u64 {
        self.log_at + pos % self.log_bytes
    }

    pub const fn head_at() -> u64 {
        HEAD_AT
    }

    pub const fn active_txlog_at() -> u64 {
        ACTIVE_TXLOG_AT
    }

    pub fn encode_header(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(PAGE as u32).to_le_bytes());
        out.extend_from_slice(&self.logical_pages.to_le_bytes());
        out.extend_from_slice(&self.flash_pages.to_le_bytes());
        out.extend_from_slice(&self.pages_per_erase_block.to_le_bytes());
        out.extend_from_slice(&(self.txlog_entries * 8).to_le_bytes());
        out.extend_from_slice(&self.log_bytes.to_le_bytes());
        out.extend_from_slice(&self.incarnation.to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        assert_eq!(out.len(), STATIC_HEADER);
        let crc = crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// The geometry a header names, checked against the DRAM region it came from.
    pub fn has_magic(bytes: &[u8]) -> bool {
        bytes.starts_with(MAGIC)
    }

    pub fn decode_header(bytes: &[u8], dram_bytes: u64, device: &str) -> Result<Layout> {
        let corrupt =
            |problem: String| Error::Corrupt { structure: "memory-semantic SSD header", device: device.into(), offset: 0, problem };
        if bytes.len() < 64 || &bytes[..8] != MAGIC {
            return Err(Error::NotFormatted(format!("{device} (no memory-semantic SSD header)")));
        }
        let stored = u32::from_le_bytes(bytes[STATIC_HEADER..64].try_into().expect("4 bytes"));
        if crc32c(&bytes[..STATIC_HEADER]) != stored {
            return Err(corrupt("checksum mismatch".into()));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if u32_at(8) != VERSION || u64::from(u32_at(12)) != PAGE {
            return Err(corrupt(format!("version {} with {}-byte pages is not this build's", u32_at(8), u32_at(12))));
        }
        let config = MssdConfig {
            logical_bytes: u64::from(u32_at(16)) * PAGE,
            log_bytes: u64_at(36),
            txlog_bytes: u64_at(28),
            pages_per_erase_block: u32_at(24),
            over_provision_percent: 0,
        };
        let smallest = Layout::new(&config).map_err(|e| corrupt(e.to_string()))?;
        let flash_pages = u32_at(20);
        if flash_pages < smallest.flash_pages || flash_pages % smallest.pages_per_erase_block != 0 {
            return Err(corrupt(format!("{flash_pages} flash pages cannot hold {} logical ones", smallest.logical_pages)));
        }
        // The over-provisioning chosen at format shows only in the flash size.
        let mut layout = Layout::place(&config, smallest.logical_pages, flash_pages);
        layout.incarnation = u64_at(44);
        if layout.dram_bytes > dram_bytes {
            return Err(corrupt(format!("the layout needs {} bytes of DRAM, the region has {dram_bytes}", layout.dram_bytes)));
        }
        Ok(layout)
    }
}

/// The CRC of an entry's bytes after the CRC field, seeded with the format's incarnation
/// and the entry's full position (the stored slot is only the low 32 bits of `pos / 64`).
fn entry_crc(incarnation: u64, pos: u64, bytes: &[u8]) -> u32 {
    let mut seeded = Vec::with_capacity(16 + bytes.len());
    seeded.extend_from_slice(&incarnation.to_le_bytes());
    seeded.extend_from_slice(&pos.to_le_bytes());
    seeded.extend_from_slice(bytes);
    crc32c(&seeded)
}

/// What a log entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// Bytes stored through the byte interface.
    Data = 1,
    /// The page was deallocated: older entries for it are void.
    Trim = 2,
    /// Filler to the end of the region; the next entry starts the next lap.
    Pad = 3,
}

/// The header in front of each entry's bytes (32 B).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    pub kind: EntryKind,
    /// The transaction the entry belongs to; 0 for a store committed by itself.
    pub txid: u32,
    /// Global order of stores; a migrated entry keeps its own.
    pub seq: u64,
    pub lpa: u32,
    pub offset: u16,
    pub len: u16,
}

pub const ENTRY_HEADER: u64 = 32;

impl EntryHeader {
    /// Bytes the entry takes in the log, its data included.
    pub fn footprint(len: usize) -> u64 {
        round_up(ENTRY_HEADER + len as u64, LINE)
    }

    /// Header and data as they are stored at log position `pos`. The CRC covers both and
    /// the position, so an entry of an earlier lap never passes for one of this lap.
    pub fn encode(&self, pos: u64, incarnation: u64, data: &[u8]) -> Vec<u8> {
        assert_eq!(data.len(), usize::from(self.len), "an entry's data is as long as its header says");
        let mut out = vec![0u8; Self::footprint(data.len()) as usize];
        out[4..8].copy_from_slice(&self.txid.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..20].copy_from_slice(&self.lpa.to_le_bytes());
        out[20..24].copy_from_slice(&((pos / LINE) as u32).to_le_bytes());
        out[24..26].copy_from_slice(&self.offset.to_le_bytes());
        out[26..28].copy_from_slice(&self.len.to_le_bytes());
        out[28] = self.kind as u8;
        out[32..32 + data.len()].copy_from_slice(data);
        let crc = entry_crc(incarnation, pos, &out[4..32 + data.len()]);
        out[..4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The header at `pos` if a whole, valid entry of this lap starts there, within the
    /// `room` bytes left before the log's end (an entry never wraps: one that would is
    /// damage). `read` fetches DRAM bytes at a log position.
    pub fn decode(pos: u64, incarnation: u64, room: u64, read: &mut dyn FnMut(u64, &mut [u8])) -> Option<EntryHeader> {
        if room < ENTRY_HEADER {
            return None;
        }
        let mut head = [0u8; ENTRY_HEADER as usize];
        read(pos, &mut head);
        let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
        if u32_at(20) != (pos / LINE) as u32 || head[29..32] != [0, 0, 0] {
            return None;
        }
        let kind = match head[28] {
            1 => EntryKind::Data,
            2 => EntryKind::Trim,
            3 => EntryKind::Pad,
            _ => return None,
        };
        let len = u16::from_le_bytes([head[26], head[27]]);
        let offset = u16::from_le_bytes([head[24], head[25]]);
        if u64::from(offset) + u64::from(len) > PAGE || Self::footprint(usize::from(len)) > room {
            return None;
        }
        let mut whole = vec![0u8; ENTRY_HEADER as usize + usize::from(len)];
        whole[..ENTRY_HEADER as usize].copy_from_slice(&head);
        read(pos + ENTRY_HEADER, &mut whole[ENTRY_HEADER as usize..]);
        if entry_crc(incarnation, pos, &whole[4..]) != u32_at(0) {
            return None;
        }
        Some(EntryHeader {
            kind,
            txid: u32_at(4),
            seq: u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")),
            lpa: u32_at(16),
            offset,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_decodes_only_at_its_own_position() {
        let header = EntryHeader { kind: EntryKind::Data, txid: 7, seq: 99, lpa: 12, offset: 64, len: 100 };
        let bytes = header.encode(4096, 42, &[5u8; 100]);
        assert_eq!(bytes.len(), 192);
        let read_at = |base: u64| {
            let bytes = bytes.clone();
            move |pos: u64, out: &mut [u8]| {
                let at = (pos - base) as usize;
                out.copy_from_slice(&bytes[at..at + out.len()]);
            }
        };
        assert_eq!(EntryHeader::decode(4096, 42, 1 << 20, &mut read_at(4096)), Some(header));
        assert_eq!(EntryHeader::decode(4096, 42, 128, &mut read_at(4096)), None, "an entry past the log's end");
        assert_eq!(EntryHeader::decode(4096, 43, 1 << 20, &mut read_at(4096)), None, "another format's entry");
        assert_eq!(EntryHeader::decode(4096 + 1024 * 1024, 42, 1 << 20, &mut read_at(4096 + 1024 * 1024)), None, "a stale lap");
        let mut torn = bytes.clone();
        torn[100] ^= 1;
        let mut read_torn = |pos: u64, out: &mut [u8]| {
            let at = (pos - 4096) as usize;
            out.copy_from_slice(&torn[at..at + out.len()]);
        };
        assert_eq!(EntryHeader::decode(4096, 42, 1 << 20, &mut read_torn), None, "a torn entry");
    }

    #[test]
    fn a_header_round_trips_and_rejects_damage() {
        let mut layout = Layout::new(&MssdConfig { log_bytes: 2 * MIB, ..MssdConfig::new(64 * MIB) }).unwrap();
        layout.incarnation = 0x1234_5678_9abc;
        let mut bytes = layout.encode_header();
        assert_eq!(Layout::decode_header(&bytes, layout.dram_bytes, "dev").unwrap(), layout);
        assert!(Layout::decode_header(&bytes, layout.dram_bytes - 1, "dev").is_err(), "a region too small");
        bytes[20] ^= 1;
        assert!(matches!(Layout::decode_header(&bytes, layout.dram_bytes, "dev"), Err(Error::Corrupt { .. })));
        assert!(matches!(Layout::decode_header(&[0; 64], layout.dram_bytes, "dev"), Err(Error::NotFormatted(_))));
    }
}
