//! The cluster's set of workers that may have work: a bitset its per-step scans walk in
//! worker order, so that idle workers cost nothing.

/// A set of worker indices as a bitset, visited in increasing order.
#[derive(Clone, Debug, Default)]
pub(super) struct ActiveSet {
    words: Vec<u64>,
}

impl ActiveSet {
    pub(super) fn new(len: usize) -> ActiveSet {
        ActiveSet {
            words: vec![0; len.div_ceil(64)],
        }
    }

    pub(super) fn insert(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
    }

    pub(super) fn remove(&mut self, i: usize) {
        self.words[i / 64] &= !(1 << (i % 64));
    }

    /// The smallest member `>= from`.
    pub(super) fn next_from(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        let mut bits = self.words.get(word)? & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.words.get(word)?;
        }
    }

    /// Members in increasing order.
    pub(super) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let mut next = self.next_from(0);
        std::iter::from_fn(move || {
            let i = next?;
            next = self.next_from(i + 1);
            Some(i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ActiveSet;

    #[test]
    fn active_set_visits_members_in_order() {
        let mut set = ActiveSet::new(200);
        for i in [0, 5, 63, 64, 65, 130, 199] {
            set.insert(i);
        }
        set.remove(5);
        set.insert(63);
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 63, 64, 65, 130, 199]);
        assert_eq!(set.next_from(66), Some(130));
        assert_eq!(set.next_from(200), None);
        assert_eq!(ActiveSet::new(0).next_from(0), None);
    }
}
