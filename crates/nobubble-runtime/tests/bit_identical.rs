//! Pipelined training under every schedule gives the reference trainer's losses and final
//! weights, bit for bit.

mod common;
use nobubble_nn::config::{block_counts, Arch};
use nobubble_nn::{Corpus, GptConfig, ReferenceTrainer, StageLayout, TrainConfig};
use nobubble_runtime::{Compute, Pipeline, RunConfig};
use nobubble_schedule::{generate, CostSpec, RankCost, Request, ScheduleKind};
use std::time::Duration;

fn model() -> GptConfig {
    GptConfig {
        layers: 4,
        ..GptConfig::micro()
    }
}

fn train(m: usize) -> TrainConfig {
    TrainConfig {
        microbatches: m,
        max_grad_norm: Some(0.5),
        warmup_steps: 2,
        ..TrainConfig::default()
    }
}

/// Real compute, even split, synchronous steps.
fn run_config(model: GptConfig, m: usize) -> RunConfig {
    RunConfig {
        model,
        train: train(m),
        layout: StageLayout::Even,
        compute: Compute::Real,
        recv_timeout: Duration::from_secs(30),
        fault: None,
        post_validate: None,
        data_parallel: 1,
    }
}

fn corpus() -> Corpus {
    Corpus::builtin().prefix(200_000).unwrap()
}

fn reference(
    model: &GptConfig,
    stages: usize,
    m: usize,
    steps: usize,
) -> (Vec<u32>, Vec<(String, Vec<u32>)>) {
    let counts = block_counts(model.layers, stages, &StageLayout::Even).unwrap();
    let mut r = ReferenceTrainer::new(model, &train(m), corpus(), &counts).unwrap();
    let losses = (0..steps)
        .map(|_| r.train_step().unwrap().loss.to_bits())
        .collect();
    let weights = common::weight_bits(r.stages());
    (losses, weights)
}

#[test]
fn every_schedule_trains_bit_identically_to_the_reference() {
    every_schedule_trains_bit_identically(&model());
}

#[test]
fn every_schedule_trains_llama_blocks_bit_identically_to_the_reference() {
    every_schedule_trains_bit_identically(&model().with_arch(Arch::Llama));
}

#[test]
fn every_schedule_trains_tied_embeddings_bit_identically_to_the_reference() {
    let tied = GptConfig {
        tie_embeddings: true,
        ..model().with_arch(Arch::Llama)
    };
    every_schedule_trains_bit_identically(&tied);
}

fn every_schedule_trains_bit_identically(model: &GptConfig) {
    let (p, m, steps) = (2, 4, 3);
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    for kind in ScheduleKind::ALL {
        let schedule = generate(&Request::new(kind, p, m), &spec).unwrap();
        let config = run_config(model.clone(), m);
        let mut pipe = Pipeline::start(config, &schedule, corpus()).unwrap();
        let losses: Vec<u32> = (0..steps)
            .map(|_| pipe.train_step(&schedule).unwrap().loss.to_bits())
            .collect();
        let weights: Vec<(String, Vec<u32>)> = pipe
            .params()
            .unwrap()
            .into_iter()
            .map(|(n, v)| (n, v.iter().map(|x| x.to_bits()).collect()))
            .collect();
        let (ref_losses, ref_weights) = reference(model, schedule.stages, m, steps);
        assert_eq!(losses, ref_losses, "{}: losses differ", kind.name());
        assert_eq!(weights.len(), ref_weights.len());
        for ((n, w), (rn, rw)) in weights.iter().zip(&ref_weights) {
            assert_eq!(n, rn);
            assert!(w == rw, "{}: weights of {n} differ", kind.name());
        }
    }
}

/// Automatic schedules planned on uneven per-stage costs (which tempt the searches to run
/// W out of order) still train bit-identically.
#[test]
fn automatic_schedules_on_uneven_costs_stay_bit_identical() {
    let (p, m, steps) = (3, 8, 2);
    let spec = CostSpec {
        comm: 0.0,
        stages: [
            (0.0367, 0.0513, 0.025, 0.825),
            (0.0422, 0.0533, 0.0177, 0.915),
            (0.038, 0.0441, 0.0328, 0.82),
        ]
        .iter()
        .map(|&(f, i, w, mw)| RankCost {
            f,
            i,
            w,
            mem_b: 1.0,
            mem_w: mw,
            b: None,
        })
        .collect(),
    };
    let model = GptConfig {
        layers: 6,
        ..GptConfig::micro()
    };
    for kind in [
        ScheduleKind::ZbAuto,
        ScheduleKind::Zb1p,
        ScheduleKind::VAuto,
        ScheduleKind::VHalf,
    ] {
        let schedule = generate(&Request::new(kind, p, m), &spec).unwrap();
        let config = run_config(model.clone(), m);
        let mut pipe = Pipeline::start(config, &schedule, corpus()).unwrap();
        let losses: Vec<u32> = (0..steps)
            .map(|_| pipe.train_step(&schedule).unwrap().loss.to_bits())
            .collect();
        let counts = block_counts(model.layers, schedule.stages, &StageLayout::Even).unwrap();
        let mut r = ReferenceTrainer::new(&model, &train(m), corpus(), &counts).unwrap();
        let ref_losses: Vec<u32> = (0..steps)
            .map(|_| r.train_step().unwrap().loss.to_bits())
            .collect();
        assert_eq!(losses, ref_losses, "{}", kind.name());
        let ours: Vec<u32> = pipe
            .params()
            .unwrap()
            .into_iter()
            .flat_map(|(_, v)| v)
            .map(f32::to_bits)
            .collect();
        let theirs: Vec<u32> = r
            .stages()
            .iter()
            .flat_map(|s| s.params().into_iter().flat_map(|p| p.value.data().to_vec()))
            .map(f32::to_bits)
            .collect();
        assert!(ours == theirs, "{}: weights differ", kind.name());
    }
}
