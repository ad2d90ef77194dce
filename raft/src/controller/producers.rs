//! Producer ids and epochs, allocated by the controller so that every
//! broker of a cluster hands out ids from one sequence and bumps one
//! epoch per id (docs/PROTOCOL.md, "Routed and idempotent produce").
//!
//! The rules are the single-node broker's: ids count up from 1 and are
//! never handed out again (the last one is in the state, so in the
//! snapshot and in every replica's log); a known id asking again gets
//! its next epoch, which fences the older ones; at most
//! [`MAX_PRODUCER_EPOCHS`] latest epochs are kept, the lowest ids first
//! out, and the highest evicted epoch is a floor the next epoch of a
//! forgotten id starts above.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most producers whose latest epoch (above 0) the controller keeps.
pub const MAX_PRODUCER_EPOCHS: usize = 100_000;

/// The controller's producer ids.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProducerIds {
    /// The last id handed out (0: none yet).
    pub last_id: u64,
    /// The latest epoch of each producer that took one above 0.
    pub epochs: BTreeMap<u64, u32>,
    /// The highest epoch evicted from `epochs`.
    pub epoch_floor: u32,
}

/// Why an `InitProducer` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProducerInitError {
    /// The id was never handed out (0, or past the last one).
    #[error("producer id {0} was never handed out: ask for a new one")]
    Unknown(u64),
    /// The id has used every epoch.
    #[error("producer id {0} has no epoch left: ask for a new id")]
    EpochExhausted(u64),
    /// Every id was handed out.
    #[error("no producer id left")]
    IdsExhausted,
}

impl ProducerIds {
    /// A new id (epoch 0), or for `Some(id)` the id's next epoch.
    pub fn init(&mut self, producer: Option<u64>) -> Result<(u64, u32), ProducerInitError> {
        match producer {
            None => {
                let id = self
                    .last_id
                    .checked_add(1)
                    .ok_or(ProducerInitError::IdsExhausted)?;
                self.last_id = id;
                Ok((id, 0))
            }
            Some(id) if id == 0 || id > self.last_id => Err(ProducerInitError::Unknown(id)),
            Some(id) => {
                let epoch = self
                    .epochs
                    .get(&id)
                    .copied()
                    .unwrap_or(self.epoch_floor)
                    .checked_add(1)
                    .ok_or(ProducerInitError::EpochExhausted(id))?;
                if !self.epochs.contains_key(&id) && self.epochs.len() >= MAX_PRODUCER_EPOCHS {
                    if let Some((_, evicted)) = self.epochs.pop_first() {
                        self.epoch_floor = self.epoch_floor.max(evicted);
                    }
                }
                self.epochs.insert(id, epoch);
                Ok((id, epoch))
            }
        }
    }

    /// The latest epoch of `producer` the controller knows (0 when it
    /// took none above it, or was forgotten).
    pub fn epoch(&self, producer: u64) -> u32 {
        self.epochs.get(&producer).copied().unwrap_or(0)
    }

    /// Whether `producer` was handed out.
    pub fn handed_out(&self, producer: u64) -> bool {
        producer != 0 && producer <= self.last_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_count_up_and_a_known_id_takes_its_next_epoch() {
        let mut p = ProducerIds::default();
        assert_eq!(p.init(None), Ok((1, 0)));
        assert_eq!(p.init(None), Ok((2, 0)));
        assert_eq!(p.init(Some(1)), Ok((1, 1)));
        assert_eq!(p.init(Some(1)), Ok((1, 2)));
        assert_eq!(p.epoch(1), 2);
        assert_eq!(p.epoch(2), 0);
        assert_eq!(p.init(Some(3)), Err(ProducerInitError::Unknown(3)));
        assert_eq!(p.init(Some(0)), Err(ProducerInitError::Unknown(0)));
        assert_eq!(p.init(None), Ok((3, 0)));
        assert!(p.handed_out(3) && !p.handed_out(4) && !p.handed_out(0));
    }

    #[test]
    fn a_forgotten_producer_still_fences_its_old_epochs() {
        let mut p = ProducerIds::default();
        for _ in 0..=MAX_PRODUCER_EPOCHS {
            p.init(None).unwrap();
        }
        // Producer 1 goes to epoch 5, then is evicted by the others.
        for _ in 0..5 {
            p.init(Some(1)).unwrap();
        }
        for id in 2..=MAX_PRODUCER_EPOCHS as u64 + 1 {
            p.init(Some(id)).unwrap();
        }
        assert_eq!(p.epochs.len(), MAX_PRODUCER_EPOCHS);
        assert!(!p.epochs.contains_key(&1));
        let (_, epoch) = p.init(Some(1)).unwrap();
        assert!(epoch > 5, "epoch {epoch} fences the forgotten epoch 5");
    }
}
