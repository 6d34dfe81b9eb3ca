use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The order in which training examples are visited: an endless stream made of one fresh
/// permutation of the data set per epoch, determined by the seed alone. Its epochs are those
/// of [`Epochs`](crate::Epochs): a step's examples start at
/// [`Epochs::position`](crate::Epochs::position), and the permutation they come from is the
/// whole part of [`Epochs::epoch_at`](crate::Epochs::epoch_at).
///
/// Position `p` of the stream is example `perm(p / n)[p % n]`, so any worker can compute any
/// batch without talking to the others, and a resumed run sees the same data as an
/// uninterrupted one.
#[derive(Debug, Clone)]
pub struct EpochOrder {
    seed: u64,
    epoch: Option<u64>,
    perm: Vec<u32>,
}

impl EpochOrder {
    /// The order over `examples` examples for `seed`.
    pub fn new(seed: u64, examples: usize) -> Self {
        Self {
            seed,
            epoch: None,
            perm: (0..examples as u32).collect(),
        }
    }

    /// Fills `batch` with the examples at stream positions `start..start + batch.len()`.
    pub fn fill(&mut self, start: u64, batch: &mut [u32]) {
        let n = self.perm.len() as u64;
        if n == 0 {
            return;
        }
        for (i, slot) in batch.iter_mut().enumerate() {
            let position = start + i as u64;
            let epoch = position / n;
            if self.epoch != Some(epoch) {
                self.shuffle_for(epoch);
            }
            *slot = self.perm[(position % n) as usize];
        }
    }

    fn shuffle_for(&mut self, epoch: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(epoch);
        self.perm.sort_unstable();
        self.perm.shuffle(&mut rng);
        self.epoch = Some(epoch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_is_a_permutation_and_epochs_differ() {
        let mut order = EpochOrder::new(3, 50);
        let mut first = vec![0; 50];
        let mut second = vec![0; 50];
        order.fill(0, &mut first);
        order.fill(50, &mut second);
        assert_ne!(first, second);
        for epoch in [&first, &second] {
            let mut sorted = epoch.clone();
            sorted.sort();
            assert_eq!(sorted, (0..50).collect::<Vec<u32>>());
        }
    }

    #[test]
    fn batches_spanning_epochs_match_the_stream_and_another_instance() {
        let mut stream = vec![0; 150];
        EpochOrder::new(9, 50).fill(0, &mut stream);
        let mut other = EpochOrder::new(9, 50);
        let mut batch = vec![0; 30];
        for start in [40u64, 0, 120, 45] {
            other.fill(start, &mut batch);
            assert_eq!(batch, stream[start as usize..start as usize + 30]);
        }
        let mut seeded_differently = vec![0; 150];
        EpochOrder::new(10, 50).fill(0, &mut seeded_differently);
        assert_ne!(stream, seeded_differently);
    }
}
