//! Model- and trainer-level checks: split-independent init, whole-model finite
//! differences, stage interleaving, stage memory hand counts, pass-order errors,
//! and the reference trainer's learning and determinism.

use crate::config::{Arch, GptConfig, StageLayout};
use crate::data::Corpus;
use crate::model::{build_stages, split_model, split_model_v, Stage, StageInput};
use crate::reference::{forward_loss, run_microbatch, ReferenceTrainer, TrainConfig};
use crate::testutil::{central_difference, randomize};
use crate::{NnError, Tensor};

fn micro_data(cfg: &GptConfig, step: u64, mb: usize) -> crate::data::Microbatch {
    Corpus::builtin()
        .microbatch(3, step, mb, cfg.microbatch_size, cfg.seq_len)
        .unwrap()
}

fn all_params(stages: &[Stage]) -> Vec<(String, Vec<f32>, Vec<f32>)> {
    stages
        .iter()
        .flat_map(|s| s.params())
        .map(|p| {
            (
                p.name.clone(),
                p.value.data().to_vec(),
                p.grad.data().to_vec(),
            )
        })
        .collect()
}

#[test]
fn initial_weights_do_not_depend_on_the_split() {
    let cfg = GptConfig {
        layers: 4,
        ..GptConfig::micro()
    };
    let whole = all_params(&build_stages(&cfg, 42, &[4]).unwrap());
    for layout in [vec![1, 3], vec![0, 2, 2, 0], vec![1, 1, 1, 1]] {
        assert_eq!(
            all_params(&build_stages(&cfg, 42, &layout).unwrap()),
            whole,
            "{layout:?}"
        );
    }
    let v = split_model_v(&cfg, 42, 2, &StageLayout::Even).unwrap();
    assert_eq!(v.len(), 4);
    assert_eq!(all_params(&v), whole);
    assert_ne!(all_params(&build_stages(&cfg, 43, &[4]).unwrap()), whole);
    let lighter = split_model(&cfg, 42, 3, &StageLayout::LighterEdges { fewer: 1 }).unwrap();
    assert_eq!(
        lighter.iter().map(|s| s.blocks.len()).collect::<Vec<_>>(),
        vec![1, 2, 1]
    );
    assert!(lighter[0].is_first() && !lighter[1].is_first() && lighter[2].is_last());
    // Tied: the head's copy starts as the embedding, whatever the split.
    let mut tied = cfg.clone();
    tied.tie_embeddings = true;
    for layout in [vec![4], vec![1, 3]] {
        let st = build_stages(&tied, 42, &layout).unwrap();
        let e = &st[0].embedding.as_ref().unwrap().tokens.value;
        let h = &st
            .last()
            .unwrap()
            .head
            .as_ref()
            .unwrap()
            .lm_head
            .weight
            .value;
        assert_eq!(e, h, "{layout:?}");
    }
}

#[test]
fn whole_model_loss_matches_finite_differences() {
    whole_model_loss_matches_finite_differences_for(Arch::Gpt);
}

#[test]
fn whole_llama_model_loss_matches_finite_differences() {
    whole_model_loss_matches_finite_differences_for(Arch::Llama);
}

