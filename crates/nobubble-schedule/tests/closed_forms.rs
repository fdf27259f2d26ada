//! The paper's closed forms (REFERENCE §2), checked exactly over a grid of p and m.
//! Costs are chosen so every time is a dyadic fraction: float sums are exact.

use nobubble_schedule::{generate, simulate, CostModel, CostSpec, RankCost, Request, ScheduleKind};

/// Uniform costs with W ≤ F, the regime the paper's formulas assume.
const COSTS: [(f64, f64, f64); 4] = [
    (1.0, 1.0, 1.0),
    (1.0, 1.25, 0.75),
    (2.0, 2.0, 1.0),
    (1.0, 1.5, 0.5),
];

struct Outcome {
    /// Longest per-rank span minus the work every rank must do: the paper's bubble.
    bubble: f64,
    peak: f64,
    bubble_rate: f64,
}

fn run(kind: ScheduleKind, p: usize, m: usize, v: usize, (f, i, w): (f64, f64, f64)) -> Outcome {
    let spec = CostSpec::uniform(
        RankCost {
            f,
            i,
            w,
            mem_b: 1.0,
            mem_w: 0.5,
            b: None,
        },
        0.0,
    );
    let s = generate(
        &Request {
            chunks: v,
            ..Request::new(kind, p, m)
        },
        &spec,
    )
    .unwrap();
    let c = CostModel::for_schedule(&spec, &s).unwrap();
    let sim = simulate(&s, &c).unwrap();
    let max_span = sim.metrics.span.iter().copied().fold(0.0, f64::max);
    Outcome {
        bubble: max_span - m as f64 * (f + i + w),
        peak: sim.metrics.peak_memory.iter().copied().fold(0.0, f64::max),
        bubble_rate: sim.metrics.bubble_rate,
    }
}

fn grid() -> impl Iterator<Item = (usize, usize)> {
    (1..=16).flat_map(|p| (p..=4 * p).map(move |m| (p, m)))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * (1.0 + b.abs())
}

#[test]
fn one_f_one_b_and_gpipe_bubble_is_p_minus_1_full_passes() {
    for (p, m) in grid() {
        for c in COSTS {
            let expect = (p - 1) as f64 * (c.0 + c.1 + c.2);
            let o = run(ScheduleKind::OneFOneB, p, m, 1, c);
            assert!(
                close(o.bubble, expect),
                "1f1b p={p} m={m} {c:?}: {} vs {expect}",
                o.bubble
            );
            assert_eq!(o.peak, p as f64, "1f1b peak p={p} m={m}");
            let g = run(ScheduleKind::GPipe, p, m, 1, c);
            assert!(
                close(g.bubble, expect),
                "gpipe p={p} m={m}: {} vs {expect}",
                g.bubble
            );
            assert_eq!(g.peak, m as f64, "gpipe peak p={p} m={m}");
        }
        let o = run(ScheduleKind::OneFOneB, p, m, 1, (1.0, 1.0, 1.0));
        let rate = (p - 1) as f64 / (m + p - 1) as f64;
        assert!(
            close(o.bubble_rate, rate),
            "1f1b rate p={p} m={m}: {} vs {rate}",
            o.bubble_rate
        );
    }
}

#[test]
fn zb_h1_bubble_is_p_minus_1_times_f_plus_i_minus_w_at_1f1b_memory() {
    for (p, m) in grid() {
        for c in COSTS {
            let expect = (p - 1) as f64 * (c.0 + c.1 - c.2);
            let o = run(ScheduleKind::ZbH1, p, m, 1, c);
            assert!(
                close(o.bubble, expect),
                "zb-h1 p={p} m={m} {c:?}: {} vs {expect}",
                o.bubble
            );
            assert_eq!(o.peak, p as f64, "zb-h1 peak p={p} m={m}");
        }
        // A third of 1F1B's when F = I = W.
        let h1 = run(ScheduleKind::ZbH1, p, m, 1, (1.0, 1.0, 1.0)).bubble;
        let base = run(ScheduleKind::OneFOneB, p, m, 1, (1.0, 1.0, 1.0)).bubble;
        assert!(close(3.0 * h1, base));
    }
}

#[test]
fn zb_h2_bubble_is_zero_when_f_eq_i_eq_w_at_2p_minus_1_memory() {
    for (p, m) in grid() {
        if m >= 2 * p - 1 {
            for c in COSTS {
                let expect = ((p - 1) as f64 * (c.0 + c.1 - 2.0 * c.2)).max(0.0);
                let o = run(ScheduleKind::ZbH2, p, m, 1, c);
                assert!(
                    close(o.bubble, expect),
                    "zb-h2 p={p} m={m} {c:?}: {} vs {expect}",
                    o.bubble
                );
                assert_eq!(o.peak, (2 * p - 1) as f64, "zb-h2 peak p={p} m={m}");
            }
            assert_eq!(
                run(ScheduleKind::ZbH2, p, m, 1, (1.0, 1.0, 1.0)).bubble_rate,
                0.0
            );
        } else {
            // Too few microbatches to fill the warm-up: documented fallback, a bubble of
            // (2p−1−m) forwards, memory m·M_B.
            let o = run(ScheduleKind::ZbH2, p, m, 1, (1.0, 1.0, 1.0));
            assert!(
                close(o.bubble, (2 * p - 1 - m) as f64),
                "zb-h2 small m p={p} m={m}: {}",
                o.bubble
            );
            assert_eq!(o.peak, m as f64);
        }
    }
}

#[test]
fn interleaved_bubble_shrinks_by_the_chunk_count() {
    for (p, m) in grid().filter(|(p, m)| m % p == 0) {
        for v in [2, 3, 4] {
            for c in COSTS {
                let expect = (p - 1) as f64 * (c.0 + c.1 + c.2) / v as f64;
                let o = run(ScheduleKind::Interleaved1F1B, p, m, v, c);
                assert!(
                    close(o.bubble, expect),
                    "interleaved p={p} m={m} v={v} {c:?}: {} vs {expect}",
                    o.bubble
                );
            }
        }
    }
}
