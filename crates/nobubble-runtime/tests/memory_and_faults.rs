//! Measured activation memory equals the planner's prediction from measured bytes; faults
//! stop the run with a clear error, fast.

use nobubble_nn::{Corpus, GptConfig, StageLayout, TrainConfig};
use nobubble_runtime::{Compute, Fault, Pipeline, RunConfig, RuntimeError};
use nobubble_schedule::validate::peak_memory;
use nobubble_schedule::{
    generate, Action, CostModel, CostSpec, Kind, RankCost, Request, ScheduleKind,
};
use std::time::{Duration, Instant};

fn config(m: usize, fault: Option<Fault>, timeout: Duration) -> RunConfig {
    RunConfig {
        model: GptConfig {
            layers: 4,
            ..GptConfig::micro()
        },
        train: TrainConfig {
            microbatches: m,
            ..TrainConfig::default()
        },
        layout: StageLayout::Even,
        compute: Compute::Real,
        recv_timeout: timeout,
        fault,
        post_validate: None,
        data_parallel: 1,
    }
}

fn corpus() -> Corpus {
    Corpus::builtin().prefix(100_000).unwrap()
}

#[test]
fn measured_peak_memory_equals_the_planners_prediction() {
    let unit = CostSpec::uniform(RankCost::default(), 0.0);
    for kind in [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbH2,
        ScheduleKind::ZbV,
        ScheduleKind::Interleaved1F1B,
    ] {
        let schedule = generate(&Request::new(kind, 2, 6), &unit).unwrap();
        let mut pipe = Pipeline::start(
            config(6, None, Duration::from_secs(30)),
            &schedule,
            corpus(),
        )
        .unwrap();
        let bytes = pipe.measure_memory().unwrap();
        assert_eq!(bytes.len(), schedule.stages);
        let costs = CostModel {
            comm: 0.0,
            objective: Default::default(),
            rank_share: Vec::new(),
            stages: bytes
                .iter()
                .map(|&(f, i)| RankCost {
                    f: 1.0,
                    i: 1.0,
                    w: 1.0,
                    mem_b: f as f64,
                    mem_w: i as f64,
                    b: None,
                })
                .collect(),
        };
        let predicted = peak_memory(&schedule, &costs);
        for _ in 0..2 {
            let rec = pipe.train_step(&schedule).unwrap();
            let measured: Vec<f64> = rec.peak_bytes.iter().map(|&b| b as f64).collect();
            assert_eq!(measured, predicted, "{}", kind.name());
        }
    }
}

#[test]
fn a_panicking_stage_stops_the_run_with_rank_stage_and_action() {
    let unit = CostSpec::uniform(RankCost::default(), 0.0);
    let schedule = generate(&Request::new(ScheduleKind::ZbH1, 2, 4), &unit).unwrap();
    let bad = Action::new(1, Kind::I, 2);
    let mut pipe = Pipeline::start(
        config(4, Some(Fault::PanicAt(bad)), Duration::from_secs(20)),
        &schedule,
        corpus(),
    )
    .unwrap();
    let t = Instant::now();
    let e = pipe.train_step(&schedule).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        matches!(e, RuntimeError::Panic { rank: 1, action: Some(a), .. } if a == bad),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("rank 1, stage 1, action 1I2") && msg.contains("injected fault"),
        "{msg}"
    );
    // The pipeline refuses to go on rather than train on a broken state.
    assert!(pipe.train_step(&schedule).is_err());
}

#[test]
fn a_lost_message_ends_the_run_at_the_deadline_naming_the_wait() {
    let unit = CostSpec::uniform(RankCost::default(), 0.0);
    let schedule = generate(&Request::new(ScheduleKind::OneFOneB, 2, 4), &unit).unwrap();
    let starved = Action::new(1, Kind::F, 1);
    let mut pipe = Pipeline::start(
        config(
            4,
            Some(Fault::LoseInputOf(starved)),
            Duration::from_millis(800),
        ),
        &schedule,
        corpus(),
    )
    .unwrap();
    let t = Instant::now();
    let e = pipe.train_step(&schedule).unwrap_err();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("rank 1")
            && msg.contains("action 1F1")
            && msg.contains("activation of stage 1, microbatch 1"),
        "{msg}"
    );
}

#[test]
fn a_schedule_with_weight_gradients_out_of_order_is_refused() {
    // Valid structure, but stage 0 accumulates microbatch 1 before microbatch 0.
    let schedule = nobubble_schedule::export::csv::read(
        "0F0,0F1,0I0,0I1,0W1,0W0\n1F0,1I0,1W0,1F1,1I1,1W1\n",
        "hand",
    )
    .unwrap();
    let e = match Pipeline::start(config(2, None, Duration::from_secs(5)), &schedule, corpus()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an out-of-order schedule was accepted"),
    };
    assert!(e.contains("microbatch order") && e.contains("0W0"), "{e}");
}
