//! What a superblock's fields must be for the profile they name: the layout decodes
//! them (`Superblock::decode_fields`), the profile says whether they fit it.

use crate::error::{Error, Result};
use crate::layout::{DeviceRole, Superblock};

use super::{DeviceKind, Profile};

impl Superblock {
    /// Decode and check a superblock read from `device`: its fields, then whether they suit
    /// the profile they name (a registered one, its geometry, devices and metadata store).
    pub fn decode(bytes: &[u8], device: &str) -> Result<Superblock> {
        let superblock = Superblock::decode_fields(bytes, device)?;
        let corrupt = |problem: String| Error::corrupt("superblock", device, 0, problem);
        let code = superblock.profile.code();
        let profile = Profile::from_code(code).ok_or_else(|| corrupt(format!("unknown profile {code}")))?;
        let kind = profile.devices();
        profile.validate_geometry(&superblock.geometry).map_err(|e| corrupt(e.to_string()))?;
        if kind != DeviceKind::FastTierAndSsd && (superblock.fast_bytes != 0 || superblock.role != DeviceRole::Ssd) {
            return Err(corrupt(format!("profile {} has no fast tier", profile.name())));
        }
        let ssd_count = superblock.ssd_count;
        let valid = superblock.layout.is_valid_at(
            kind.meta_placement(),
            superblock.fast_bytes,
            superblock.ssd_bytes / u64::from(ssd_count),
            &superblock.geometry,
        );
        if !valid.map_err(|e| corrupt(e.to_string()))? {
            return Err(corrupt("metadata layout does not match the device size and geometry".into()));
        }
        if ssd_count > kind.max_ssds() {
            return Err(corrupt(format!(
                "SSD {} of {ssd_count} is not a valid place in a {} volume",
                superblock.ssd_index,
                profile.name()
            )));
        }
        if superblock.in_place_meta && kind != DeviceKind::MemorySemanticSsd {
            return Err(corrupt(format!("profile {} cannot keep its metadata in place", profile.name())));
        }
        Ok(superblock)
    }

    /// What this superblock says its device is: "the fast tier of orch volume …".
    pub fn describe(&self) -> String {
        let (profile, uuid) = (self.profile.name(), self.uuid_string());
        match self.role {
            DeviceRole::Fast => format!("the fast tier of {profile} volume {uuid}"),
            DeviceRole::Ssd if self.ssd_count > 1 => format!("SSD {} of {} of {profile} volume {uuid}", self.ssd_index + 1, self.ssd_count),
            DeviceRole::Ssd => format!("the SSD of {profile} volume {uuid}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::crc32c;
    use crate::geometry::{MetaLayout, MetaPlacement, GIB};

    fn sample() -> Superblock {
        Superblock { profile: Profile::ORCH, ..crate::layout::sample_superblock() }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode(), "dev").unwrap(), sb);
        let unknown = Superblock { profile: Profile(99), ..sample() };
        assert!(
            matches!(Superblock::decode(&unknown.encode(), "dev"), Err(Error::Corrupt { problem, .. }) if problem.contains("unknown profile 99"))
        );
    }

    /// Version 5's flags word: in-place metadata on a byte volume reads back; a version-4
    /// image has no flags word; the flag on another profile, or an unknown flag, is refused.
    #[test]
    fn the_flags_word_names_in_place_metadata() {
        let geometry = Profile::BYTE.default_geometry();
        let layout = MetaLayout::at(MetaPlacement::MemorySemanticSsd, 0, 8 * GIB, &geometry).unwrap();
        let byte =
            Superblock { role: DeviceRole::Ssd, profile: Profile::BYTE, geometry, fast_bytes: 0, layout, in_place_meta: true, ..sample() };
        assert_eq!(Superblock::decode(&byte.encode(), "dev").unwrap(), byte);
        let v4 = Superblock { version: 4, in_place_meta: false, ..byte.clone() };
        let image = v4.encode();
        assert_eq!(image[140..144], crc32c(&image[..140]).to_le_bytes(), "a version-4 checksum follows ssd_index");
        assert_eq!(Superblock::decode(&v4.encode(), "dev").unwrap(), v4);
        let orch = Superblock { in_place_meta: true, ..sample() };
        assert!(Superblock::decode(&orch.encode(), "dev").is_err(), "orch cannot keep metadata in place");
        let mut unknown = byte.encode();
        unknown[140] |= 2;
        let crc = crc32c(&unknown[..144]);
        unknown[144..148].copy_from_slice(&crc.to_le_bytes());
        let refused = Superblock::decode(&unknown, "dev").unwrap_err().to_string();
        assert!(refused.contains("unknown flags"), "{refused}");
    }

    #[test]
    fn scrap_round_trip() {
        let geometry = Profile::SCRAP.default_geometry();
        let sb = Superblock {
            role: DeviceRole::Ssd,
            profile: Profile::SCRAP,
            fast_bytes: 0,
            geometry,
            layout: MetaLayout::on_ssd(8 * GIB, &geometry).unwrap(),
            ..sample()
        };
        assert_eq!(Superblock::decode(&sb.encode(), "dev").unwrap(), sb);
        assert!(sb.reserved_ssd_blocks().len() > 1);
        let layout = MetaLayout::on_ssd(2 * GIB, &geometry).unwrap();
        let second = Superblock { ssd_count: 4, ssd_index: 3, layout, ..sb.clone() };
        assert_eq!(Superblock::decode(&second.encode(), "dev").unwrap(), second);
        assert!(second.reserved_ssd_blocks().contains(&(3 * second.ssd_blocks() / 4)));
        let orch_pair = Superblock { ssd_count: 2, ..sample() };
        assert!(matches!(Superblock::decode(&orch_pair.encode(), "dev"), Err(Error::Corrupt { .. })), "orch has one SSD");
        let with_fast = Superblock { fast_bytes: GIB, ..sb.clone() };
        assert!(matches!(Superblock::decode(&with_fast.encode(), "dev"), Err(Error::Corrupt { .. })));
    }
}