fn whole_model_loss_matches_finite_differences_for(arch: Arch) {
    let cfg = GptConfig::micro().with_arch(arch);
    let mut stages = build_stages(&cfg, 5, &[1, 1]).unwrap();
    for (i, s) in stages.iter_mut().enumerate() {
        randomize(s.params_mut(), 100 + i as u64);
    }
    let data = micro_data(&cfg, 0, 0);
    run_microbatch(&mut stages, 0, &data).unwrap();
    let mut mb = 1;
    let probes = [
        (
            0usize,
            "embed.tokens",
            data.tokens[3] as usize * cfg.hidden + 5,
        ),
        (0, "embed.positions", 7),
        (0, "blocks.0.attn.qkv.weight", 100),
        (0, "blocks.0.ln2.gamma", 3),
        (1, "blocks.1.mlp.fc2.bias", 2),
        (1, "blocks.1.mlp.fc1.weight", 900),
        (1, "blocks.1.attn.proj.weight", 77),
        (1, "final_ln.beta", 4),
        (1, "final_ln.gamma", 4),
        (1, "lm_head.weight", 1000),
    ];
    let mut probed = 0;
    for (stage, name, idx) in probes {
        // Llama blocks have no positions table, biases or β.
        let Some(pi) = stages[stage].params().iter().position(|p| p.name == name) else {
            assert!(arch == Arch::Llama, "{name} missing");
            continue;
        };
        probed += 1;
        let analytic = stages[stage].params()[pi].grad.data()[idx];
        let scale = stages[stage].params()[pi]
            .grad
            .data()
            .iter()
            .fold(0f64, |m, v| m.max(v.abs() as f64));
        let x0 = stages[stage].params()[pi].value.data()[idx];
        let fd = central_difference(
            |v| {
                stages[stage].params_mut()[pi].value.data_mut()[idx] = v;
                mb += 1;
                forward_loss(&mut stages, mb, &data).unwrap() as f64
            },
            x0,
            1e-2,
        );
        stages[stage].params_mut()[pi].value.data_mut()[idx] = x0;
        let err = (fd - analytic as f64).abs();
        assert!(
            err <= 3e-2 * analytic.abs() as f64 + 3e-3 * scale,
            "{name}[{idx}]: fd {fd} vs {analytic}"
        );
    }
    assert!(probed >= 6, "{probed} parameters probed");
    // Input of the last stage (the activations crossing the stage boundary).
    let act = stages[0]
        .forward(1000, StageInput::Tokens(&data.tokens), None)
        .unwrap()
        .into_activations()
        .unwrap();
    stages[1]
        .forward(
            1000,
            StageInput::Activations(act.clone()),
            Some(&data.targets),
        )
        .unwrap();
    let dx = stages[1].backward_input(1000, None).unwrap().unwrap();
    let scale = dx.data().iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    for idx in [0, 33, 200, act.len() - 1] {
        let fd = central_difference(
            |v| {
                let mut a = act.clone();
                a.data_mut()[idx] = v;
                mb += 1;
                let out = stages[1].forward(mb, StageInput::Activations(a), Some(&data.targets));
                out.unwrap().loss().unwrap() as f64
            },
            act.data()[idx],
            1e-2,
        );
        let err = (fd - dx.data()[idx] as f64).abs();
        assert!(
            err <= 3e-2 * dx.data()[idx].abs() as f64 + 3e-3 * scale,
            "activation[{idx}]: fd {fd} vs {}",
            dx.data()[idx]
        );
    }
}

#[test]
fn interleaved_stage_passes_are_bit_identical_to_in_order() {
    let cfg = GptConfig::micro();
    let data: Vec<_> = (0..2).map(|mb| micro_data(&cfg, 0, mb)).collect();
    let mut in_order = build_stages(&cfg, 9, &[1, 1]).unwrap();
    let losses: Vec<f32> = (0..2)
        .map(|mb| run_microbatch(&mut in_order, mb, &data[mb]).unwrap())
        .collect();

    let mut s = build_stages(&cfg, 9, &[1, 1]).unwrap();
    let mut acts = Vec::new();
    for (mb, d) in data.iter().enumerate() {
        acts.push(
            s[0].forward(mb, StageInput::Tokens(&d.tokens), None)
                .unwrap()
                .into_activations()
                .unwrap(),
        );
    }
    let l0 = s[1]
        .forward(
            0,
            StageInput::Activations(acts[0].clone()),
            Some(&data[0].targets),
        )
        .unwrap();
    let l1 = s[1]
        .forward(
            1,
            StageInput::Activations(acts[1].clone()),
            Some(&data[1].targets),
        )
        .unwrap();
    assert_eq!(
        (l0.loss().unwrap(), l1.loss().unwrap()),
        (losses[0], losses[1])
    );
    assert_eq!(s[1].pending_input_grads(), vec![0, 1]);
    let g1 = s[1].backward_input(1, None).unwrap();
    assert_eq!(
        (s[1].pending_input_grads(), s[1].pending_weight_grads()),
        (vec![0], vec![1])
    );
    let g0 = s[1].backward_input(0, None).unwrap();
    assert!(s[0].backward_input(1, g1).unwrap().is_none());
    assert!(s[0].backward_input(0, g0).unwrap().is_none());
    for stage in s.iter_mut() {
        stage.backward_weight(0).unwrap();
        stage.backward_weight(1).unwrap();
    }
    assert_eq!(all_params(&s), all_params(&in_order));
    assert!(s
        .iter()
        .all(|st| st.pending_input_grads().is_empty() && st.pending_weight_grads().is_empty()));
}

