//! Drain-phase repair: reshapes the end of a linear schedule, where each rank runs out of
//! forwards and input gradients start to arrive faster than in the steady state.
//!
//! In the steady state every rank runs one F, one I and one W per microbatch. Once the first
//! rank has no forward left, its input gradients are due every I+W instead of every F+I+W,
//! and the chain of I passes that feeds it must speed up too. A rank that still runs its
//! last forward *before* an input gradient that is already there delays the whole chain by
//! up to one F (the downstream ranks then wait for that late forward as well). The repair
//! runs the last forward on every rank but the first after one more input gradient, and can hold
//! back the W passes around it by one more input gradient so the I chain is not slowed by
//! them. It changes only the order of the final passes; whether that helps is left to the
//! simulator.

use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::schedule::Schedule;
use crate::validate::peak_memory;

/// The repaired variants of `s` worth simulating: on every rank but the first (whose
/// forwards feed everything), the last forward delayed by one input gradient, with the
/// drain's W passes held back by one more input gradient where that stays within `x` ×
/// M_B, and without. Every variant fits `x` if `s` does: a forward moved later only lowers
/// memory until it runs. Empty for placements with several stages per rank.
///
/// Delaying by two input gradients, or on the first rank too, never won on the paper's
/// settings (0 of 565 repairs), so those variants are not tried.
pub(crate) fn variants(s: &Schedule, costs: &CostModel, x: f64) -> Vec<Schedule> {
    if s.stages != s.ranks {
        return Vec::new();
    }
    let mut plain = s.clone();
    let mut deferred = s.clone();
    for r in 1..s.ranks {
        delay_last_forward(&mut plain.orders[r], 1);
        defer_drain_w(&mut deferred.orders[r]);
        delay_last_forward(&mut deferred.orders[r], 1);
    }
    // Deferring holds memory: keep it only on the ranks where it fits.
    let peaks = peak_memory(&deferred, costs);
    for (r, &peak) in peaks.iter().enumerate() {
        if peak > costs.rank_limit(s, r, x) * (1.0 + 1e-9) {
            deferred.orders[r] = plain.orders[r].clone();
        }
    }
    let mut out = Vec::new();
    for c in [deferred, plain] {
        if c.orders != s.orders && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Moves the rank's last forward after the next `shift` input gradients (fewer if the
/// order has fewer left, or if one of them is its own, as on the last stage).
fn delay_last_forward(order: &mut Vec<Action>, shift: usize) {
    let Some(at) = order.iter().rposition(|a| a.kind == Kind::F) else {
        return;
    };
    let f = order[at];
    let mut to = at;
    let mut seen = 0;
    for (k, a) in order.iter().enumerate().skip(at + 1) {
        if a.kind == Kind::I && a.stage == f.stage && a.microbatch == f.microbatch {
            break;
        }
        if a.kind == Kind::I {
            seen += 1;
            to = k;
            if seen == shift {
                break;
            }
        }
    }
    if to > at {
        order.remove(at);
        order.insert(to, f);
    }
}

/// From the input gradient before the last forward on, moves every W after one more input
/// gradient than it had (a W with none left after it stays at the end).
fn defer_drain_w(order: &mut Vec<Action>) {
    let Some(last_f) = order.iter().rposition(|a| a.kind == Kind::F) else {
        return;
    };
    let Some(from) = order[..last_f].iter().rposition(|a| a.kind == Kind::I) else {
        return;
    };
    let head: Vec<Action> = order[..=from].to_vec();
    let mut held: std::collections::VecDeque<Action> = std::collections::VecDeque::new();
    let mut tail = Vec::with_capacity(order.len() - from);
    for &a in &order[from + 1..] {
        match a.kind {
            Kind::W => held.push_back(a),
            Kind::I => {
                tail.push(a);
                // Release the W passes that sat before this I: they now follow it.
                while let Some(w) = held.pop_front() {
                    tail.push(w);
                }
            }
            _ => tail.push(a),
        }
    }
    tail.extend(held);
    *order = head;
    order.extend(tail);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<Action> {
        text.split_whitespace()
            .map(|t| t.parse().expect("action"))
            .collect()
    }

    #[test]
    fn last_forward_moves_after_the_next_input_gradients() {
        let mut o = parse("0F4 0I2 0W1 0F5 0I3 0W2 0I4 0W3 0I5 0W4 0W5");
        delay_last_forward(&mut o, 1);
        assert_eq!(o, parse("0F4 0I2 0W1 0I3 0F5 0W2 0I4 0W3 0I5 0W4 0W5"));
        let mut o = parse("0F4 0I2 0W1 0F5 0I3 0W2 0I4 0W3 0I5 0W4 0W5");
        delay_last_forward(&mut o, 2);
        assert_eq!(o, parse("0F4 0I2 0W1 0I3 0W2 0I4 0F5 0W3 0I5 0W4 0W5"));
    }

    #[test]
    fn drain_w_passes_wait_for_one_more_input_gradient() {
        let mut o = parse("0F4 0I2 0W1 0F5 0I3 0W2 0I4 0W3 0I5 0W4 0W5");
        defer_drain_w(&mut o);
        assert_eq!(o, parse("0F4 0I2 0F5 0I3 0W1 0I4 0W2 0I5 0W3 0W4 0W5"));
    }
}
