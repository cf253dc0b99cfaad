//! The superblock: one 4 KiB copy at offset 0 of each device, naming the volume (UUID),
//! the device's role, the profile and the geometry. Byte table: docs/format/superblock.md.

use crate::codec::{crc32c, Decoder, Encoder, Short};
use crate::error::{Error, Result};
use crate::geometry::{FastLayout, Geometry, SUPERBLOCK_BYTES};

pub const MAGIC: &[u8; 8] = b"ALIGNFS\x01";
pub const VERSION: u32 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRole {
    Fast = 1,
    Ssd = 2,
}

/// The named configuration a volume was formatted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// OrchFS: persistent fast tier with pages and upages.
    Orch = 1,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Orch => "orch",
        }
    }

    pub fn parse(name: &str) -> Result<Profile> {
        match name {
            "orch" => Ok(Profile::Orch),
            "scrap" | "byte" | "uhs" | "nvstore" => {
                Err(Error::InvalidArgument(format!("profile {name:?} is planned but not implemented yet; use \"orch\"")))
            }
            other => Err(Error::InvalidArgument(format!("unknown profile {other:?} (known: orch)"))),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub role: DeviceRole,
    pub profile: Profile,
    pub uuid: [u8; 16],
    pub geometry: Geometry,
    pub fast_bytes: u64,
    pub ssd_bytes: u64,
    pub fast: FastLayout,
    pub created_unix_ns: i64,
}

impl Superblock {
    pub fn ssd_blocks(&self) -> u64 {
        self.ssd_bytes / self.geometry.block()
    }

    pub fn uuid_string(&self) -> String {
        uuid::Uuid::from_bytes(self.uuid).to_string()
    }

    /// The 4 KiB image, checksummed.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.raw(MAGIC).u32(VERSION).u32(self.role as u32).u32(self.profile as u32).raw(&self.uuid);
        let g = &self.geometry;
        e.u32(g.block_bytes).u32(g.page_bytes).u32(g.split_bytes).u32(g.io_workers);
        e.u64(self.fast_bytes).u64(self.ssd_bytes);
        let f = &self.fast;
        e.u64(f.checkpoint_bytes).u64(f.checkpoint_a_offset).u64(f.checkpoint_b_offset);
        e.u64(f.journal_offset).u64(f.journal_bytes).u64(f.pages_offset).u64(f.page_count);
        e.i64(self.created_unix_ns);
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

    /// Decode and check a superblock read from `device`.
    pub fn decode(bytes: &[u8], device: &str) -> Result<Superblock> {
        if !Self::has_magic(bytes) {
            return Err(Error::NotFormatted(device.to_string()));
        }
        let corrupt = |problem: String| Error::corrupt("superblock", device, 0, problem);
        let short = |s: Short| corrupt(s.to_string());
        let mut d = Decoder::new(bytes);
        d.take(MAGIC.len()).map_err(short)?;
        let version = d.u32().map_err(short)?;
        if version != VERSION {
            return Err(corrupt(format!("format version {version}, this alignfs reads version {VERSION}")));
        }
        let role = match d.u32().map_err(short)? {
            1 => DeviceRole::Fast,
            2 => DeviceRole::Ssd,
            other => return Err(corrupt(format!("unknown device role {other}"))),
        };
        let profile = match d.u32().map_err(short)? {
            1 => Profile::Orch,
            other => return Err(corrupt(format!("unknown profile {other}"))),
        };
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
        let fast = FastLayout {
            checkpoint_bytes: d.u64().map_err(short)?,
            checkpoint_a_offset: d.u64().map_err(short)?,
            checkpoint_b_offset: d.u64().map_err(short)?,
            journal_offset: d.u64().map_err(short)?,
            journal_bytes: d.u64().map_err(short)?,
            pages_offset: d.u64().map_err(short)?,
            page_count: d.u64().map_err(short)?,
        };
        let created_unix_ns = d.i64().map_err(short)?;
        let covered = d.position();
        let stored = d.u32().map_err(short)?;
        let actual = crc32c(&bytes[..covered]);
        if stored != actual {
            return Err(corrupt(format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x})")));
        }
        geometry.validate().map_err(|e| corrupt(e.to_string()))?;
        let expected = FastLayout::compute(fast_bytes, &geometry).map_err(|e| corrupt(e.to_string()))?;
        if expected != fast {
            return Err(corrupt("fast-tier layout does not match its size and geometry".into()));
        }
        if ssd_bytes / geometry.block() < 2 {
            return Err(corrupt(format!("SSD size {ssd_bytes} holds fewer than two blocks")));
        }
        Ok(Superblock { role, profile, uuid, geometry, fast_bytes, ssd_bytes, fast, created_unix_ns })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::GIB;

    fn sample() -> Superblock {
        let geometry = Geometry::default();
        Superblock {
            role: DeviceRole::Fast,
            profile: Profile::Orch,
            uuid: [7; 16],
            geometry,
            fast_bytes: GIB,
            ssd_bytes: 8 * GIB,
            fast: FastLayout::compute(GIB, &geometry).unwrap(),
            created_unix_ns: 42,
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode(), "dev").unwrap(), sb);
    }

    #[test]
    fn every_single_byte_flip_is_caught_or_harmless() {
        let original = sample();
        let image = original.encode();
        for at in 0..200 {
            let mut bad = image.clone();
            bad[at] ^= 0x5a;
            match Superblock::decode(&bad, "dev") {
                Err(Error::Corrupt { structure: "superblock", .. }) | Err(Error::NotFormatted(_)) => {}
                // Past the checksummed fields: padding, ignored.
                Ok(decoded) if decoded == original && at >= 136 => {}
                other => panic!("flip at {at} gave {other:?}"),
            }
        }
        for len in 0..120 {
            assert!(Superblock::decode(&image[..len], "dev").is_err());
        }
    }
}