#[test]
fn stage_memory_matches_hand_count_and_shrinks_after_i() {
    // Two blocks per stage: with a single micro block, the embedding's kept output
    // gradient (n·h floats, needed by its W) would outweigh what the block frees in I.
    let cfg = GptConfig {
        layers: 4,
        ..GptConfig::micro()
    };
    let (n, h, a, s, v) = (
        cfg.tokens_per_microbatch(),
        cfg.hidden,
        cfg.heads,
        cfg.seq_len,
        cfg.vocab,
    );
    let block_f = 16 * n * h + 2 * n + (n / s) * a * s * s;
    // LayerNorm partials 4h, the four linears' bias partials 3h + h + 4h + h.
    let block_i = 16 * n * h + 4 * h + 9 * h;
    let mut stages = build_stages(&cfg, 1, &[2, 2]).unwrap();
    let first = stages[0].measure_memory().unwrap();
    assert_eq!(
        first.per_layer[0].1.after_forward,
        4 * n,
        "embedding keeps the token ids"
    );
    assert_eq!(
        first.per_layer[0].1.after_input_grad,
        4 * (n + n * h),
        "and then dy for W"
    );
    assert_eq!(first.per_layer[1].1.after_forward, 4 * block_f);
    assert_eq!(first.per_layer[1].1.after_input_grad, 4 * block_i);
    let last = stages[1].measure_memory().unwrap();
    let head_f = (n * h + n) + n * h + n * v + n;
    let head_i = 2 * h + n * h + n * v;
    assert_eq!(last.per_layer[2].1.after_forward, 4 * head_f);
    assert_eq!(last.per_layer[2].1.after_input_grad, 4 * head_i);
    assert_eq!(first.total.after_forward, 4 * (n + 2 * block_f));
    assert_eq!(first.total.after_input_grad, 4 * (n + n * h + 2 * block_i));
    assert_eq!(last.total.after_forward, 4 * (2 * block_f + head_f));
    assert_eq!(last.total.after_input_grad, 4 * (2 * block_i + head_i));
    for m in [&first, &last] {
        assert!(m.total.after_forward > m.total.after_input_grad);
        assert!(m.total.after_input_grad > 0);
        assert_eq!(m.total.after_weight_grad, 0);
        for (name, l) in &m.per_layer {
            assert_eq!(l.after_weight_grad, 0, "{name}");
            if name != "embed" {
                assert!(l.after_forward > l.after_input_grad, "{name}");
            }
        }
    }
    // Measuring leaves gradients untouched.
    assert!(stages.iter().flat_map(|s| s.params()).all(|p| p
        .grad
        .data()
        .iter()
        .all(|&g| g == 0.0)));
}

/// `GptConfig::block_bytes`, the runtime's estimate before it measures, is what a built
/// block holds: at a width whose MLP rows are padded (4h = 512 floats, 2 KiB) and at one
/// whose are not.
#[test]
fn block_bytes_match_a_measured_block_with_and_without_padded_rows() {
    for (hidden, padded) in [(128, true), (96, false)] {
        let cfg = GptConfig {
            layers: 2,
            hidden,
            heads: 4,
            seq_len: 16,
            ..GptConfig::micro()
        };
        let mut stages = build_stages(&cfg, 1, &[1, 1]).unwrap();
        let m = stages[0].measure_memory().unwrap();
        let (name, block) = &m.per_layer[1];
        let (after_f, after_i) = cfg.block_bytes();
        assert_eq!(block.after_forward as f64, after_f, "{name}, h {hidden}");
        assert_eq!(block.after_input_grad as f64, after_i, "{name}, h {hidden}");
        let n = cfg.tokens_per_microbatch();
        let unpadded_f = 4 * (16 * n * hidden + 2 * n + n * cfg.heads * cfg.seq_len);
        let extra = if padded { 4 * 16 * n } else { 0 };
        assert_eq!(block.after_forward, unpadded_f + extra, "h {hidden}");
    }
}

