//! Post-validated optimizer steps: each rank steps optimistically, the full reduction
//! decides afterwards. The result must equal the synchronous step.

use nobubble_nn::{Corpus, GptConfig, StageLayout, TrainConfig};
use nobubble_runtime::worker::Rollback;
use nobubble_runtime::{Compute, Fault, Pipeline, RunConfig};
use nobubble_schedule::{generate, CostSpec, RankCost, Request, ScheduleKind};
use std::time::Duration;

struct Run {
    losses: Vec<f32>,
    skipped: Vec<bool>,
    clipped: Vec<bool>,
    weights: Vec<f32>,
}

fn run(post: Option<Rollback>, max_norm: f32, fault: Option<Fault>) -> Run {
    let m = 4;
    let schedule = generate(
        &Request::new(ScheduleKind::ZbH1, 2, m),
        &CostSpec::uniform(RankCost::default(), 0.0),
    )
    .unwrap();
    let config = RunConfig {
        model: GptConfig {
            layers: 4,
            ..GptConfig::micro()
        },
        train: TrainConfig {
            microbatches: m,
            max_grad_norm: Some(max_norm),
            // A changing learning rate: a redo must use this step's, not the restored one.
            warmup_steps: 3,
            ..TrainConfig::default()
        },
        layout: StageLayout::Even,
        compute: Compute::Real,
        recv_timeout: Duration::from_secs(30),
        fault,
        post_validate: post,
        data_parallel: 1,
    };
    let mut p = Pipeline::start(
        config,
        &schedule,
        Corpus::builtin().prefix(100_000).unwrap(),
    )
    .unwrap();
    let recs: Vec<_> = (0..4).map(|_| p.train_step(&schedule).unwrap()).collect();
    Run {
        losses: recs.iter().map(|r| r.loss).collect(),
        skipped: recs.iter().map(|r| r.skipped).collect(),
        clipped: recs.iter().map(|r| r.clip_scale < 1.0).collect(),
        weights: p
            .params()
            .unwrap()
            .into_iter()
            .flat_map(|(_, v)| v)
            .collect(),
    }
}

/// Every weight within 1e-5 of the other run's (false on any NaN).
fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn without_clipping_the_optimistic_step_equals_the_synchronous_one() {
    let sync = run(None, 1e9, None);
    for mode in [Rollback::Copy, Rollback::Analytic] {
        let post = run(Some(mode), 1e9, None);
        assert!(!post.clipped.iter().any(|&c| c));
        assert_eq!(bits(&post.losses), bits(&sync.losses), "{mode:?}");
        assert_eq!(bits(&post.weights), bits(&sync.weights), "{mode:?}");
    }
}

#[test]
fn when_clipping_was_needed_the_step_is_redone_clipped() {
    let sync = run(None, 0.05, None);
    assert!(
        sync.clipped.iter().all(|&c| c),
        "the threshold must force clipping"
    );
    // Copy mode: exact.
    let copy = run(Some(Rollback::Copy), 0.05, None);
    assert_eq!(bits(&copy.losses), bits(&sync.losses));
    assert_eq!(bits(&copy.weights), bits(&sync.weights));
    // Analytic mode: the AdamW inverse is exact up to float rounding; over 4 steps the
    // weights stay within 1e-5 (absolute) of the synchronous run.
    let analytic = run(Some(Rollback::Analytic), 0.05, None);
    assert!(
        close(&analytic.weights, &sync.weights),
        "analytic rollback drifted"
    );
}

#[test]
fn a_nan_step_is_rolled_back_and_skipped() {
    let fault = Some(Fault::NanGradAt(1));
    let sync = run(None, 1.0, fault.clone());
    assert_eq!(sync.skipped, [false, true, false, false]);
    let clean = run(None, 1.0, None);
    assert_ne!(
        bits(&sync.weights),
        bits(&clean.weights),
        "skipping must change the result"
    );
    for mode in [Rollback::Copy, Rollback::Analytic] {
        let post = run(Some(mode), 1.0, fault.clone());
        assert_eq!(post.skipped, sync.skipped, "{mode:?}");
        assert_eq!(bits(&post.losses), bits(&sync.losses), "{mode:?}");
        if mode == Rollback::Copy {
            assert_eq!(bits(&post.weights), bits(&sync.weights));
        } else {
            assert!(
                close(&post.weights, &sync.weights),
                "analytic rollback drifted"
            );
        }
    }
}

/// Post-validated steps run back to back — each step's forwards speculative on the previous
/// step's optimistic weights, redone when it is rolled back — give the synchronous bits, on
/// schedules where a downstream rank waits for forwards that its upstream rank only sends after
/// its own first backward would have settled (V placements on uneven costs).
#[test]
fn overlapped_post_validated_steps_redo_speculative_forwards_exactly() {
    use nobubble_schedule::{generate, CostSpec, RankCost, Request, ScheduleKind};
    let model = GptConfig {
        layers: 8,
        ..GptConfig::micro()
    };
    let uneven = CostSpec::uniform(
        RankCost {
            f: 1.0,
            i: 3.0,
            w: 0.5,
            mem_b: 1.0,
            mem_w: 0.5,
            b: None,
        },
        2.0,
    );
    let mut cases = vec![(
        ScheduleKind::ZbH1,
        2,
        CostSpec::uniform(RankCost::default(), 0.0),
    )];
    for kind in [ScheduleKind::ZbV, ScheduleKind::VMin, ScheduleKind::VHalf] {
        cases.push((kind, 4, uneven.clone()));
    }
    for (kind, p, spec) in cases {
        let m = 8;
        let schedule = generate(&Request::new(kind, p, m), &spec).unwrap();
        let run = |post: Option<Rollback>, fault: Option<Fault>| {
            let config = RunConfig {
                model: model.clone(),
                train: TrainConfig {
                    microbatches: m,
                    // Clips every step: every step is rolled back and redone.
                    max_grad_norm: Some(0.05),
                    warmup_steps: 1,
                    ..TrainConfig::default()
                },
                layout: StageLayout::Even,
                compute: Compute::Real,
                recv_timeout: Duration::from_secs(20),
                fault,
                post_validate: post,
                data_parallel: 1,
            };
            let mut p = Pipeline::start(config, &schedule, Corpus::builtin()).unwrap();
            let recs = p.train_steps_overlapped(&schedule, 3).unwrap();
            let w: Vec<Vec<u32>> = p
                .params()
                .unwrap()
                .into_iter()
                .map(|(_, v)| bits(&v))
                .collect();
            let steps: Vec<(u32, u32, bool)> = recs
                .iter()
                .map(|r| (r.loss.to_bits(), r.clip_scale.to_bits(), r.skipped))
                .collect();
            (steps, w)
        };
        let sync = run(None, None);
        assert!(
            sync.0.iter().all(|s| f32::from_bits(s.1) < 1.0),
            "every step should clip"
        );
        let post = run(Some(Rollback::Copy), None);
        assert_eq!(post.0, sync.0, "{}: losses / clip factors", kind.name());
        assert!(post.1 == sync.1, "{}: weights differ", kind.name());
        if p >= 2 {
            let nan = Some(Fault::NanGradAt(1));
            let (s, w) = (run(None, nan.clone()), run(Some(Rollback::Copy), nan));
            assert_eq!(w.0, s.0, "{}: NaN step", kind.name());
            assert!(w.1 == s.1, "{}: weights after a NaN step", kind.name());
        }
    }
}
