//! The sanlock turn: one file lock, held by whatever runs guests that hold sanlock leases on a
//! shared disk image with short I/O timeouts, for as long as they hold them. In CI run 17 the
//! installed nodes' lease renewal starved for 50 s while the two-node lost-LUN-path phase ran
//! beside them, and a live node was fenced; so no two such parts run at once. `cargo xtask test`
//! takes the turn for each two-node phase before starting it (`lanes`), and `cargo xtask
//! installed` takes it itself, only around its shared-LUN scenario: its node-local scenarios,
//! more than half its time, run beside the two-node phases (ADR 0036).
//!
//! A file lock rather than a flag in the lanes' memory, because the installed phase is another
//! process; the kernel drops it when its holder exits, killed or not.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use rustix::fs::{FlockOperation, flock};

/// Where `cargo xtask test` tells its phases the turn's file is; unset, nothing waits for a turn.
pub const ENV: &str = "LVMS_SANLOCK_TURN";

/// A held turn; dropping it (or the holder's exit) gives it back.
#[derive(Debug)]
pub struct Turn {
    _file: fs::File,
}

fn open(path: &Path) -> Result<fs::File> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening the sanlock turn {}", path.display()))
}

impl Turn {
    /// The turn if nobody holds it now.
    pub fn try_take(path: &Path) -> Result<Option<Turn>> {
        let file = open(path)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(Turn { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("locking {}", path.display())),
        }
    }

    /// Waits for the turn named by [`ENV`], and says how long it waited; `None` when [`ENV`] is
    /// unset (a run of its own, with nothing beside it).
    pub fn take_from_env() -> Result<Option<(Turn, Duration)>> {
        let Some(path) = std::env::var_os(ENV).map(PathBuf::from) else {
            return Ok(None);
        };
        let file = open(&path)?;
        let started = Instant::now();
        flock(&file, FlockOperation::LockExclusive)
            .with_context(|| format!("waiting for the sanlock turn {}", path.display()))?;
        Ok(Some((Turn { _file: file }, started.elapsed())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_the_turn_comes_back_when_dropped() {
        let path = std::env::temp_dir().join(format!("lvms-sanlock-turn-{}", std::process::id()));
        let first = Turn::try_take(&path)
            .unwrap()
            .expect("a free turn is taken");
        assert!(
            Turn::try_take(&path).unwrap().is_none(),
            "a held turn is not given twice"
        );
        drop(first);
        assert!(Turn::try_take(&path).unwrap().is_some());
        let _ = fs::remove_file(path);
    }
}
