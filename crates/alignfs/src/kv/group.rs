//! Group commit for a KV store: batches appended under the commit lock, one sync for
//! every batch appended before it started.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fjall::{Database, PersistMode};
use parking_lot::{Condvar, Mutex};

use super::kv_error;
use crate::device::power_loss::RecordedDir;
use crate::error::{Error, Result};
use crate::journal::GroupSync;

/// Group commit for the KV store: a batch is appended to its journal under the commit
/// lock without a sync; then one sync covers every batch appended before it started.
pub(crate) struct KvGroupSync {
    pub(super) db: Database,
    pub(super) dir: PathBuf,
    /// Batches appended to the journal.
    pub(super) ordered: AtomicU64,
    /// Who runs the sync and how far the journal is durable. Never held through a sync:
    /// a commit that the running sync already covers must not wait behind the next one.
    pub(super) sync: Mutex<SyncState>,
    /// Wakes the commits waiting for a running sync when it ends.
    pub(super) sync_done: Condvar,
    /// A sync failed: memory and the journal are ahead of the disk.
    pub(super) failed: AtomicBool,
    pub(super) recorder: Option<RecordedDir>,
}

#[derive(Default)]
pub(super) struct SyncState {
    /// Batches known durable.
    pub(super) durable: u64,
    /// A commit is running a sync now.
    pub(super) running: bool,
    /// Batches the last sync covered.
    pub(super) last_group: u64,
}

impl KvGroupSync {
    /// A sync of the store returned: tell the power-loss recorder, if there is one.
    pub(super) fn synced_dir(&self) -> Result<()> {
        self.recorder.as_ref().map_or(Ok(()), RecordedDir::synced)
    }
}

impl GroupSync for KvGroupSync {
    fn ordered(&self) -> u64 {
        self.ordered.load(Ordering::SeqCst)
    }

    fn sync_through(&self, ticket: u64, commits_waiting: &dyn Fn() -> bool) -> Result<bool> {
        let mut state = self.sync.lock();
        loop {
            if state.durable >= ticket {
                return Ok(false);
            }
            if self.failed.load(Ordering::SeqCst) {
                return Err(Error::io(
                    format!("KV store {}: sync the journal", self.dir.display()),
                    std::io::Error::other("an earlier sync failed; reopen the volume"),
                ));
            }
            if !state.running {
                break;
            }
            self.sync_done.wait(&mut state);
        }
        state.running = true;
        let (durable, expected) = (state.durable, state.last_group);
        drop(state);
        let running = RunningSync(self);
        // Let a commit being ordered now in, and as many as the last sync covered, for a
        // while: the journal's writer lock is held through the sync, so anything appended
        // after it starts waits a whole sync.
        let deadline = std::time::Instant::now() + std::time::Duration::from_micros(200);
        while (commits_waiting() || self.ordered.load(Ordering::SeqCst) - durable < expected) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let target = self.ordered.load(Ordering::SeqCst);
        let synced = match self.db.persist(PersistMode::SyncData) {
            Ok(()) => self.synced_dir(),
            Err(e) => Err(kv_error(&self.dir, "sync the journal", e)),
        };
        std::mem::forget(running);
        let mut state = self.sync.lock();
        state.running = false;
        match synced {
            Ok(()) => {
                state.last_group = target - state.durable;
                state.durable = target;
            }
            Err(_) => self.failed.store(true, Ordering::SeqCst),
        }
        drop(state);
        self.sync_done.notify_all();
        synced.map(|()| true)
    }
}

/// Held by the commit that runs a sync, and forgotten once it records the outcome. If the
/// sync unwinds instead (a panic in fjall or in the caller's check), dropping this marks
/// the store failed and wakes the commits waiting: they get an error rather than waiting
/// for a sync that never ends.
struct RunningSync<'a>(&'a KvGroupSync);

impl Drop for RunningSync<'_> {
    fn drop(&mut self) {
        self.0.failed.store(true, Ordering::SeqCst);
        self.0.sync.lock().running = false;
        self.0.sync_done.notify_all();
    }
}
