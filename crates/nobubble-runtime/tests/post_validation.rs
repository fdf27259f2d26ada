//! Post-validated optimizer steps: each rank steps optimistically, the full reduction
//! decides afterwards. The result must equal the synchronous step.

use nobubble_nn::{ByteCorpus, GptConfig, StageLayout, TrainConfig};
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
        ByteCorpus::builtin().prefix(100_000).unwrap(),
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
