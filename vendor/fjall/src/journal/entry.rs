// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::{file::MAGIC_BYTES, keyspace::InternalKeyspaceId, Slice};
use byteorder::{LittleEndian, ReadBytesExt, WriteBytesExt};
use lsm_tree::{
    coding::{Decode, Encode},
    CompressionType, SeqNo, UserKey, UserValue, ValueType,
};
use std::io::{Read, Write};

/// Journal entry. Every batch is composed as a Start, followed by N items, followed by an End.
///
/// - The start entry contains the numbers of items. If the numbers of items following doesn't match, the batch is broken.
///
/// - The end entry contains a checksum value. If the checksum of the items doesn't match that, the batch is broken.
///
/// - The end entry terminates each batch with the magic string: [`TRAILER_MAGIC`].
///
/// - If a start entry is detected, while inside a batch, the batch is broken.
#[derive(Debug, Eq, PartialEq)]
pub enum Entry {
    Start {
        item_count: u32,
        seqno: SeqNo,
    },
    Item {
        keyspace_id: InternalKeyspaceId,
        key: UserKey,
        value: UserValue,
        value_type: ValueType,
        compression: CompressionType,
    },
    End(u64),
    Clear {
        keyspace_id: InternalKeyspaceId,
    },
    /// alignfs: written after each completed sync, at `offset`, its own position in the
    /// journal: everything before it was durable. Recovery tells a batch a crash tore
    /// (none after it) from a damaged one (one after it) by this marker.
    ///
    /// alignfs: in a journal that starts with a [`Entry::Header`] the marker also carries
    /// the header's salt (tag 8), so that a marker left by the file's earlier life as
    /// another journal (it is recycled) is not taken for one of this journal's.
    Synced {
        offset: u64,
        salt: Option<u64>,
    },
    /// alignfs: the first entry of a journal this build creates or recycles: the salt is
    /// the journal's number. Its batches' checksums are seeded with it and its sync
    /// markers carry it, so that a recycled file's older entries past the journal's end
    /// fail their checksums instead of reading as this journal's. A journal without a
    /// header (written by an older build) has neither.
    Header {
        salt: u64,
    },
    /// alignfs: zeros from here to the next [`JOURNAL_PAGE`] boundary, written before a
    /// sync so that every sync writes whole pages the journal has not written before: the
    /// next sync starts on a fresh page instead of writing the last one again.
    Pad,
}

/// alignfs: the page a sync pads the journal to (see [`Entry::Pad`]).
pub const JOURNAL_PAGE: u64 = 4_096;

pub fn serialize_marker_item<W: Write>(
    writer: &mut W,
    keyspace_id: InternalKeyspaceId,
    key: &[u8],
    value: &[u8],
    value_type: ValueType,
    compression: CompressionType,
) -> Result<(), lsm_tree::Error> {
    writer.write_u8(Tag::Item.into())?;

    writer.write_u8(u8::from(value_type))?;

    compression.encode_into(writer)?;

    let compressed_value = match compression {
        CompressionType::None => std::borrow::Cow::Borrowed(value),

        #[cfg(feature = "lz4")]
        CompressionType::Lz4 => {
            let compressed = lz4_flex::compress(value);
            std::borrow::Cow::Owned(compressed)
        }
    };

    // NOTE: Truncation is okay and actually needed
    writer.write_u64::<LittleEndian>(keyspace_id)?;

    // NOTE: Truncation is okay and actually needed
    #[expect(clippy::cast_possible_truncation)]
    writer.write_u16::<LittleEndian>(key.len() as u16)?;

    // NOTE: Truncation is okay and actually needed
    #[expect(clippy::cast_possible_truncation)]
    writer.write_u32::<LittleEndian>(value.len() as u32)?;

    // NOTE: Truncation is okay and actually needed
    #[expect(clippy::cast_possible_truncation)]
    writer.write_u32::<LittleEndian>(compressed_value.len() as u32)?;

    writer.write_all(key)?;

    writer.write_all(&compressed_value)?;

    Ok(())
}

/// alignfs: `len` bytes of a value, not allocated up front: a length a crash or damage
/// left (up to 4 GiB) then ends the journal where the file ends, instead of allocating all
/// of it first (found by alignfs's fuzz target `kv_journal`).
fn read_value<R: Read>(reader: &mut R, len: usize) -> std::io::Result<Slice> {
    let mut bytes = Vec::with_capacity(len.min(64 * 1_024));
    reader.take(len as u64).read_to_end(&mut bytes)?;
    if bytes.len() < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Slice::from(bytes))
}

