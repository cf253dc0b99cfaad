//! The migrator's state: merges in flight and the maintenance thread's wake-up. The
//! merges themselves are functions over the engine, in `migrate`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::background::Wakeup;

/// What the engine keeps for its merges of residue into whole blocks, and for the
/// maintenance thread that starts them past the residue tier's high watermark (and
/// checkpoints the metadata store).
#[derive(Default)]
pub(crate) struct Migrator {
    /// Background merges between their first allocation and their commit.
    merges_in_flight: AtomicU64,
    /// Wakes the maintenance thread.
    due: Wakeup,
}

impl Migrator {
    /// Wake the maintenance thread: migration may be due, or a checkpoint, or shutdown.
    pub(super) fn wake(&self) {
        self.due.notify();
    }

    /// The maintenance thread waits for a wake-up, or `timeout`.
    pub(super) fn wait(&self, timeout: Duration) {
        self.due.wait(timeout);
    }

    /// A background merge took its first block: [`Migrator::settle`] waits for it.
    pub(super) fn merge_started(&self) {
        self.merges_in_flight.fetch_add(1, Ordering::SeqCst);
    }

    /// A background merge committed, or gave up.
    pub(super) fn merge_ended(&self) {
        self.merges_in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wait until no background merge is in flight.
    pub(super) fn settle(&self) {
        while self.merges_in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