#[test]
fn stage_pass_order_and_input_errors() {
    let cfg = GptConfig::micro();
    let mut s = build_stages(&cfg, 1, &[1, 1]).unwrap();
    let d = micro_data(&cfg, 0, 0);
    let n = cfg.tokens_per_microbatch();
    assert!(
        matches!(s[0].backward_weight(0), Err(NnError::PassOrder { .. })),
        "W with nothing queued"
    );
    assert!(
        matches!(s[1].backward_input(0, None), Err(NnError::PassOrder { .. })),
        "I without F"
    );
    assert!(s[1]
        .forward(0, StageInput::Tokens(&d.tokens), Some(&d.targets))
        .is_err());
    assert!(s[0]
        .forward(
            0,
            StageInput::Activations(Tensor::zeros(&[n, cfg.hidden])),
            None
        )
        .is_err());
    let act = Tensor::zeros(&[n, cfg.hidden]);
    assert!(
        s[1].forward(0, StageInput::Activations(act.clone()), None)
            .is_err(),
        "missing targets"
    );
    assert!(s[1]
        .forward(
            0,
            StageInput::Activations(act.clone()),
            Some(&d.targets[1..])
        )
        .is_err());
    let mut bad = d.tokens.clone();
    bad[0] = 300;
    assert!(matches!(
        s[0].forward(0, StageInput::Tokens(&bad), None),
        Err(NnError::BadInput(_))
    ));
    assert_eq!(
        s[0].held_bytes(0) + s[1].held_bytes(0),
        0,
        "rejected passes leave no state"
    );

    // A wrongly shaped output gradient is an error and leaves the stage ready for
    // the correct one.
    s[0].forward(0, StageInput::Tokens(&d.tokens), None)
        .unwrap();
    for bad in [
        Tensor::zeros(&[n - 1, cfg.hidden]),
        Tensor::zeros(&[n, cfg.hidden + 1]),
    ] {
        assert!(matches!(
            s[0].backward_input(0, Some(bad)),
            Err(NnError::BadInput(_))
        ));
    }
    assert!(
        s[0].backward_input(0, None).is_err(),
        "a first stage needs a gradient"
    );
    let held = s[0].held_bytes(0);
    s[0].backward_input(0, Some(Tensor::zeros(&[n, cfg.hidden])))
        .unwrap();
    assert!(s[0].held_bytes(0) != held);
    s[0].backward_weight(0).unwrap();
    assert_eq!(s[0].held_bytes(0), 0);

    run_microbatch(&mut s, 0, &d).unwrap();
    let err = s[1].backward_weight(0).unwrap_err();
    assert!(
        err.to_string().contains("nothing queued"),
        "double W: {err}"
    );
    assert!(s[0]
        .backward_input(0, Some(Tensor::zeros(&[n, cfg.hidden])))
        .is_err());
}

fn trainer(cfg: &GptConfig, split: &[usize], max_grad_norm: Option<f32>) -> ReferenceTrainer {
    let train = TrainConfig {
        microbatches: 2,
        max_grad_norm,
        ..TrainConfig::default()
    };
    ReferenceTrainer::new(cfg, &train, Corpus::builtin(), split).unwrap()
}

