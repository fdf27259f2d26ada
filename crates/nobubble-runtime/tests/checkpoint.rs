//! Checkpoints: save at step k and resume (under the same or another schedule and stage
//! count) gives the uninterrupted run's losses and weights bit for bit; damaged or
//! mismatched checkpoints are refused with a message naming the problem; an interrupted
//! save leaves the previous checkpoint loadable.

use nobubble_nn::config::Arch;
use nobubble_nn::{Corpus, GptConfig, StageLayout, TrainConfig};
use nobubble_runtime::checkpoint_fs::{load, previous_dir, save, staging_dir};
use nobubble_runtime::worker::Rollback;
use nobubble_runtime::{Checkpoint, Compute, Pipeline, RunConfig, TrainingState};
use nobubble_schedule::{generate, CostSpec, RankCost, Request, Schedule, ScheduleKind};
use std::path::PathBuf;
use std::time::Duration;

fn model() -> GptConfig {
    GptConfig {
        layers: 4,
        ..GptConfig::micro()
    }
}

fn train() -> TrainConfig {
    TrainConfig {
        microbatches: 4,
        max_grad_norm: Some(0.5),
        warmup_steps: 4,
        ..TrainConfig::default()
    }
}

fn corpus() -> Corpus {
    Corpus::builtin().prefix(100_000).unwrap()
}

fn start_with(
    kind: ScheduleKind,
    ranks: usize,
    model: GptConfig,
    post_validate: Option<Rollback>,
) -> (Pipeline, Schedule) {
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    let schedule = generate(&Request::new(kind, ranks, train().microbatches), &spec).unwrap();
    let config = RunConfig {
        model,
        train: train(),
        layout: StageLayout::Even,
        compute: Compute::Real,
        recv_timeout: Duration::from_secs(30),
        fault: None,
        post_validate,
        data_parallel: 1,
    };
    (
        Pipeline::start(config, &schedule, corpus()).unwrap(),
        schedule,
    )
}

fn start(kind: ScheduleKind, ranks: usize, model: GptConfig) -> (Pipeline, Schedule) {
    start_with(kind, ranks, model, None)
}

