//! Typed errors. Operating errors (bad media, full device, bad input) are values;
//! bugs panic. Mapping to errno happens once, in [`Error::errno`].

use std::path::PathBuf;

/// Everything the engine can report to a caller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The OS error is part of the message, not a separate source, so that a chain of
    /// causes printed in full names it once.
    #[error("{context}: {error}")]
    Io { context: String, error: std::io::Error },
    #[error("{structure} at byte {offset} of {device}: {problem}")]
    Corrupt { structure: &'static str, device: String, offset: u64, problem: String },
    /// A device to be formatted holds an alignfs structure (`found` says which).
    #[error("{device} already holds {found}; pass --force to overwrite it")]
    AlreadyFormatted { device: String, found: String },
    #[error("{0} does not hold an alignfs volume (no superblock magic)")]
    NotFormatted(String),
    #[error("the fast tier and the SSD belong to different volumes ({fast} vs {ssd})")]
    VolumeMismatch { fast: String, ssd: String },
    #[error("invalid geometry: {0}")]
    Geometry(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An object-store transaction the engine refuses before changing anything.
    #[error("{0}")]
    BadTransaction(TransactionProblem),
    /// A clone (reflink) the engine refuses before changing anything.
    #[error("{0}")]
    BadClone(CloneProblem),
    #[error("cannot move a directory into itself")]
    MoveIntoItself,
    #[error("negative offset {0}")]
    NegativeOffset(i64),
    /// A byte range a device or call takes only in whole units of `unit` bytes.
    #[error("{what} of {len} bytes at {offset} is not in whole {unit}-byte units")]
    Unaligned { what: &'static str, offset: u64, len: u64, unit: u64 },
    /// A memory-semantic SSD transaction that is not open (never begun, or ended).
    #[error("transaction {0} is not open")]
    NoSuchTransaction(u32),
    /// The devices named do not make up the volume or suit its profile.
    #[error("{0}")]
    WrongDevices(DeviceProblem),
    #[error("{0}")]
    UnknownProfile(String),
    #[error("{0}")]
    BadSize(String),
    /// A file, object or extended-attribute name the volume cannot hold.
    #[error("{0}")]
    InvalidName(String),
    #[error("not a regular file")]
    NotAFile,
    /// The volume holds another personality's layout (a block volume opened as an
    /// object store, or none at all).
    #[error("{0}")]
    WrongPersonality(String),
    #[error("no space left on the SSD")]
    NoSpace,
    #[error("metadata does not fit: {0}")]
    MetadataFull(String),
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("file too large")]
    FileTooLarge,
    #[error("read-only volume")]
    ReadOnly,
    #[error("operation not supported: {0}")]
    Unsupported(String),
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    /// Another open of the device holds it: a daemon serving the volume, or a reader.
    #[error("{} is in use by {}", path.display(), holder.map_or_else(|| "another process".to_string(), |pid| format!("process {pid}")))]
    InUse { path: PathBuf, holder: Option<u32> },
    #[error("no such extended attribute")]
    NoAttribute,
    #[error("too large: {0}")]
    TooLarge(String),
    #[error("offset is beyond the end of the file")]
    BeyondEnd,
    #[error("{len} bytes at {offset} are outside the {size}-byte volume")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("injected fault: {0}")]
    Injected(&'static str),
    #[error("bad file descriptor (not open, or not open for this access)")]
    BadDescriptor,
    #[error("{0} is a null pointer")]
    BadAddress(&'static str),
    #[error("path {0} is unusable: {1}")]
    BadPath(PathBuf, String),
    /// Asked not to wait, and the data is not in memory (see `Volume::read_if_cached`).
    #[error("the data is not in memory and the caller asked not to wait for the device")]
    WouldBlock,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a set of devices does not make up a volume, or does not suit its profile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceProblem {
    #[error("no SSD named")]
    NoSsd,
    /// The profile's rule about its devices (`rule` completes "profile NAME …").
    #[error("profile {profile} {rule}")]
    Profile { profile: &'static str, rule: &'static str },
    #[error("profile {profile} takes {}, not {given}", if *max == 1 { "one SSD".to_string() } else { format!("{max} SSDs at most") })]
    TooManySsds { profile: &'static str, max: u32, given: usize },
    /// The devices are of another kind than the volume's profile is made of.
    #[error("a volume of profile {profile} is made of {needs}, not {given}")]
    Kind { profile: &'static str, needs: &'static str, given: &'static str },
    #[error("{} holds no multi-SSD volume; name one SSD", path.display())]
    NotMultiSsd { path: PathBuf },
    #[error("the volume spans {volume} SSDs; name them all, in any order ({named} given, the first holding SSD {first_index})")]
    SsdCount { volume: u32, named: usize, first_index: u32 },
    #[error("{} is SSD {index} of the volume, which was named twice", path.display())]
    SsdNamedTwice { path: PathBuf, index: u32 },
    #[error("{ssd} holds a volume of profile {profile}, which needs its fast tier too (--fast)")]
    FastTierMissing { ssd: String, profile: &'static str },
    #[error("NVM ranges need a fast tier (--fast) to hold them")]
    NvmRangesWithoutFastTier,
    #[error(
        "the NVM ranges take {ranges} bytes and the fast tier holds {fast}: it must also hold the volume's metadata \
         and NVM buffer, so make it larger than the ranges (--fast PATH:SIZE)"
    )]
    NvmRangesFillFastTier { ranges: u64, fast: u64 },
    #[error("the volume's NVM zone ends at byte {end} of the fast tier, which holds {fast} bytes")]
    NvmZoneBeyondFastTier { end: u64, fast: u64 },
    /// The DRAM file and the flash image belong to different memory-semantic SSDs.
    #[error(
        "the flash image {flash} belongs to memory-semantic SSD {flash_device:016x}, the DRAM {dram} to \
         {dram_device:016x}: name the DRAM and flash of one device"
    )]
    MssdHalves { flash: String, flash_device: u64, dram: String, dram_device: u64 },
    #[error("{} is not empty and holds no alignfs KV store; name a new or empty directory", dir.display())]
    NotAKvStore { dir: PathBuf },
}

/// Why an object-store transaction is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionProblem {
    #[error("a transaction holds at most {max} changes, not {given}")]
    TooManyChanges { max: usize, given: usize },
    #[error("a transaction changes the name {:?} twice", String::from_utf8_lossy(.0))]
    NameChangedTwice(Vec<u8>),
    #[error("a transaction sets two attributes of inode {0}")]
    AttributesSetTwice(u64),
    #[error("a transaction drops two names of inode {0}")]
    NamesDroppedTwice(u64),
    #[error("a transaction sets an attribute of inode {0} while removing it")]
    AttributeOfRemoved(u64),
}

/// Why a clone is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloneProblem {
    #[error("a clone goes to a multiple of the block size ({block}), not {offset}")]
    Unaligned { offset: u64, block: u64 },
    #[error("a clone to offset {0} would replace data of the target")]
    WouldReplace(u64),
    #[error("a file cannot be cloned onto itself")]
    OntoItself,
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), error: source }
    }

    pub(crate) fn corrupt(structure: &'static str, device: &str, offset: u64, problem: impl Into<String>) -> Self {
        Error::Corrupt { structure, device: device.to_string(), offset, problem: problem.into() }
    }

    /// The errno a POSIX front end should return for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { error, .. } => error.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } | Error::Injected(_) => libc::EIO,
            Error::AlreadyFormatted { .. } | Error::Exists => libc::EEXIST,
            Error::NotFormatted(_) | Error::VolumeMismatch { .. } => libc::EINVAL,
            Error::Geometry(_) | Error::InvalidArgument(_) | Error::BadPath(..) => libc::EINVAL,
            Error::BadTransaction(_) | Error::BadClone(_) | Error::MoveIntoItself | Error::NegativeOffset(_) => libc::EINVAL,
            Error::Unaligned { .. } | Error::NoSuchTransaction(_) => libc::EINVAL,
            Error::WrongDevices(_) | Error::UnknownProfile(_) | Error::BadSize(_) | Error::WrongPersonality(_) => libc::EINVAL,
            Error::InvalidName(_) | Error::NotAFile => libc::EINVAL,
            Error::NoSpace | Error::MetadataFull(_) => libc::ENOSPC,
            Error::NotFound => libc::ENOENT,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::FileTooLarge => libc::EFBIG,
            Error::ReadOnly => libc::EROFS,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::NotPermitted(_) => libc::EPERM,
            Error::NoAttribute => libc::ENODATA,
            Error::InUse { .. } => libc::EBUSY,
            Error::TooLarge(_) => libc::E2BIG,
            Error::BeyondEnd => libc::ENXIO,
            Error::OutOfRange { .. } => libc::EINVAL,
            Error::BadDescriptor => libc::EBADF,
            Error::BadAddress(_) => libc::EFAULT,
            Error::WouldBlock => libc::EAGAIN,
        }
    }
}