/// alignfs: the bytes of a sync marker (`Entry::Synced`): its tag, the offset it names,
/// in a journal with a header its salt (tag 8, else tag 5), the magic bytes. The writer
/// appends them, the encoder writes them, and recovery searches the journal for them byte
/// by byte (`JournalReader::synced_after`).
pub fn sync_marker(offset: u64, salt: Option<u64>) -> Vec<u8> {
    let mut marker = Vec::with_capacity(sync_marker_len(salt));
    match salt {
        None => {
            marker.push(Tag::Synced as u8);
            marker.extend_from_slice(&offset.to_le_bytes());
        }
        Some(salt) => {
            marker.push(Tag::SaltedSynced as u8);
            marker.extend_from_slice(&offset.to_le_bytes());
            marker.extend_from_slice(&salt.to_le_bytes());
        }
    }
    marker.extend_from_slice(MAGIC_BYTES);
    marker
}

pub fn sync_marker_len(salt: Option<u64>) -> usize {
    1 + 8 + if salt.is_some() { 8 } else { 0 } + MAGIC_BYTES.len()
}

/// alignfs: the bytes of a journal header (`Entry::Header`).
pub fn header(salt: u64) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.push(Tag::Header as u8);
    header.extend_from_slice(&salt.to_le_bytes());
    header.extend_from_slice(MAGIC_BYTES);
    header
}

pub const HEADER_LEN: usize = 1 + 8 + MAGIC_BYTES.len();

pub enum Tag {
    Start = 1,
    Item = 2,
    End = 3,
    Clear = 4,
    Synced = 5,
    Header = 6,
    Pad = 7,
    SaltedSynced = 8,
}

impl TryFrom<u8> for Tag {
    type Error = crate::Error;

    fn try_from(value: u8) -> Result<Self, Self::Error> {
        use Tag::{Clear, End, Header, Item, Pad, SaltedSynced, Start, Synced};

        match value {
            1 => Ok(Start),
            2 => Ok(Item),
            3 => Ok(End),
            4 => Ok(Clear),
            5 => Ok(Synced),
            6 => Ok(Header),
            7 => Ok(Pad),
            8 => Ok(SaltedSynced),
            _ => Err(crate::Error::InvalidTag(("JournalMarkerTag", value))),
        }
    }
}

impl From<Tag> for u8 {
    fn from(val: Tag) -> Self {
        val as Self
    }
}

impl Entry {
    #[cfg(test)]
    pub fn encode_into_vec(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        self.encode_into(&mut buf).expect("should encode");
        buf
    }

    pub(crate) fn encode_into<W: Write>(&self, writer: &mut W) -> Result<(), crate::Error> {
        use Entry::{Clear, End, Header, Item, Pad, Start, Synced};

        match self {
            Start { item_count, seqno } => {
                writer.write_u8(Tag::Start.into())?;
                writer.write_u32::<LittleEndian>(*item_count)?;
                writer.write_u64::<LittleEndian>(*seqno)?;
            }
            Item {
                keyspace_id,
                key,
                value,
                value_type,
                compression,
            } => {
                serialize_marker_item(writer, *keyspace_id, key, value, *value_type, *compression)?;
            }
            End(val) => {
                writer.write_u8(Tag::End.into())?;
                writer.write_u64::<LittleEndian>(*val)?;

                // NOTE: Write some fixed trailer bytes so we know the end marker is fully written
                // Otherwise we couldn't know if the checksum value is maybe mangled
                // (only partially written, with the rest being padding zeroes)
                writer.write_all(MAGIC_BYTES)?;
            }
            Clear { keyspace_id } => {
                writer.write_u8(Tag::Clear.into())?;
                writer.write_u64::<LittleEndian>(*keyspace_id)?;
            }
            Synced { offset, salt } => writer.write_all(&sync_marker(*offset, *salt))?,
            Header { salt } => writer.write_all(&header(*salt))?,
            // The reader skips to the page boundary, whatever position this is written at.
            Pad => writer.write_u8(Tag::Pad.into())?,
        }
        Ok(())
    }

