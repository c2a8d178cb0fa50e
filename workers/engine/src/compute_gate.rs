//! The compute gate: on a host shared with background work (the embedding
//! worker `up` starts), generation computes first, and the background
//! computes only while no engine does.
//!
//! Lowering the background's scheduling class is not enough: a compute
//! thread that waits at a join yields its core (rayon's idle loop calls
//! `sched_yield` a few dozen times before it sleeps), a yield hands the
//! core to any runnable task, idle class included, and the yielder gets it
//! back only at the next scheduler tick. Every join of a forward pass
//! could so cost up to a tick: measured through `up` on a two-core Xeon,
//! an embedding flood beside 64-token prompts raised their p50 time to
//! first token by a quarter and their p99 by half, while the compute each
//! prompt took stayed the same.
//!
//! The gate is a file both sides open, and its lock is the state:
//! - an engine holds a *shared* lock while it has work ([`ComputeGate::hold`]
//!   before a step, [`ComputeGate::release`] before it waits for commands);
//!   any number of engines hold it at once, and taking it never waits for
//!   the background (which only ever holds it for an instant);
//! - the background calls [`ComputeGate::wait_idle`] between pieces of its
//!   work: it tries the *exclusive* lock, which the kernel grants only
//!   when no engine holds the shared one, and drops it at once; refused,
//!   it sleeps a millisecond and tries again. While an engine computes,
//!   the background sleeps, not on a core. After `most` it goes on with
//!   one piece anyway, so that under a generation load that never pauses
//!   it still moves (a piece of a few milliseconds per `most`), and its
//!   callers are answered late rather than never.
//!
//! The lock is `flock(2)`'s, tied to the open file: a process that dies
//! holding it releases it, so a crashed engine cannot stall the background.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// One side's handle on the gate file.
#[derive(Debug)]
pub struct ComputeGate {
    file: File,
    held: bool,
}

impl ComputeGate {
    /// Opens (creating if missing) the gate file at `path`, and checks that
    /// its file system takes locks: a gate that cannot lock is refused here,
    /// not found out mid-serving.
    pub fn open(path: &Path) -> io::Result<ComputeGate> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        file.lock_shared()?;
        file.unlock()?;
        Ok(ComputeGate { file, held: false })
    }

    /// Engine side: marks this engine computing (no-op while it already is).
    ///
    /// # Errors
    /// If the kernel refuses the lock (then the background is not held off).
    pub fn hold(&mut self) -> io::Result<()> {
        if !self.held {
            self.file.lock_shared()?;
            self.held = true;
        }
        Ok(())
    }

    /// Engine side: marks this engine idle (no-op while it already is).
    ///
    /// # Errors
    /// If the kernel refuses to unlock (the file's close still would).
    pub fn release(&mut self) -> io::Result<()> {
        if self.held {
            self.file.unlock()?;
            self.held = false;
        }
        Ok(())
    }

    /// Whether this handle holds the gate (engine side).
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Background side: returns once no engine computes, sleeping until
    /// then, or after `most` however the engines are; `Ok(true)` when it
    /// had to wait.
    ///
    /// # Errors
    /// If the kernel refuses the lock.
    pub fn wait_idle(&self, most: Duration) -> io::Result<bool> {
        let start = Instant::now();
        let mut waited = false;
        loop {
            match self.file.try_lock() {
                Ok(()) => {
                    self.file.unlock()?;
                    return Ok(waited);
                }
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(e),
            }
            if start.elapsed() >= most {
                return Ok(true);
            }
            waited = true;
            std::thread::sleep(POLL);
        }
    }
}

/// How long the background sleeps between two tries of the gate.
const POLL: Duration = Duration::from_millis(1);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn gate_path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("bulkhead-gate-{}-{name}", std::process::id()))
    }

    #[test]
    fn the_background_waits_while_an_engine_holds_the_gate_and_goes_on_when_it_releases() {
        let path = gate_path("wait");
        let mut engine = ComputeGate::open(&path).expect("gate");
        let background = ComputeGate::open(&path).expect("gate");
        assert_eq!(
            background.wait_idle(Duration::from_secs(60)).ok(),
            Some(false),
            "an idle gate"
        );

        engine.hold().expect("hold");
        assert!(engine.is_held());
        // Bounded: after `most`, the background goes on anyway.
        let start = Instant::now();
        assert_eq!(
            background.wait_idle(Duration::from_millis(50)).ok(),
            Some(true)
        );
        assert!(start.elapsed() >= Duration::from_millis(50));
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let waited = background.wait_idle(Duration::from_secs(60));
            let _ = tx.send(());
            waited
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the background went on while the engine held the gate"
        );
        engine.release().expect("release");
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "the background did not go on once the engine released the gate"
        );
        let waited = waiter.join().expect("waiter");
        assert_eq!(waited.ok(), Some(true));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn engines_hold_the_gate_together_and_a_dropped_holder_releases_it() {
        let path = gate_path("shared");
        let mut a = ComputeGate::open(&path).expect("gate");
        let mut b = ComputeGate::open(&path).expect("gate");
        a.hold().expect("a holds");
        b.hold().expect("b holds beside a");
        a.release().expect("a releases");
        let probe = File::open(&path).expect("probe");
        assert!(
            matches!(probe.try_lock(), Err(TryLockError::WouldBlock)),
            "b still holds the gate"
        );
        drop(b);
        assert!(probe.try_lock().is_ok(), "a dropped holder released it");
        let _ = std::fs::remove_file(&path);
    }
}