#[test]
fn reference_trainer_is_deterministic_and_split_independent() {
    let cfg = GptConfig::micro();
    let run = |split: &[usize], clip| {
        let mut t = trainer(&cfg, split, clip);
        let losses: Vec<f32> = (0..8).map(|_| t.train_step().unwrap().loss).collect();
        (losses, all_params(t.stages()))
    };
    let (a, wa) = run(&[2], Some(1.0));
    let (b, wb) = run(&[2], Some(1.0));
    assert_eq!(a, b, "same seed, same data → bit-identical losses");
    assert_eq!(wa, wb);
    // A non-finite gradient skips the update and discards the gradients.
    let mut t = trainer(&cfg, &[2], Some(1.0));
    t.stages_mut()[0].params_mut()[1].value.data_mut()[0] = f32::NAN; // position 0
    let before = all_params(t.stages());
    let r = t.train_step().unwrap();
    assert!(r.skipped && !r.grad_norm.is_finite() && r.loss.is_nan());
    let after = all_params(t.stages());
    assert_eq!(before[2..], after[2..], "no parameter moved");
    assert_eq!(before[0], after[0]);
    assert!(t.stages().iter().flat_map(|s| s.params()).all(|p| p
        .grad
        .data()
        .iter()
        .all(|&g| g == 0.0)));
    assert_eq!(t.steps_taken(), 1);

    let (c, wc) = run(&[2], None);
    let (d, wd) = run(&[1, 1], None);
    assert_eq!(c, d, "the split does not change a single bit");
    assert_eq!(wc, wd);
}

#[test]
fn more_threads_per_rank_do_not_change_a_bit() {
    more_threads_per_rank_do_not_change_a_bit_for(Arch::Gpt);
    more_threads_per_rank_do_not_change_a_bit_for(Arch::Llama);
}

fn more_threads_per_rank_do_not_change_a_bit_for(arch: Arch) {
    // Big enough that the GEMMs, the row-wise kernels and the attention sequences all
    // split over the threads (`CpuBackend::rows_per_group`, gemm's threading threshold).
    let cfg = GptConfig {
        layers: 2,
        ..GptConfig::tiny()
    }
    .with_arch(arch);
    let run = |threads: usize| {
        let train = TrainConfig {
            microbatches: 2,
            threads,
            ..TrainConfig::default()
        };
        let mut t = ReferenceTrainer::new(&cfg, &train, Corpus::builtin(), &[2]).unwrap();
        let losses: Vec<f32> = (0..3).map(|_| t.train_step().unwrap().loss).collect();
        (losses, all_params(t.stages()))
    };
    let (one, w1) = run(1);
    let (two, w2) = run(2);
    assert!(one.iter().all(|l| l.is_finite()));
    assert_eq!(one, two, "2 threads per rank change the losses");
    assert_eq!(w1, w2, "2 threads per rank change the weights");
}

#[test]
fn reference_trainer_loss_goes_down() {
    let cfg = GptConfig {
        layers: 2,
        hidden: 64,
        heads: 4,
        seq_len: 32,
        microbatch_size: 4,
        ..GptConfig::micro()
    };
    let mut t = trainer(&cfg, &[2], Some(1.0));
    let losses: Vec<f32> = (0..300).map(|_| t.train_step().unwrap().loss).collect();
    assert!(
        (losses[0] - 256f32.ln()).abs() < 0.2,
        "starts near ln 256: {}",
        losses[0]
    );
    let tail = losses[280..].iter().sum::<f32>() / 20.0;
    assert!(
        tail < 2.6,
        "loss after 300 steps {tail} (from {})",
        losses[0]
    );
}

/// One pass of a per-stage program.
#[derive(Clone, Copy, Debug)]
enum Pass {
    F(usize),
    I(usize),
    W(usize),
}

/// 1F1B order with every W deferred behind the next I (W still in microbatch order).
fn one_f_one_b_deferred_w(stage: usize, stages: usize, m: usize) -> Vec<Pass> {
    let warm = (stages - 1 - stage).min(m);
    let mut order: Vec<Pass> = (0..warm).map(Pass::F).collect();
    for j in 0..m {
        if warm + j < m {
            order.push(Pass::F(warm + j));
        }
        order.push(Pass::I(j));
        if j >= 1 {
            order.push(Pass::W(j - 1));
        }
    }
    order.push(Pass::W(m - 1));
    order
}

