//! Data parallel × pipeline parallel: D replicas of m microbatches give the bits of one
//! replica of D·m microbatches, and of the unpipelined reference over the global batch —
//! with synchronous and post-validated steps, clipped steps and a skipped (NaN) step.

mod common;
use nobubble_nn::config::{block_counts, Arch};
use nobubble_nn::{Corpus, GptConfig, ReferenceTrainer, StageLayout, TrainConfig};
use nobubble_runtime::worker::Rollback;
use nobubble_runtime::{Compute, Fault, Pipeline, RunConfig};
use nobubble_schedule::{generate, CostSpec, RankCost, Request, ScheduleKind};
use std::time::Duration;

fn model() -> GptConfig {
    GptConfig {
        layers: 4,
        ..GptConfig::micro()
    }
}

fn train(m: usize, max_norm: f32) -> TrainConfig {
    TrainConfig {
        microbatches: m,
        max_grad_norm: Some(max_norm),
        warmup_steps: 2,
        ..TrainConfig::default()
    }
}

fn corpus() -> Corpus {
    Corpus::builtin().prefix(200_000).unwrap()
}

type Run = (Vec<(u32, u32, bool)>, Vec<(String, Vec<u32>)>);

/// (loss bits, clip-scale bits, skipped) per step, and the final weights' bits.
#[allow(clippy::too_many_arguments)]
fn pipelined(
    model: &GptConfig,
    kind: ScheduleKind,
    p: usize,
    d: usize,
    m: usize,
    steps: usize,
    max_norm: f32,
    post: Option<Rollback>,
    fault: Option<Fault>,
) -> Run {
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    let schedule = generate(&Request::new(kind, p, m), &spec).unwrap();
    let config = RunConfig {
        model: model.clone(),
        train: train(m, max_norm),
        layout: StageLayout::Even,
        compute: Compute::Real,
        recv_timeout: Duration::from_secs(30),
        fault,
        post_validate: post,
        data_parallel: d,
    };
    let mut pipe = Pipeline::start(config, &schedule, corpus()).unwrap();
    let steps = (0..steps)
        .map(|_| {
            let r = pipe.train_step(&schedule).unwrap();
            (r.loss.to_bits(), r.clip_scale.to_bits(), r.skipped)
        })
        .collect();
    let weights = pipe
        .params()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, v.iter().map(|x| x.to_bits()).collect()))
        .collect();
    (steps, weights)
}

fn reference(model: &GptConfig, stages: usize, m: usize, steps: usize, max_norm: f32) -> Run {
    let counts = block_counts(model.layers, stages, &StageLayout::Even).unwrap();
    let mut r = ReferenceTrainer::new(model, &train(m, max_norm), corpus(), &counts).unwrap();
    let steps = (0..steps)
        .map(|_| {
            let s = r.train_step().unwrap();
            (s.loss.to_bits(), s.clip_scale.to_bits(), s.skipped)
        })
        .collect();
    let weights = common::weight_bits(r.stages());
    (steps, weights)
}

fn same(a: &Run, b: &Run, what: &str) {
    assert_eq!(a.0, b.0, "{what}: losses / clip factors differ");
    assert_eq!(a.1.len(), b.1.len(), "{what}");
    for ((n, w), (rn, rw)) in a.1.iter().zip(&b.1) {
        assert_eq!(n, rn, "{what}");
        assert!(w == rw, "{what}: weights of {n} differ");
    }
}

#[test]
fn replicas_reproduce_one_pipeline_and_the_reference_bit_for_bit() {
    let steps = 3;
    // Clipping binds (max norm 0.5): the reduced norm must be the reference's to the bit.
    let want = reference(&model(), 2, 8, steps, 0.5);
    assert!(
        want.0.iter().any(|s| f32::from_bits(s.1) < 1.0),
        "clipping should bind"
    );
    for kind in [
        ScheduleKind::OneFOneB,
        ScheduleKind::ZbH1,
        ScheduleKind::Zb2p,
    ] {
        let one = pipelined(&model(), kind, 2, 1, 8, steps, 0.5, None, None);
        same(&one, &want, &format!("{} p=2 m=8", kind.name()));
        let two = pipelined(&model(), kind, 2, 2, 4, steps, 0.5, None, None);
        same(&two, &want, &format!("{} p=2 × D=2 m=4", kind.name()));
    }
    let four = pipelined(
        &model(),
        ScheduleKind::ZbH1,
        2,
        4,
        2,
        steps,
        0.5,
        None,
        None,
    );
    same(&four, &want, "zb-h1 p=2 × D=4 m=2");
    // A V schedule: 4 stages on 2 ranks.
    let want_v = reference(&model(), 4, 8, steps, 0.5);
    let v = pipelined(&model(), ScheduleKind::ZbV, 2, 2, 4, steps, 0.5, None, None);
    same(&v, &want_v, "zb-v p=2 × D=2 m=4");
}

#[test]
fn post_validated_replicas_keep_the_bits_through_clipped_and_skipped_steps() {
    let steps = 3;
    let kind = ScheduleKind::ZbH1;
    // Clipped steps: redone with the global clip factor.
    let sync = pipelined(&model(), kind, 2, 2, 4, steps, 0.5, None, None);
    same(&sync, &reference(&model(), 2, 8, steps, 0.5), "synchronous");
    let post = pipelined(
        &model(),
        kind,
        2,
        2,
        4,
        steps,
        0.5,
        Some(Rollback::Copy),
        None,
    );
    same(&post, &sync, "post-validated, clipped");
    // A NaN in replica 0's gradient at step 1: every replica skips that step.
    let nan = Some(Fault::NanGradAt(1));
    let sync_nan = pipelined(&model(), kind, 2, 2, 4, steps, 0.5, None, nan.clone());
    assert_eq!(
        sync_nan.0.iter().map(|s| s.2).collect::<Vec<_>>(),
        [false, true, false]
    );
    let post_nan = pipelined(
        &model(),
        kind,
        2,
        2,
        4,
        steps,
        0.5,
        Some(Rollback::Copy),
        nan,
    );
    same(&post_nan, &sync_nan, "post-validated, NaN skipped");
    // The one-pipeline run with the same NaN skips the same step with the same weights.
    let one_nan = pipelined(
        &model(),
        kind,
        2,
        1,
        8,
        steps,
        0.5,
        None,
        Some(Fault::NanGradAt(1)),
    );
    same(&one_nan, &sync_nan, "one pipeline, NaN skipped");
}

/// Llama blocks (grouped-query attention, rotary positions): two replicas of a V pipeline,
/// synchronous and post-validated, give the reference's bits over the global batch.
#[test]
fn llama_blocks_keep_the_bits_under_data_parallelism_and_post_validation() {
    let llama = model().with_arch(Arch::Llama);
    let steps = 3;
    let want = reference(&llama, 4, 8, steps, 0.5);
    for post in [None, Some(Rollback::Copy)] {
        let got = pipelined(&llama, ScheduleKind::ZbV, 2, 2, 4, steps, 0.5, post, None);
        same(
            &got,
            &want,
            &format!("llama zb-v, post-validation {post:?}"),
        );
    }
}
