//! The canonical order in which a step's microbatch gradients are summed.
//!
//! Float addition is not associative, so "the gradient of the step" is only one number once
//! the order of the additions is fixed. Summing microbatches one after the other (a chain)
//! would make data parallelism unable to match a single replica: replica r would have to
//! start from replica r−1's sum. So every trainer here sums in one **halving tree**: the
//! microbatches `[lo, hi)` are the sum of `[lo, mid)` and `[mid, hi)` with
//! `mid = lo + (hi − lo) / 2`, down to single microbatches. A replica holding microbatches
//! `[r·m, (r+1)·m)` of `D·m` computes a whole subtree when D is a power of two, so D replicas
//! each summing their own m microbatches and then combining the D sums in the same halving
//! tree give the single replica's bits exactly ([`combine`]).
//!
//! The tree is evaluated on the fly as microbatches arrive in order (post-order, a stack of
//! partial sums): at most ⌈log₂ m⌉ + 1 partial gradient sets are alive at once.

use crate::tensor::Tensor;

/// How many merges complete after each leaf of a halving tree over `n` leaves.
fn merges_after(n: usize) -> Vec<usize> {
    fn visit(lo: usize, hi: usize, out: &mut [usize]) {
        if hi - lo >= 2 {
            let mid = lo + (hi - lo) / 2;
            visit(lo, mid, out);
            visit(mid, hi, out);
            out[hi - 1] += 1;
        }
    }
    let mut out = vec![0; n];
    if n > 0 {
        visit(0, n, &mut out);
    }
    out
}

/// A halving-tree sum over `n` leaves that arrive one at a time, in order.
#[derive(Clone, Debug)]
pub struct TreeSum {
    merges: Vec<usize>,
    stack: Vec<Vec<Tensor>>,
    seen: usize,
}

impl TreeSum {
    /// A sum over `leaves` leaves (at least 1).
    pub fn new(leaves: usize) -> TreeSum {
        TreeSum {
            merges: merges_after(leaves.max(1)),
            stack: Vec::new(),
            seen: 0,
        }
    }

    /// Leaves expected.
    pub fn leaves(&self) -> usize {
        self.merges.len()
    }

    /// Leaves added so far.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// Adds the next leaf (a set of tensors, added elementwise). Returns the total once the
    /// last leaf is in; `None` before. Extra leaves after the last start a new sum.
    pub fn push(&mut self, leaf: Vec<Tensor>) -> Option<Vec<Tensor>> {
        self.stack.push(leaf);
        for _ in 0..self.merges[self.seen] {
            let right = self
                .stack
                .pop()
                .expect("a halving tree merges two subtrees");
            let left = self
                .stack
                .last_mut()
                .expect("a halving tree merges two subtrees");
            add_sets(left, &right);
        }
        self.seen += 1;
        if self.seen == self.merges.len() {
            self.seen = 0;
            debug_assert_eq!(self.stack.len(), 1);
            self.stack.pop()
        } else {
            None
        }
    }

    /// Forgets a partial sum (the gradients are being zeroed).
    pub fn reset(&mut self) {
        self.stack.clear();
        self.seen = 0;
    }

    /// Bytes held by partial sums.
    pub fn held_bytes(&self) -> usize {
        self.stack
            .iter()
            .flatten()
            .map(|t| t.data().len() * 4)
            .sum()
    }
}

/// `left += right`, tensor by tensor, element by element (a vector kernel: every merge of
/// the tree adds a whole stage's gradients).
fn add_sets(left: &mut [Tensor], right: &[Tensor]) {
    // Any level gives the same bits (an elementwise add): the process's serves.
    let simd = crate::simd::Simd::selected();
    for (a, b) in left.iter_mut().zip(right) {
        crate::kernels::add(simd, a.data_mut(), b.data());
    }
}

/// Combines per-replica sums (in replica order) in the same halving tree: D replicas of m
/// microbatches each give exactly the bits of one replica of D·m microbatches when D is a
/// power of two (for other D: a fixed order, the same on every run).
pub fn combine(mut replicas: Vec<Vec<Tensor>>) -> Option<Vec<Tensor>> {
    let mut tree = TreeSum::new(replicas.len());
    let mut out = None;
    for r in replicas.drain(..) {
        out = tree.push(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(x: f32) -> Vec<Tensor> {
        let mut t = Tensor::zeros(&[1]);
        t.data_mut()[0] = x;
        vec![t]
    }

    fn tree_total(xs: &[f32]) -> f32 {
        let mut t = TreeSum::new(xs.len());
        let mut out = None;
        for &x in xs {
            out = t.push(leaf(x));
        }
        out.expect("complete")[0].data()[0]
    }

    /// Independent recursive evaluation of the halving tree.
    fn recursive(xs: &[f32]) -> f32 {
        if xs.len() == 1 {
            return xs[0];
        }
        let mid = xs.len() / 2;
        recursive(&xs[..mid]) + recursive(&xs[mid..])
    }

    #[test]
    fn the_streamed_tree_is_the_recursive_halving_tree() {
        let xs: Vec<f32> = (0..37)
            .map(|i| 1.0 / (i as f32 + 0.3) * 1e3f32.powi(i % 3))
            .collect();
        for n in 1..xs.len() {
            assert_eq!(
                tree_total(&xs[..n]).to_bits(),
                recursive(&xs[..n]).to_bits(),
                "n = {n}"
            );
        }
    }

    #[test]
    fn power_of_two_replicas_reproduce_one_replica_bit_for_bit() {
        let xs: Vec<f32> = (0..24)
            .map(|i| ((i * 7919) % 101) as f32 * 0.37 - 11.1 + 1e-4 * i as f32)
            .collect();
        for (d, m) in [(2, 12), (4, 6), (8, 3), (2, 5)] {
            let n = d * m;
            let parts: Vec<Vec<Tensor>> = (0..d)
                .map(|r| leaf(tree_total(&xs[r * m..(r + 1) * m])))
                .collect();
            let got = combine(parts).unwrap()[0].data()[0];
            assert_eq!(
                got.to_bits(),
                tree_total(&xs[..n]).to_bits(),
                "D = {d}, m = {m}"
            );
        }
        // The chain order would not: the tree is what makes this work.
        let ys = [1e8f32, 1.0, 1.0, 1.0, -1e8, 1.0, 1.0, 1.0];
        let chain = ys.iter().fold(0.0f32, |a, &b| a + b);
        assert_ne!(chain.to_bits(), tree_total(&ys).to_bits());
    }

    #[test]
    fn at_most_log_m_partial_sums_are_alive() {
        let mut t = TreeSum::new(64);
        let mut most = 0;
        for i in 0..64 {
            t.push(leaf(i as f32));
            most = most.max(t.stack.len());
        }
        assert!(most <= 7, "{most}");
    }
}
