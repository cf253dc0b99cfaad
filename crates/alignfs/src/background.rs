//! Background threads: how they are started and woken.

use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

/// A wake-up for a background thread: `notify` makes the next (or current) `wait` return.
#[derive(Default)]
pub struct Wakeup {
    due: Mutex<bool>,
    cond: Condvar,
}

impl Wakeup {
    pub fn notify(&self) {
        *self.due.lock() = true;
        self.cond.notify_all();
    }

    /// Until notified or `timeout` passed; clears the notification.
    pub fn wait(&self, timeout: Duration) {
        let mut due = self.due.lock();
        if !*due {
            self.cond.wait_for(&mut due, timeout);
        }
        *due = false;
    }
}

/// Start a named thread; failure to start is an error, not a panic.
pub fn spawn(name: String, work: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.clone()).spawn(work).map_err(|e| Error::io(format!("start thread {name}"), e))
}
