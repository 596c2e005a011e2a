//! What the engine's full-device tests share (cleaner.rs, space_waits.rs,
//! freeing_waits.rs): seeded block contents, seed lists, and a device
//! filled with small blocks at random keys (a map leaf per block moved,
//! the cleaner's hardest case).

#![allow(dead_code)]

use std::collections::BTreeMap;

use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::Lld;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Block contents are a function of (seed, length), so a model keeps two
/// numbers per block.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    r.fill(&mut v[..]);
    v
}

/// The seeds `defaults`, or `LDFS_SEED` alone.
pub fn seeds(defaults: std::ops::RangeInclusive<u64>) -> Vec<u64> {
    match std::env::var("LDFS_SEED") {
        Ok(v) => vec![v.parse().expect("LDFS_SEED must be a number")],
        Err(_) => defaults.collect(),
    }
}

/// (list, index) -> (seed, length) of every block written.
pub type Model = BTreeMap<(u64, u64), (u64, usize)>;

/// Four lists filled with blocks of 200..1200 bytes at random keys until a
/// `1/stop`-th of the capacity is left: the lists, the model, and the keys
/// in the order first written.
pub fn fill_small_random(
    lld: &Lld,
    rng: &mut ChaCha8Rng,
    stop: u64,
) -> (Vec<ListId>, Model, Vec<(u64, u64)>) {
    let lists: Vec<ListId> = (0..4)
        .map(|_| lld.create_list(None, ListHints::default()).unwrap())
        .collect();
    let mut model = Model::new();
    let cap = lld.space().capacity_bytes;
    let mut keys = Vec::new();
    while lld.space().available_bytes > cap / stop {
        let l = lists[rng.gen_range(0..lists.len())];
        let i = rng.gen_range(0..1u64 << 40);
        let len = rng.gen_range(200..1200);
        let s: u64 = rng.gen();
        lld.write(None, l, i, &bytes(s, len))
            .unwrap_or_else(|e| panic!("fill: {e} at {:?}", lld.space()));
        if model.insert((l.0, i), (s, len)).is_none() {
            keys.push((l.0, i));
        }
    }
    (lists, model, keys)
}
