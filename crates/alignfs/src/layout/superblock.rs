//! The superblock: one 4 KiB copy at offset 0 of each device, naming the volume (UUID),
//! the device's role, the profile and the geometry. Byte table: docs/format/superblock.md.

use super::Profile;
use crate::codec::{crc32c, Decoder, Encoder, Short};
use crate::error::{Error, Result};
use crate::geometry::{Geometry, MetaLayout, SUPERBLOCK_BYTES};

pub const MAGIC: &[u8; 8] = b"ALIGNFS\x01";
/// The version this build writes. 4: an `nvstore` volume's KV journals may start with a
/// header, which a version-3 build would read as the journal's end (cutting off
/// acknowledged commits); the on-media format is otherwise version 3's. 5: a flags word
/// after `ssd_index` says whether the metadata is stored in place (`byte`).
pub const FORMAT_VERSION: u32 = 5;
/// The first version with the flags word.
const FLAGS_VERSION: u32 = 5;
/// Flag: the metadata area holds in-place records (crate::lines), not a journal and
/// checkpoints.
const FLAG_IN_PLACE_META: u32 = 1;
/// The oldest version this build opens. A version-3 `nvstore` volume is raised to 4 when
/// opened writable, before its KV store is (`Volume::open`).
pub const OLDEST_FORMAT_VERSION: u32 = 3;
/// Most SSDs one volume spans.
pub const MAX_SSDS: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRole {
    Fast = 1,
    Ssd = 2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The format version the copy was written with.
    pub version: u32,
    pub role: DeviceRole,
    pub profile: Profile,
    pub uuid: [u8; 16],
    pub geometry: Geometry,
    /// 0 for profiles without a fast tier.
    pub fast_bytes: u64,
    pub ssd_bytes: u64,
    /// On the fast tier, or at the start of the SSD when the profile has no fast tier.
    pub layout: MetaLayout,
    pub created_unix_ns: i64,
    /// SSDs in the volume (`scrap` may have several), and which of them holds this copy.
    /// Each holds `ssd_bytes / ssd_count`; the metadata area is on SSD 0.
    pub ssd_count: u32,
    pub ssd_index: u32,
    /// The metadata area holds in-place records (`byte`, docs/BYTE.md), not a journal and
    /// checkpoint slots. Always `false` before version 5.
    pub in_place_meta: bool,
}

impl Superblock {
    pub fn ssd_blocks(&self) -> u64 {
        self.ssd_bytes / self.geometry.block()
    }

    /// SSD blocks that never hold file data: each SSD's first block (its superblock), and
    /// the metadata area when it lives on the SSD.
    pub fn reserved_ssd_blocks(&self) -> Vec<u64> {
        // With a fast tier (its size recorded) the metadata is there; else it starts the SSD.
        let first = if self.fast_bytes > 0 { 1 } else { self.layout.reserved_ssd_blocks(&self.geometry) };
        let per_ssd = self.ssd_blocks() / u64::from(self.ssd_count);
        (0..first).chain((1..u64::from(self.ssd_count)).map(|i| i * per_ssd)).collect()
    }

    /// Bytes of each SSD.
    pub fn member_bytes(&self) -> u64 {
        self.ssd_bytes / u64::from(self.ssd_count)
    }

    pub fn uuid_string(&self) -> String {
        uuid::Uuid::from_bytes(self.uuid).to_string()
    }