#[test]
fn a_pipelined_pass_order_reproduces_the_reference_bit_for_bit() {
    a_pipelined_pass_order_reproduces_the_reference_for(Arch::Gpt);
}

#[test]
fn a_pipelined_pass_order_of_llama_blocks_reproduces_the_reference_bit_for_bit() {
    a_pipelined_pass_order_reproduces_the_reference_for(Arch::Llama);
}

fn a_pipelined_pass_order_reproduces_the_reference_for(arch: Arch) {
    use crate::optim::{clip_scale, grad_norm_sq, AdamW};
    use std::collections::{HashMap, VecDeque};

    let cfg = GptConfig {
        layers: 3,
        ..GptConfig::micro()
    }
    .with_arch(arch);
    let split = [1, 1, 1];
    let m = 4;
    let train = TrainConfig {
        microbatches: m,
        max_grad_norm: Some(0.5),
        ..TrainConfig::default()
    };
    let mut reference = ReferenceTrainer::new(&cfg, &train, Corpus::builtin(), &split).unwrap();
    let mut stages = build_stages(&cfg, train.seed, &split).unwrap();
    for s in &mut stages {
        s.set_loss_grad_scale(1.0 / m as f32);
        s.set_microbatches(m);
    }
    let mut optimizers: Vec<AdamW> = stages
        .iter()
        .map(|s| AdamW::new(train.optimizer, &s.params()))
        .collect();
    let p = stages.len();
    for step in 0..3u64 {
        let data: Vec<_> = (0..m)
            .map(|mb| reference.microbatch(step, mb).unwrap())
            .collect();
        let expected = reference.train_step().unwrap();

        // Run the per-stage programs, each pass as soon as its input has arrived.
        let mut programs: Vec<VecDeque<Pass>> = (0..p)
            .map(|s| one_f_one_b_deferred_w(s, p, m).into())
            .collect();
        let mut activations: HashMap<(usize, usize), Tensor> = HashMap::new();
        let mut gradients: HashMap<(usize, usize), Tensor> = HashMap::new();
        let mut losses = vec![0.0f32; m];
        while programs.iter().any(|q| !q.is_empty()) {
            let mut progressed = false;
            for s in 0..p {
                let Some(&pass) = programs[s].front() else {
                    continue;
                };
                let ran = match pass {
                    Pass::F(mb) if s == 0 || activations.contains_key(&(s - 1, mb)) => {
                        let input = if s == 0 {
                            StageInput::Tokens(&data[mb].tokens)
                        } else {
                            StageInput::Activations(activations.remove(&(s - 1, mb)).unwrap())
                        };
                        let out = stages[s]
                            .forward(mb, input, (s == p - 1).then_some(&data[mb].targets[..]))
                            .unwrap();
                        match out {
                            crate::StageOutput::Loss(l) => losses[mb] = l,
                            crate::StageOutput::Activations(a) => {
                                activations.insert((s, mb), a);
                            }
                        }
                        true
                    }
                    Pass::I(mb) if s == p - 1 || gradients.contains_key(&(s + 1, mb)) => {
                        let g = gradients.remove(&(s + 1, mb));
                        if let Some(dx) = stages[s].backward_input(mb, g).unwrap() {
                            gradients.insert((s, mb), dx);
                        }
                        true
                    }
                    Pass::W(mb) => {
                        stages[s].backward_weight(mb).unwrap();
                        true
                    }
                    _ => false,
                };
                if ran {
                    programs[s].pop_front();
                    progressed = true;
                }
            }
            assert!(progressed, "the pass programs deadlocked");
        }
        let loss = (losses.iter().map(|&l| l as f64).sum::<f64>() / m as f64) as f32;
        assert_eq!(loss, expected.loss, "step {step} loss");

        // Partial norms chained in stage order, optimistic step per stage.
        let norm_sq: f64 = stages.iter().map(|s| grad_norm_sq(&s.params())).sum();
        assert_eq!(norm_sq.sqrt(), expected.grad_norm, "step {step} norm");
        let scale = clip_scale(norm_sq, train.max_grad_norm).unwrap();
        for (s, opt) in stages.iter_mut().zip(&mut optimizers) {
            opt.config.lr = expected.lr;
            opt.step(&mut s.params_mut(), scale).unwrap();
            s.zero_grads();
        }
        assert_eq!(
            all_params(&stages),
            all_params(reference.stages()),
            "step {step} weights"
        );
    }
}

