//! Unit-free planning. The generators compare times and memory with small absolute
//! tolerances (ties, "fits", "arrives before"), which suit values near 1 and fail on costs
//! given in seconds for a tiny model (1e-9) or in nanoseconds for a large one: the same
//! pipeline planned worse, or very differently, depending only on the unit. So the planner
//! hands the generators costs and memory multiplied by powers of two that bring the largest
//! pass time and the largest M_B into [1, 2). A power of two changes only a float's
//! exponent, so the rescaled problem is the user's exactly, and two requests that differ by
//! a power of two get the same schedule.

use crate::cost::{CostSpec, RankCost};
use crate::limit::MemLimit;
use crate::split::LayerCosts;

/// The factors a request's times and memory are multiplied by before generating.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Scale {
    time: f64,
    mem: f64,
}

impl Scale {
    /// No rescaling.
    pub(crate) const IDENTITY: Scale = Scale {
        time: 1.0,
        mem: 1.0,
    };

    /// The factors for costs `entries` (every stage's or layer's) and a transfer time `comm`.
    pub(crate) fn of<'a>(entries: impl IntoIterator<Item = &'a RankCost>, comm: f64) -> Scale {
        let (mut time, mut mem) = (comm.abs(), 0.0_f64);
        for c in entries {
            time = time.max(c.f.abs()).max(c.i.abs()).max(c.w.abs());
            mem = mem.max(c.mem_b.abs()).max(c.mem_w.abs());
        }
        Scale {
            time: unit_factor(time),
            mem: unit_factor(mem),
        }
    }

    /// Whether nothing is rescaled.
    pub(crate) fn is_identity(&self) -> bool {
        self.time == 1.0 && self.mem == 1.0
    }

    /// The factors for a per-layer request.
    pub(crate) fn of_layers(layers: &LayerCosts) -> Scale {
        let blocks = layers.blocks.iter().chain(&layers.block);
        Scale::of(
            [&layers.embedding, &layers.head].into_iter().chain(blocks),
            layers.comm,
        )
    }

    fn cost(&self, c: &RankCost) -> RankCost {
        RankCost {
            f: c.f * self.time,
            i: c.i * self.time,
            w: c.w * self.time,
            mem_b: c.mem_b * self.mem,
            mem_w: c.mem_w * self.mem,
            b: c.b.map(|b| b * self.time),
        }
    }

    /// `spec` in the scaled units.
    pub(crate) fn spec(&self, spec: &CostSpec) -> CostSpec {
        CostSpec {
            comm: spec.comm * self.time,
            stages: spec.stages.iter().map(|c| self.cost(c)).collect(),
        }
    }

    /// `layers` in the scaled units.
    pub(crate) fn layers(&self, layers: &LayerCosts) -> LayerCosts {
        LayerCosts {
            comm: layers.comm * self.time,
            embedding: self.cost(&layers.embedding),
            blocks: layers.blocks.iter().map(|c| self.cost(c)).collect(),
            block: layers.block.as_ref().map(|c| self.cost(c)),
            count: layers.count,
            head: self.cost(&layers.head),
        }
    }

    /// `limit` in the scaled units (a multiple of M_B has none).
    pub(crate) fn limit(&self, limit: &MemLimit) -> MemLimit {
        match limit {
            MemLimit::Bytes(b) => MemLimit::Bytes(b * self.mem),
            MemLimit::PerRank(v) => MemLimit::PerRank(v.iter().map(|b| b * self.mem).collect()),
            other => other.clone(),
        }
    }

    /// Amounts of memory in the scaled units back in the user's.
    pub(crate) fn memory_back(&self, amounts: &[f64]) -> Vec<f64> {
        amounts.iter().map(|b| b / self.mem).collect()
    }
}

/// The power of two that brings `largest` into [1, 2); 1 for zero or a non-finite value
/// (they are refused elsewhere), and never past what a float's exponent holds.
fn unit_factor(largest: f64) -> f64 {
    if !(largest.is_finite() && largest > 0.0) {
        return 1.0;
    }
    let exponent = largest.log2().floor().clamp(-1000.0, 1000.0) as i32;
    let factor = 2.0_f64.powi(-exponent);
    // `log2` may round across a power of two; settle it exactly.
    match largest * factor {
        v if v >= 2.0 => factor / 2.0,
        v if v < 1.0 => factor * 2.0,
        _ => factor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_value_lands_in_one_to_two_by_a_power_of_two() {
        for v in [1e-13, 3e-9, 0.75, 1.0, 2.0, 18522.0, 1.5e12] {
            let f = unit_factor(v);
            assert!((1.0..2.0).contains(&(v * f)), "{v} × {f}");
            assert_eq!(f.log2().fract(), 0.0, "{f} is not a power of two");
        }
        assert_eq!(unit_factor(0.0), 1.0);
        assert_eq!(unit_factor(f64::NAN), 1.0);
    }

    #[test]
    fn scaling_changes_only_the_exponent() {
        let c = RankCost {
            f: 1e-9,
            i: 1.2e-9,
            w: 0.8e-9,
            mem_b: 201216.0,
            mem_w: 73728.0,
            b: None,
        };
        let spec = CostSpec::uniform(c, 0.05e-9);
        let s = Scale::of(&spec.stages, spec.comm);
        let scaled = s.spec(&spec);
        let back = |x: f64| x / s.time;
        assert_eq!(back(scaled.stages[0].i), c.i);
        assert_eq!(back(scaled.comm), spec.comm);
        assert!((1.0..2.0).contains(&scaled.stages[0].i));
        assert!((1.0..2.0).contains(&scaled.stages[0].mem_b));
        assert_eq!(s.memory_back(&[scaled.stages[0].mem_w]), vec![c.mem_w]);
    }
}
