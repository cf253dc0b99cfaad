//! Open directory handles: each keeps the listing it started with, so entries added or
//! removed while a reader walks the directory cannot shift the offsets it resumes from.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use alignfs::volume::DirEntry;
use parking_lot::Mutex;

#[derive(Default)]
pub struct Handles {
    next: AtomicU64,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
}

impl Handles {
    pub fn open_dir(&self, entries: Vec<DirEntry>) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.dirs.lock().insert(fh, Arc::new(entries));
        fh
    }

    pub fn refresh_dir(&self, fh: u64, entries: Vec<DirEntry>) {
        self.dirs.lock().insert(fh, Arc::new(entries));
    }

    /// The handle's listing (empty for an unknown handle).
    pub fn dir_entries(&self, fh: u64) -> Arc<Vec<DirEntry>> {
        self.dirs.lock().get(&fh).cloned().unwrap_or_default()
    }

    pub fn close_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }
}