    /// The 4 KiB image, checksummed.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.raw(MAGIC).u32(self.version).u32(self.role as u32).u32(self.profile.code()).raw(&self.uuid);
        let g = &self.geometry;
        e.u32(g.block_bytes).u32(g.page_bytes).u32(g.split_bytes).u32(g.io_workers);
        e.u64(self.fast_bytes).u64(self.ssd_bytes);
        let f = &self.layout;
        e.u64(f.checkpoint_bytes).u64(f.checkpoint_a_offset).u64(f.checkpoint_b_offset);
        e.u64(f.journal_offset).u64(f.journal_bytes).u64(f.pages_offset).u64(f.page_count);
        e.i64(self.created_unix_ns);
        e.u32(self.ssd_count).u32(self.ssd_index);
        if self.version >= FLAGS_VERSION {
            e.u32(if self.in_place_meta { FLAG_IN_PLACE_META } else { 0 });
        }
        let crc = crc32c(&e.bytes);
        e.u32(crc);
        let mut bytes = e.bytes;
        bytes.resize(SUPERBLOCK_BYTES as usize, 0);
        bytes
    }

    /// Whether `bytes` start with the superblock magic (a volume lives here, valid or not).
    pub fn has_magic(bytes: &[u8]) -> bool {
        bytes.len() >= MAGIC.len() && &bytes[..MAGIC.len()] == MAGIC
    }

    /// Decode a superblock read from `device` and check what the layout alone can: its
    /// checksum, version and fields, and the rules every geometry obeys. Whether the
    /// fields suit the profile they name is for that profile to say: callers use
    /// `Superblock::decode`, which does both (`crate::profile`).
    pub(crate) fn decode_fields(bytes: &[u8], device: &str) -> Result<Superblock> {
        if !Self::has_magic(bytes) {
            return Err(Error::NotFormatted(device.to_string()));
        }
        let corrupt = |problem: String| Error::corrupt("superblock", device, 0, problem);
        let short = |s: Short| corrupt(s.to_string());
        let mut d = Decoder::new(bytes);
        d.take(MAGIC.len()).map_err(short)?;
        let version = d.u32().map_err(short)?;
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(corrupt(format!(
                "format version {version}; this alignfs reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}"
            )));
        }
        let role = match d.u32().map_err(short)? {
            1 => DeviceRole::Fast,
            2 => DeviceRole::Ssd,
            other => return Err(corrupt(format!("unknown device role {other}"))),
        };
        let profile = Profile(d.u32().map_err(short)?);
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(d.take(16).map_err(short)?);
        let geometry = Geometry {
            block_bytes: d.u32().map_err(short)?,
            page_bytes: d.u32().map_err(short)?,
            split_bytes: d.u32().map_err(short)?,
            io_workers: d.u32().map_err(short)?,
        };
        let fast_bytes = d.u64().map_err(short)?;
        let ssd_bytes = d.u64().map_err(short)?;
        let layout = MetaLayout {
            checkpoint_bytes: d.u64().map_err(short)?,
            checkpoint_a_offset: d.u64().map_err(short)?,
            checkpoint_b_offset: d.u64().map_err(short)?,
            journal_offset: d.u64().map_err(short)?,
            journal_bytes: d.u64().map_err(short)?,
            pages_offset: d.u64().map_err(short)?,
            page_count: d.u64().map_err(short)?,
        };
        let created_unix_ns = d.i64().map_err(short)?;
        let ssd_count = d.u32().map_err(short)?;
        let ssd_index = d.u32().map_err(short)?;
        let flags = if version >= FLAGS_VERSION { d.u32().map_err(short)? } else { 0 };
        if flags & !FLAG_IN_PLACE_META != 0 {
            return Err(corrupt(format!("unknown flags {flags:#x}")));
        }
        let in_place_meta = flags & FLAG_IN_PLACE_META != 0;
        let covered = d.position();
        let stored = d.u32().map_err(short)?;
        let actual = crc32c(&bytes[..covered]);
        if stored != actual {
            return Err(corrupt(format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x})")));
        }
        geometry.validate().map_err(|e| corrupt(e.to_string()))?;
        if ssd_bytes / geometry.block() < 2 {
            return Err(corrupt(format!("SSD size {ssd_bytes} holds fewer than two blocks")));
        }
        if ssd_count == 0 || ssd_count > MAX_SSDS || ssd_index >= ssd_count {
            return Err(corrupt(format!("SSD {ssd_index} of {ssd_count} is not a valid place in a volume")));
        }
        if ssd_count > 1 && ssd_bytes % (u64::from(ssd_count) * u64::from(geometry.split_bytes)) != 0 {
            return Err(corrupt(format!("{ssd_bytes} bytes do not split into {ssd_count} SSDs of whole split units")));
        }
        Ok(Superblock {
            version,
            role,
            profile,
            uuid,
            geometry,
            fast_bytes,
            ssd_bytes,
            layout,
            created_unix_ns,
            ssd_count,
            ssd_index,
            in_place_meta,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::geometry::GIB;

    /// An `orch` fast tier's superblock (profile 1), for the tests here and in `profile/`.
    pub(crate) fn sample() -> Superblock {
        let geometry = Geometry::default();
        Superblock {
            version: FORMAT_VERSION,
            role: DeviceRole::Fast,
            profile: Profile(1),
            uuid: [7; 16],
            geometry,
            fast_bytes: GIB,
            ssd_bytes: 8 * GIB,
            layout: MetaLayout::on_fast_tier(GIB, 8 * GIB, &geometry).unwrap(),
            created_unix_ns: 42,
            ssd_count: 1,
            ssd_index: 0,
            in_place_meta: false,
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode_fields(&sb.encode(), "dev").unwrap(), sb);
    }

    #[test]
    fn every_single_byte_flip_is_caught_or_harmless() {
        let original = sample();
        let image = original.encode();
        for at in 0..200 {
            let mut bad = image.clone();
            bad[at] ^= 0x5a;
            match Superblock::decode_fields(&bad, "dev") {
                Err(Error::Corrupt { structure: "superblock", .. }) | Err(Error::NotFormatted(_)) => {}
                // Past the checksummed fields: padding, ignored.
                Ok(decoded) if decoded == original && at >= 144 => {}
                other => panic!("flip at {at} gave {other:?}"),
            }
        }
        for len in 0..120 {
            assert!(Superblock::decode_fields(&image[..len], "dev").is_err());
        }
    }
}