fn bits(p: &mut Pipeline) -> Vec<(String, Vec<u32>)> {
    p.params()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, v.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nobubble-ckpt-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn checkpoint_at(steps: u64) -> Checkpoint {
    let (mut p, s) = start(ScheduleKind::OneFOneB, 2, model());
    for _ in 0..steps {
        p.train_step(&s).unwrap();
    }
    Checkpoint::new(
        p.export_state().unwrap(),
        &model(),
        &train(),
        "1f1b on 2 ranks",
    )
}

#[test]
fn resume_continues_bit_for_bit() {
    resume_continues_bit_for_bit_with(model());
}

#[test]
fn resume_of_llama_blocks_continues_bit_for_bit() {
    resume_continues_bit_for_bit_with(model().with_arch(Arch::Llama));
}

#[test]
fn resume_with_tied_embeddings_continues_bit_for_bit_and_saves_the_embedding_once() {
    let tied = GptConfig {
        tie_embeddings: true,
        ..model().with_arch(Arch::Llama)
    };
    let (mut p, _) = start(ScheduleKind::OneFOneB, 2, tied.clone());
    let state = p.export_state().unwrap();
    assert!(state.params.contains_key("embed.tokens"));
    assert!(!state.params.contains_key("lm_head.weight"), "saved once");
    assert!(!state.optimizer.moments.contains_key("lm_head.weight"));
    drop(p);
    resume_continues_bit_for_bit_with(tied);
}

fn resume_continues_bit_for_bit_with(model: GptConfig) {
    let model = || model.clone();
    let (total, k) = (7u64, 3u64);
    let (mut full, s) = start(ScheduleKind::ZbH1, 2, model());
    let want: Vec<u32> = (0..total)
        .map(|_| full.train_step(&s).unwrap().loss.to_bits())
        .collect();
    let want_weights = bits(&mut full);

    let (mut first, s) = start(ScheduleKind::ZbH1, 2, model());
    for _ in 0..k {
        first.train_step(&s).unwrap();
    }
    let dir = temp_dir(&format!(
        "resume-{}-{}",
        model().arch.name(),
        model().tie_embeddings
    ))
    .join("ckpt");
    save(
        &dir,
        &Checkpoint::new(first.export_state().unwrap(), &model(), &train(), "zb-h1"),
    )
    .unwrap();
    drop(first);

    // Same schedule, another schedule on another number of stages (parameters and
    // moments are loaded by name), and post-validated optimizer steps.
    for (kind, ranks, post) in [
        (ScheduleKind::ZbH1, 2, None),
        (ScheduleKind::ZbV, 2, None),
        (ScheduleKind::OneFOneB, 1, Some(Rollback::Copy)),
    ] {
        let ckpt = load(&dir).unwrap();
        assert_eq!(ckpt.meta.step, k);
        assert!(ckpt.check_resume(&model(), &train()).unwrap().is_empty());
        let other = match model().arch {
            Arch::Gpt => model().with_arch(Arch::Llama),
            Arch::Llama => model().with_arch(Arch::Gpt),
        };
        let err = ckpt.check_resume(&other, &train()).unwrap_err().to_string();
        assert!(err.contains("arch"), "{err}");
        let (mut resumed, s) = start_with(kind, ranks, model(), post);
        resumed.import_state(ckpt.state).unwrap();
        assert_eq!(resumed.steps_taken(), k);
        let got: Vec<u32> = (k..total)
            .map(|_| resumed.train_step(&s).unwrap().loss.to_bits())
            .collect();
        assert_eq!(
            got,
            want[k as usize..],
            "{}: losses after resuming differ",
            kind.name()
        );
        assert!(
            bits(&mut resumed) == want_weights,
            "{}: final weights differ",
            kind.name()
        );
    }
    // And the round trip through the files loses nothing.
    let (mut again, s) = start(ScheduleKind::OneFOneB, 2, model());
    for _ in 0..k {
        again.train_step(&s).unwrap();
    }
    assert_eq!(again.export_state().unwrap(), load(&dir).unwrap().state);
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

fn err_of<T: std::fmt::Debug>(r: Result<T, nobubble_runtime::RuntimeError>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn mismatched_or_damaged_checkpoints_are_refused_clearly() {
    let root = temp_dir("bad");
    let dir = root.join("ckpt");
    let ckpt = checkpoint_at(1);
    save(&dir, &ckpt).unwrap();

    // Configuration mismatches.
    let bigger = GptConfig {
        layers: 6,
        ..model()
    };
    let e = err_of(ckpt.check_resume(&bigger, &train()));
    assert!(e.contains("layers 6 (checkpoint: 4)"), "{e}");
    let e = err_of(ckpt.check_resume(
        &model(),
        &TrainConfig {
            microbatches: 8,
            ..train()
        },
    ));
    assert!(
        e.contains("4 microbatches per step, this run uses 8"),
        "{e}"
    );
    let warned = ckpt
        .check_resume(
            &model(),
            &TrainConfig {
                data_seed: 99,
                ..train()
            },
        )
        .unwrap();
    assert!(warned[0].contains("data seed"), "{warned:?}");
    // `train` derives the data seed from --seed: the warning names the user's --seed.
    let warned = ckpt
        .check_resume(
            &model(),
            &TrainConfig {
                seed: 5,
                data_seed: 6,
                ..train()
            },
        )
        .unwrap();
    assert!(warned[0].starts_with("--seed 5 differs"), "{warned:?}");

    // A model with more parameters than the checkpoint: the missing one is named.
    let (mut p, _) = start(ScheduleKind::OneFOneB, 2, bigger);
    let e = err_of(p.import_state(ckpt.state.clone()));
    assert!(e.contains("no parameter `blocks.4."), "{e}");
    // A model with fewer: the extras are named.
    let smaller = GptConfig {
        layers: 2,
        ..model()
    };
    let (mut p, _) = start(ScheduleKind::OneFOneB, 2, smaller);
    let e = err_of(p.import_state(ckpt.state.clone()));
    assert!(
        e.contains("parameters the model does not (e.g. blocks.2."),
        "{e}"
    );

    // Files.
    let e = err_of(load(&root.join("missing")));
    assert!(e.contains("no checkpoint at"), "{e}");
    let e = err_of(load(&root));
    assert!(e.contains("not a nobubble checkpoint"), "{e}");

    let model_file = dir.join("model.safetensors");
    let good = std::fs::read(&model_file).unwrap();
    std::fs::write(&model_file, &good[..good.len() / 2]).unwrap();
    let e = err_of(load(&dir));
    assert!(e.contains("model.safetensors is damaged"), "{e}");
    std::fs::write(&model_file, &good).unwrap();

    let opt_file = dir.join("optimizer.safetensors");
    let good_opt = std::fs::read(&opt_file).unwrap();
    std::fs::write(&opt_file, b"garbage").unwrap();
    let e = err_of(load(&dir));
    assert!(e.contains("optimizer.safetensors is damaged"), "{e}");
    std::fs::write(&opt_file, &good_opt).unwrap();

    let meta_file = dir.join("checkpoint.json");
    let meta = std::fs::read_to_string(&meta_file).unwrap();
    std::fs::write(
        &meta_file,
        meta.replace("\"version\": 1", "\"version\": 99"),
    )
    .unwrap();
    let e = err_of(load(&dir));
    assert!(e.contains("version 99"), "{e}");
    std::fs::write(&meta_file, "{ not json").unwrap();
    let e = err_of(load(&dir));
    assert!(e.contains("checkpoint.json is damaged"), "{e}");
    std::fs::write(&meta_file, &meta).unwrap();
    assert_eq!(load(&dir).unwrap(), ckpt);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn an_interrupted_save_leaves_the_previous_checkpoint_loadable() {
    let dir = temp_dir("atomic").join("ckpt");
    let a = checkpoint_at(1);
    let b = checkpoint_at(2);
    save(&dir, &a).unwrap();

    // Crash while writing: a half-written staging directory is ignored.
    let tmp = staging_dir(&dir);
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("model.safetensors"), b"half a file").unwrap();
    assert_eq!(load(&dir).unwrap(), a);

    // Killed while writing its checkpoint.json: a beginning of ours is still ours (a
    // staging directory with another tool's checkpoint.json is not).
    let full = std::fs::read(dir.join("checkpoint.json")).unwrap();
    for cut in [0, 5, 40, full.len() / 2] {
        std::fs::write(tmp.join("checkpoint.json"), &full[..cut]).unwrap();
        save(&dir, &a).unwrap();
        std::fs::create_dir_all(&tmp).unwrap();
    }
    std::fs::write(tmp.join("checkpoint.json"), b"{\"format\": \"other\"").unwrap();
    let e = err_of(save(&dir, &b));
    assert!(e.contains("not a nobubble checkpoint"), "{e}");
    std::fs::remove_dir_all(&tmp).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();

    // The next save replaces the leftover and the old checkpoint.
    save(&dir, &b).unwrap();
    assert!(!tmp.exists() && !previous_dir(&dir).exists());
    let loaded = load(&dir).unwrap();
    assert_eq!(loaded, b);
    assert_ne!(loaded.state, a.state);

    // Crash between "move the old one aside" and "rename the new one in": the target is
    // missing, the previous checkpoint is read from beside it.
    std::fs::rename(&dir, previous_dir(&dir)).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    assert_eq!(load(&dir).unwrap(), b);
    save(&dir, &a).unwrap();
    assert_eq!(load(&dir).unwrap(), a);
    assert!(!tmp.exists() && !previous_dir(&dir).exists());

    // A directory that is not a checkpoint is never replaced.
    let other = dir.with_file_name("my-files");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"keep me").unwrap();
    let e = err_of(save(&other, &a));
    assert!(
        e.contains("notes.txt") && e.contains("never deletes"),
        "{e}"
    );
    assert!(other.join("notes.txt").is_file());
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn exported_state_covers_every_parameter_once() {
    let state: TrainingState = checkpoint_at(1).state;
    assert_eq!(state.step, 1);
    assert_eq!(state.optimizer.steps, 1);
    assert_eq!(state.params.len(), state.optimizer.moments.len());
    let count: usize = state.params.values().map(|t| t.len()).sum();
    assert_eq!(count, model().parameter_count());
}

#[test]
fn a_skipped_post_validated_step_can_be_saved_and_resumed() {
    // Analytic rollback of a skipped step leaves the stages with different last-step
    // records (stage 0 never stepped, stage 1 stepped and forgot it); the export must
    // still succeed and the resumed run continue like the original.
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    let schedule = generate(&Request::new(ScheduleKind::ZbH1, 2, 4), &spec).unwrap();
    let config = |fault| RunConfig {
        model: model(),
        train: train(),
        layout: StageLayout::Even,
        compute: Compute::Real,
        recv_timeout: Duration::from_secs(30),
        fault,
        post_validate: Some(Rollback::Analytic),
        data_parallel: 1,
    };
    let fault = Some(nobubble_runtime::Fault::NanGradAt(1));
    let mut p = Pipeline::start(config(fault), &schedule, corpus()).unwrap();
    let skipped: Vec<bool> = (0..2)
        .map(|_| p.train_step(&schedule).unwrap().skipped)
        .collect();
    assert_eq!(skipped, [false, true]);
    let state = p.export_state().unwrap();
    assert_eq!((state.step, state.optimizer.steps), (2, 1));
    let mut resumed = Pipeline::start(config(None), &schedule, corpus()).unwrap();
    resumed.import_state(state).unwrap();
    for _ in 2..4 {
        let (a, b) = (
            p.train_step(&schedule).unwrap(),
            resumed.train_step(&schedule).unwrap(),
        );
        assert_eq!(a.loss.to_bits(), b.loss.to_bits());
    }
    assert!(bits(&mut p) == bits(&mut resumed));
}
