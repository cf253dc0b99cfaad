//! The maintenance thread: migration past the high watermark, namespace ops held back
//! past the commit interval, and a checkpoint when the journal is half full.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{migrate, Engine};
use crate::background::spawn;
use crate::error::Result;
use crate::stats::Counter;

/// Start the maintenance thread: migration past the high watermark, and a checkpoint
/// when the journal is half full.
pub(crate) fn start(engine: &Arc<Engine>) -> Result<JoinHandle<()>> {
    let worker = Arc::clone(engine);
    spawn("alignfs-maint".into(), move || {
        lower_priority();
        maintenance_loop(&worker)
    })
}

fn maintenance_loop(engine: &Engine) {
    while !engine.shutting_down() {
        engine.migrator.wait(Duration::from_millis(200));
        if engine.shutting_down() {
            break;
        }
        let capacity = engine.residue.capacity_units();
        let used = engine.residue.used_units();
        if used as f64 > engine.options.migrate_high * capacity as f64 {
            let target_free = capacity - (engine.options.migrate_low * capacity as f64) as u64;
            if let Err(e) = migrate::merge_some(engine, target_free, Counter::migrations_watermark) {
                tracing::warn!("background migration: {e}");
            }
        }
        let interval = engine.options.commit_interval;
        if engine.committer.deferred_since().is_some_and(|since| since.elapsed() >= interval) {
            if let Err(e) = engine.sync_deferred() {
                tracing::error!("committing deferred namespace operations: {e}");
            }
        }
        let half_full = engine.committer.wants_checkpoint();
        if half_full {
            if let Err(e) = engine.checkpoint() {
                tracing::error!("background checkpoint: {e}");
            }
        }
    }
}

/// Background merging gives way to the application's threads when CPUs are short (nice
/// 10, this thread only): if it falls behind, writers that find the fast tier full merge
/// for themselves, so it cannot starve.
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread; failure only leaves the priority as is.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}