    pub(crate) fn decode_from<R: Read>(reader: &mut R) -> Result<Self, crate::Error> {
        match reader.read_u8()?.try_into()? {
            Tag::Start => {
                let item_count = reader.read_u32::<LittleEndian>()?;
                let seqno = reader.read_u64::<LittleEndian>()?;
                Ok(Self::Start { item_count, seqno })
            }
            Tag::Item => {
                let value_type = reader.read_u8()?;
                let value_type: lsm_tree::ValueType = value_type
                    .try_into()
                    .map_err(|()| lsm_tree::Error::InvalidTag(("ValueType", value_type)))?;
                // alignfs: an indirection (a pointer into a blob file) is made by flushes,
                // never journaled; one read here is damage, which recovery reported with
                // `unreachable!()`.
                if value_type == lsm_tree::ValueType::Indirection {
                    return Err(lsm_tree::Error::InvalidTag(("ValueType", value_type.into())).into());
                }

                let compression = CompressionType::decode_from(reader)?;

                // Read keyspace ID
                let keyspace_id = reader.read_u64::<LittleEndian>()?;

                // Read key len
                let key_len = reader.read_u16::<LittleEndian>()?;

                // Read real value size
                let value_len = reader.read_u32::<LittleEndian>()?;

                // Read on-disk value size
                let on_disk_value_len = reader.read_u32::<LittleEndian>()?;

                let key = Slice::from_reader(reader, usize::from(key_len))?;

                let value = match compression {
                    CompressionType::None => {
                        // alignfs: an entry torn by a crash, with zeros after it, reads
                        // as one whose lengths disagree: the journal's end, as any other
                        // undecodable entry, not a panic (upstream's debug_assert_eq).
                        if value_len != on_disk_value_len {
                            return Err(crate::Error::InvalidTrailer);
                        }
                        read_value(reader, on_disk_value_len as usize)?
                    }

                    #[cfg(feature = "lz4")]
                    CompressionType::Lz4 => {
                        let compressed_value = read_value(reader, on_disk_value_len as usize)?;

                        // alignfs: LZ4 expands less than 256-fold; a larger claimed length is
                        // damage, and would otherwise be allocated whole before decoding.
                        if u64::from(value_len) > u64::from(on_disk_value_len) * 256 + 64 {
                            return Err(crate::Error::Decompress(CompressionType::Lz4));
                        }

                        #[warn(unsafe_code)]
                        let mut value = unsafe { Slice::builder_unzeroed(value_len as usize) };

                        let size = lz4_flex::decompress_into(&compressed_value, &mut value)
                            .map_err(|e| {
                                log::error!("LZ4 decompression failed: {e}");
                                crate::Error::Decompress(CompressionType::Lz4)
                            })?;

                        if size != value.len() {
                            log::error!("Decompressed size does not match expected value size");
                            return Err(crate::Error::Decompress(CompressionType::Lz4));
                        }

                        Slice::from(value.freeze())
                    }
                };

                Ok(Self::Item {
                    keyspace_id,
                    key,
                    value,
                    value_type,
                    compression,
                })
            }
            Tag::End => {
                let checksum = reader.read_u64::<LittleEndian>()?;

                // Check trailer
                read_magic(reader)?;

                Ok(Self::End(checksum))
            }
            Tag::Clear => {
                let keyspace_id = reader.read_u64::<LittleEndian>()?;
                Ok(Self::Clear { keyspace_id })
            }
            tag @ (Tag::Synced | Tag::SaltedSynced) => {
                let offset = reader.read_u64::<LittleEndian>()?;
                let salt = match tag {
                    Tag::SaltedSynced => Some(reader.read_u64::<LittleEndian>()?),
                    _ => None,
                };
                read_magic(reader)?;
                Ok(Self::Synced { offset, salt })
            }
            Tag::Header => {
                let salt = reader.read_u64::<LittleEndian>()?;
                read_magic(reader)?;
                Ok(Self::Header { salt })
            }
            // The zeros after it are the reader's to skip: it knows the position.
            Tag::Pad => Ok(Self::Pad),
        }
    }
}

fn read_magic<R: Read>(reader: &mut R) -> Result<(), crate::Error> {
    let mut magic = [0u8; MAGIC_BYTES.len()];
    reader.read_exact(&mut magic)?;
    if magic != MAGIC_BYTES {
        return Err(crate::Error::InvalidTrailer);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_log::test;

    #[test]
    fn test_serialize_and_deserialize_success() -> crate::Result<()> {
        let item = Entry::Item {
            keyspace_id: 0,
            key: vec![1, 2, 3].into(),
            value: vec![].into(),
            value_type: ValueType::Value,
            compression: CompressionType::None,
        };

        let serialized_data = item.encode_into_vec();
        let mut reader = &serialized_data[..];
        let deserialized_item = Entry::decode_from(&mut reader)?;

        assert_eq!(item, deserialized_item);

        Ok(())
    }

    #[test]
    fn test_invalid_deserialize() {
        let invalid_data = [Tag::Start as u8; 1]; // Should be followed by a u32

        // Try to deserialize with invalid data
        let mut reader = &invalid_data[..];
        let result = Entry::decode_from(&mut reader);

        match result {
            Ok(_) => panic!("should error"),
            Err(error) => match error {
                crate::Error::Io(e) => match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => {}
                    _ => panic!("should throw UnexpectedEof"),
                },
                _ => panic!("should throw UnexpectedEof"),
            },
        }
    }

    #[test]
    fn test_invalid_tag() {
        let invalid_data = [9u8; 1]; // Invalid tag

        // Try to deserialize with invalid data
        let mut reader = &invalid_data[..];
        let result = Entry::decode_from(&mut reader);

        match result {
            Ok(_) => panic!("should error"),
            Err(error) => match error {
                crate::Error::InvalidTag(("JournalMarkerTag", 9)) => {}
                _ => panic!("should throw InvalidTag"),
            },
        }
    }
}
