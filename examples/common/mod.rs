//! What the Rust examples share (a module, not an example: cargo builds
//! only `examples/*.rs` and `examples/*/main.rs` as examples).

/// xorshift64*: a small deterministic generator (lookup orders, offsets).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
