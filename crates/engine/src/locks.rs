//! One operation at a time per volume: a second request for a key that is in flight gets ABORTED
//! (the CSI spec's answer, which makes the CO retry), never a second concurrent LVM call.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

/// The keys (volume names or ids) with an operation in flight.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    keys: Arc<Mutex<HashSet<String>>>,
}

/// Held while an operation runs; releases its keys when dropped.
#[derive(Debug)]
pub struct Guard {
    keys: Arc<Mutex<HashSet<String>>>,
    held: Vec<String>,
}

impl InFlight {
    /// Claims every key in `keys`, or none: `Err(key)` names the first one already claimed.
    pub fn try_claim(&self, keys: &[&str]) -> Result<Guard, String> {
        let mut set = self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(busy) = keys.iter().find(|k| set.contains(**k)) {
            return Err((*busy).to_owned());
        }
        let mut held = Vec::with_capacity(keys.len());
        for k in keys {
            if set.insert((*k).to_owned()) {
                held.push((*k).to_owned());
            }
        }
        Ok(Guard {
            keys: self.keys.clone(),
            held,
        })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut set = self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for k in &self.held {
            set.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_key_is_busy_until_its_guard_drops() {
        let f = InFlight::default();
        let g = f.try_claim(&["a", "b"]).unwrap();
        assert_eq!(f.try_claim(&["b"]).unwrap_err(), "b");
        assert_eq!(f.try_claim(&["c", "a"]).unwrap_err(), "a");
        let c = f.try_claim(&["c"]).unwrap();
        drop(g);
        f.try_claim(&["a", "b"]).unwrap();
        drop(c);
    }

    #[test]
    fn a_failed_claim_holds_nothing() {
        let f = InFlight::default();
        let _a = f.try_claim(&["a"]).unwrap();
        assert!(f.try_claim(&["x", "a"]).is_err());
        f.try_claim(&["x"]).unwrap();
    }
}
