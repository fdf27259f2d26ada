//! Parameters, their gradient accumulators, and deterministic initialization.
//!
//! Initialization is seeded per parameter from the model seed and the parameter's
//! *global* name (e.g. `blocks.3.attn.qkv.weight`), never from construction order,
//! so the same seed gives the same weights however the model is split into stages.
//! The generator is our own (splitmix64 + Box–Muller) so results cannot change with
//! a dependency's algorithm.

use crate::tensor::Tensor;

/// A trainable tensor together with its gradient accumulator.
#[derive(Clone, Debug)]
pub struct Param {
    /// Global, split-independent name; keys initialization and optimizer state.
    pub name: String,
    /// Current value.
    pub value: Tensor,
    /// Accumulated gradient (summed over microbatches by the W passes).
    pub grad: Tensor,
    /// Whether AdamW applies weight decay (matrices yes; norms, biases no).
    pub decay: bool,
}

/// How to fill a parameter at construction.
#[derive(Clone, Copy, Debug)]
pub enum Init {
    /// All entries equal to the value (LayerNorm γ = 1, biases = 0).
    Constant(f32),
    /// Normal(0, std²) from the per-name seeded generator.
    Normal(f32),
}

impl Param {
    /// Creates and initializes a parameter; `seed` is the model seed.
    pub fn new(
        name: impl Into<String>,
        shape: &[usize],
        init: Init,
        decay: bool,
        seed: u64,
    ) -> Self {
        let name = name.into();
        let mut value = Tensor::zeros(shape);
        match init {
            Init::Constant(c) => value.data_mut().fill(c),
            Init::Normal(std) => {
                let mut rng = SplitMix64::new(seed ^ fnv1a(name.as_bytes()));
                for x in value.data_mut() {
                    *x = rng.next_normal() as f32 * std;
                }
            }
        }
        Param {
            name,
            grad: Tensor::zeros(shape),
            value,
            decay,
        }
    }

    /// Resets the gradient accumulator (after an optimizer step).
    pub fn zero_grad(&mut self) {
        self.grad.data_mut().fill(0.0);
    }
}

/// FNV-1a hash of a parameter name: mixes the name into the seed.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// splitmix64: tiny, well-mixed, and fully specified here so streams never change.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// Generator with the given seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1], never 0 (safe for `ln`).
    pub fn next_unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Standard normal via Box–Muller (one value per call; the pair's twin is dropped
    /// to keep the stream a pure function of the call count).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = self.next_unit();
        let u2 = self.next_unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Uniform integer in `0..n` (n > 0). The modulo bias is negligible for our n.
    pub fn next_below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_depends_on_name_and_seed_only() {
        let a = Param::new("blocks.0.w", &[4, 4], Init::Normal(0.02), true, 7);
        let b = Param::new("blocks.0.w", &[4, 4], Init::Normal(0.02), true, 7);
        let c = Param::new("blocks.1.w", &[4, 4], Init::Normal(0.02), true, 7);
        let d = Param::new("blocks.0.w", &[4, 4], Init::Normal(0.02), true, 8);
        assert_eq!(a.value, b.value);
        assert_ne!(a.value, c.value);
        assert_ne!(a.value, d.value);
    }

    #[test]
    fn normal_generator_has_unit_variance() {
        let mut r = SplitMix64::new(1);
        let n = 20000;
        let xs: Vec<f64> = (0..n).map(|_| r.next_normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
    }
}