#[test]
fn stages_and_tensors_can_move_to_worker_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<Stage>();
    assert_send::<Tensor>();
    assert_send::<crate::AdamW>();
    // And actually run a stage on another thread.
    let cfg = GptConfig::micro();
    let mut stages = build_stages(&cfg, 1, &[2]).unwrap();
    let mut stage = stages.pop().unwrap();
    let data = micro_data(&cfg, 0, 0);
    let loss = std::thread::spawn(move || {
        let out = stage.forward(0, StageInput::Tokens(&data.tokens), Some(&data.targets));
        out.unwrap().loss().unwrap()
    })
    .join()
    .unwrap();
    assert!((loss - 256f32.ln()).abs() < 0.1);
}

#[test]
fn tied_embeddings_train_as_one_shared_tensor() {
    let cfg = GptConfig {
        tie_embeddings: true,
        ..GptConfig::micro().with_arch(Arch::Llama)
    };
    let run = |split: &[usize]| {
        let mut t = trainer(&cfg, split, Some(1.0));
        let losses: Vec<u32> = (0..4)
            .map(|_| t.train_step().unwrap().loss.to_bits())
            .collect();
        (losses, all_params(t.stages()))
    };
    let (one, w1) = run(&[2]);
    let (two, w2) = run(&[1, 1]);
    assert_eq!(one, two, "the split does not change a bit");
    assert_eq!(w1, w2);
    let value = |name: &str| w1.iter().find(|(n, _, _)| n == name).unwrap().1.clone();
    assert_eq!(
        value("embed.tokens"),
        value("lm_head.weight"),
        "both copies step alike"
    );

    // The summed gradient is the derivative of the loss in the shared tensor: both copies
    // moved together, by finite differences.
    let mut stages = build_stages(&cfg, 5, &[1, 1]).unwrap();
    for (i, s) in stages.iter_mut().enumerate() {
        randomize(s.params_mut(), 100 + i as u64);
    }
    // The copies must start equal, as the model builds them.
    let e = stages[0].embedding.as_ref().unwrap().tokens.value.clone();
    stages[1].head.as_mut().unwrap().lm_head.weight.value = e;
    let data = micro_data(&cfg, 0, 0);
    run_microbatch(&mut stages, 0, &data).unwrap();
    let tied = stages.iter_mut().flat_map(|s| s.tied_grads_mut()).collect();
    crate::model::sum_tied_gradients(tied).unwrap();
    let h = cfg.hidden;
    let mut mb = 1;
    for idx in [data.tokens[2] as usize * h + 3, 7 * h + 1] {
        let analytic = stages[0].embedding.as_ref().unwrap().tokens.grad.data()[idx];
        assert_eq!(
            analytic,
            stages[1].head.as_ref().unwrap().lm_head.weight.grad.data()[idx]
        );
        let x0 = stages[0].embedding.as_ref().unwrap().tokens.value.data()[idx];
        let fd = central_difference(
            |v| {
                stages[0]
                    .embedding
                    .as_mut()
                    .unwrap()
                    .tokens
                    .value
                    .data_mut()[idx] = v;
                stages[1]
                    .head
                    .as_mut()
                    .unwrap()
                    .lm_head
                    .weight
                    .value
                    .data_mut()[idx] = v;
                mb += 1;
                forward_loss(&mut stages, mb, &data).unwrap() as f64
            },
            x0,
            1e-2,
        );
        assert!(
            (fd - analytic as f64).abs() <= 3e-2 * analytic.abs() as f64 + 1e-4,
            "shared[{idx}]: fd {fd} vs {analytic}"
        );
    }
}
