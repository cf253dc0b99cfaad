//! alignfs: a storage engine for fast SSDs that splits every write into SSD-block-aligned
//! IO and a small, unaligned residue kept in a byte-addressable fast tier.
//!
//! See `docs/ARCHITECTURE.md` for the parts, seams and invariants.

pub mod background;
pub mod codec;
pub mod device;
pub mod error;
pub mod geometry;
pub mod map;
pub mod partition;
pub mod paths;
pub mod personality;
pub mod profile;

#[doc(hidden)]
pub mod test_support;

pub use error::{CloneProblem, DeviceProblem, Error, Result, TransactionProblem};
pub mod journal;
pub mod kv;
pub mod layout;
pub mod lines;
pub mod meta;
pub mod options;
pub mod residue;
pub mod stats;
pub mod volume;

pub use geometry::Geometry;
pub use meta::{Attr, FileKind, Ino};
pub use options::{FormatOptions, MetaStoreChoice, ReadMode, VolumeOptions};
pub use profile::Profile;
pub use volume::{Devices, RecoveryReport, Volume};
