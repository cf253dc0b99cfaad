//! The profile a volume was formatted with, as its superblock records it: a code. What a
//! code means (its name, devices, rules and policies) is [`crate::profile`]'s to say; the
//! on-media layout knows only the number.

/// A profile, by its on-media code. Only [`crate::profile`] makes values of it, and only
/// of codes it has registered, so every value names a profile this build has.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Profile(pub(crate) u32);

impl Profile {
    pub fn code(self) -> u32 {
        self.0
    }
}
