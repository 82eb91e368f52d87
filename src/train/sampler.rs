//! Which samples each worker trains on: PyTorch's `DistributedSampler`
//! semantics (disjoint shards, reshuffled every epoch from `seed + epoch`,
//! `drop_last` or padding), with a shuffle that is stable across builds and
//! platforms, so a resumed run sees exactly the batches it would have.

use serde::{Deserialize, Serialize};

/// Splits a dataset of `len` samples among `world_size` workers.
///
/// ```
/// use nimbus::train::DistributedSampler;
/// let rank0 = DistributedSampler::new(10, 2, 0).seed(7);
/// let rank1 = DistributedSampler::new(10, 2, 1).seed(7);
/// let (a, b) = (rank0.indices(3), rank1.indices(3));
/// assert_eq!(a.len(), 5);
/// assert!(a.iter().all(|i| !b.contains(i)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistributedSampler {
    len: usize,
    world_size: usize,
    rank: usize,
    seed: u64,
    shuffle: bool,
    drop_last: bool,
}

impl DistributedSampler {
    /// Shuffled, padded (not `drop_last`), seed 0.
    pub fn new(len: usize, world_size: usize, rank: usize) -> Self {
        DistributedSampler {
            len,
            world_size: world_size.max(1),
            rank,
            seed: 0,
            shuffle: true,
            drop_last: false,
        }
    }

    /// The seed the per-epoch shuffle derives from.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether to shuffle (default true).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// Drop the tail that does not divide evenly, instead of padding it
    /// with samples from the start (default false).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Samples per worker per epoch.
    pub fn num_samples(&self) -> usize {
        let world = self.world_size;
        if self.drop_last && self.len % world != 0 {
            (self.len - world).div_ceil(world)
        } else {
            self.len.div_ceil(world)
        }
    }

    /// This worker's sample indices for `epoch`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            shuffle(&mut all, self.seed.wrapping_add(epoch));
        }
        let total = self.num_samples() * self.world_size;
        if total <= all.len() {
            all.truncate(total);
        } else if !all.is_empty() {
            let mut padded = Vec::with_capacity(total);
            while padded.len() < total {
                let take = (total - padded.len()).min(all.len());
                padded.extend_from_slice(&all[..take]);
            }
            all = padded;
        }
        all.into_iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .collect()
    }

    /// This worker's batches of `batch_size` for `epoch` (the last one may
    /// be short).
    pub fn batches(&self, epoch: u64, batch_size: usize) -> Vec<Vec<usize>> {
        self.indices(epoch)
            .chunks(batch_size.max(1))
            .map(<[usize]>::to_vec)
            .collect()
    }
}

/// Fisher–Yates with splitmix64: fixed here, so permutations never change
/// with a dependency's version.
fn shuffle(values: &mut [usize], seed: u64) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..values.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        values.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_cover_the_data_and_reshuffle_each_epoch() {
        let samplers: Vec<_> = (0..3)
            .map(|r| DistributedSampler::new(12, 3, r).seed(1))
            .collect();
        let mut seen: Vec<usize> = samplers.iter().flat_map(|s| s.indices(0)).collect();
        seen.sort();
        assert_eq!(seen, (0..12).collect::<Vec<_>>());
        assert_ne!(samplers[0].indices(0), samplers[0].indices(1));
        assert_eq!(samplers[0].indices(5), samplers[0].indices(5));
    }

    #[test]
    fn padding_and_drop_last_follow_pytorch() {
        // 10 samples over 3 workers: padded to 12, or dropped to 9.
        let padded = DistributedSampler::new(10, 3, 0).shuffle(false);
        assert_eq!(padded.num_samples(), 4);
        assert_eq!(padded.indices(0), vec![0, 3, 6, 9]);
        assert_eq!(
            DistributedSampler::new(10, 3, 1).shuffle(false).indices(0),
            vec![1, 4, 7, 0]
        );
        let dropped = DistributedSampler::new(10, 3, 2)
            .shuffle(false)
            .drop_last(true);
        assert_eq!(dropped.num_samples(), 3);
        assert_eq!(dropped.indices(0), vec![2, 5, 8]);
        assert_eq!(padded.batches(0, 3), vec![vec![0, 3, 6], vec![9]]);
    }
}
