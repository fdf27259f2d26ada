//! Pipelined training under every schedule gives the reference trainer's losses and final
//! weights, bit for bit.

use nobubble_nn::config::block_counts;
use nobubble_nn::{ByteCorpus, GptConfig, ReferenceTrainer, StageLayout, TrainConfig};
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

fn corpus() -> ByteCorpus {
    ByteCorpus::builtin().prefix(200_000).unwrap()
}

fn reference(stages: usize, m: usize, steps: usize) -> (Vec<u32>, Vec<(String, Vec<u32>)>) {
    let counts = block_counts(model().layers, stages, &StageLayout::Even).unwrap();
    let mut r = ReferenceTrainer::new(&model(), &train(m), corpus(), &counts).unwrap();
    let losses = (0..steps)
        .map(|_| r.train_step().unwrap().loss.to_bits())
        .collect();
    let weights = r
        .stages()
        .iter()
        .flat_map(|s| {
            s.params().into_iter().map(|p| {
                (
                    p.name.clone(),
                    p.value.data().iter().map(|v| v.to_bits()).collect(),
                )
            })
        })
        .collect();
    (losses, weights)
}

#[test]
fn every_schedule_trains_bit_identically_to_the_reference() {
    let (p, m, steps) = (2, 4, 3);
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    for kind in ScheduleKind::ALL {
        let schedule = generate(&Request::new(kind, p, m), &spec).unwrap();
        let config = RunConfig {
            model: model(),
            train: train(m),
            layout: StageLayout::Even,
            compute: Compute::Real,
            recv_timeout: Duration::from_secs(30),
            fault: None,
            post_validate: None,
        };
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
        let (ref_losses, ref_weights) = reference(schedule.stages, m, steps);
        assert_eq!(losses, ref_losses, "{}: losses differ", kind.name());
        assert_eq!(weights.len(), ref_weights.len());
        for ((n, w), (rn, rw)) in weights.iter().zip(&ref_weights) {
            assert_eq!(n, rn);
            assert!(w == rw, "{}: weights of {n} differ", kind.name());
        }
    }
}
