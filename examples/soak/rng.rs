//! A small deterministic generator (xorshift) for the soak's choices, one per task, so that a run
//! with the same seed makes the same choices (the service's timing still varies).

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// A number in `lo..hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + self.0 % (hi - lo).max(1)
    }
}
