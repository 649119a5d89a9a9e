//! Stream slots of a shared index: each stream owns one bit of the `u128` stream sets while it
//! exists. The lowest free slot is taken first; a slot is given back only after the removal of
//! its stream's bits has been published, so a new stream never inherits an old one's bits.

/// The free slots, as a bitmap.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    free: u128,
    max: usize,
}

impl Slots {
    /// `max` slots (at most 128), all free.
    pub fn new(max: usize) -> Self {
        let max = max.min(128);
        let free = if max == 128 { u128::MAX } else { (1u128 << max) - 1 };
        Slots { free, max }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// The lowest free slot, now taken; `None` when all are taken.
    pub fn take(&mut self) -> Option<u8> {
        if self.free == 0 {
            return None;
        }
        let s = self.free.trailing_zeros() as u8;
        self.free &= !(1u128 << s);
        Some(s)
    }

    /// Frees a taken slot.
    pub fn give_back(&mut self, slot: u8) {
        debug_assert!(self.free & (1u128 << slot) == 0, "slot {slot} was free");
        self.free |= 1u128 << slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_lowest_free_slot_up_to_the_limit_and_reuses_given_back_ones() {
        let mut s = Slots::new(3);
        assert_eq!((s.take(), s.take(), s.take(), s.take()), (Some(0), Some(1), Some(2), None));
        s.give_back(1);
        assert_eq!(s.take(), Some(1));
        let mut all = Slots::new(500);
        assert_eq!(all.max(), 128);
        assert_eq!((0..128).filter_map(|_| all.take()).last(), Some(127));
        assert_eq!(all.take(), None);
        assert_eq!(Slots::new(0).take(), None);
    }
}
