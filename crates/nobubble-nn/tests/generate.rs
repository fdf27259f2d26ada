//! The inference path: its logits are training's, it leaves no state behind, sampling is
//! deterministic per seed, and a briefly trained model continues a repetition.

use nobubble_nn::generate::{forward_logits, generate, next_token_logits, sample_token, Sampling};
use nobubble_nn::param::SplitMix64;
use nobubble_nn::reference::forward_loss;
use nobubble_nn::{build_stages, Corpus, CpuBackend, GptConfig, ReferenceTrainer, TrainConfig};

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

/// Mean cross-entropy in f64, written independently of the engine's kernel.
fn cross_entropy(logits: &[f32], vocab: usize, targets: &[u32]) -> f64 {
    let mut total = 0.0;
    for (r, &t) in targets.iter().enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
        let lse = max
            + row
                .iter()
                .map(|&l| (l as f64 - max).exp())
                .sum::<f64>()
                .ln();
        total += lse - row[t as usize] as f64;
    }
    total / targets.len() as f64
}

#[test]
fn inference_logits_give_the_training_loss_and_leave_no_state() {
    let model = GptConfig {
        layers: 3,
        ..GptConfig::micro()
    };
    let train = TrainConfig {
        microbatches: 2,
        ..TrainConfig::default()
    };
    let corpus = Corpus::builtin().prefix(50_000).unwrap();
    let mut r = ReferenceTrainer::new(&model, &train, corpus, &[1, 2]).unwrap();
    for _ in 0..3 {
        r.train_step().unwrap();
    }
    let data = r.microbatch(99, 0).unwrap();
    let be = CpuBackend::single_thread();
    let logits = forward_logits(r.stages(), &be, &data.tokens).unwrap();
    assert_eq!(logits.shape(), &[data.tokens.len(), 256]);
    for st in r.stages() {
        assert!(st.pending_input_grads().is_empty() && st.pending_weight_grads().is_empty());
        assert_eq!(st.held_bytes(0), 0, "inference saved activations");
    }
    // On two threads (its own pool, as training's passes) the logits are the same bits.
    let two = forward_logits(r.stages(), &CpuBackend::with_threads(2), &data.tokens).unwrap();
    assert_eq!(two.data(), logits.data());
    let ours = cross_entropy(logits.data(), 256, &data.targets);
    let training = forward_loss(r.stages_mut(), 0, &data).unwrap() as f64;
    assert!(
        (ours - training).abs() < 1e-5,
        "inference CE {ours} vs training loss {training}"
    );
    // Context handling: a long prompt uses its last seq_len bytes.
    let long: Vec<u32> = (0..40).map(|i| 97 + (i % 7)).collect();
    let a = next_token_logits(r.stages(), &be, &long).unwrap();
    let b = next_token_logits(r.stages(), &be, &long[40 - model.seq_len..]).unwrap();
    assert_eq!(a, b);
    let err = next_token_logits(r.stages(), &be, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("non-empty prompt"), "{err}");
}

/// How often each token is drawn from `logits` under `how` in `n` draws (seed `seed`).
fn frequencies(logits: &[f32], how: &Sampling, seed: u64, n: usize) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[sample_token(logits, how, &mut rng).unwrap() as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

#[test]
fn sampling_is_deterministic_per_seed() {
    let model = GptConfig::micro();
    let stages = build_stages(&model, 3, &[2]).unwrap();
    let be = CpuBackend::single_thread();
    let prompt = bytes("In the");
    let draw = |stages: &[nobubble_nn::Stage], seed: u64| {
        generate(
            stages,
            &be,
            &prompt,
            24,
            &Sampling::with_temperature(1.0),
            seed,
        )
        .unwrap()
    };
    let (a, b, c) = (draw(&stages, 7), draw(&stages, 7), draw(&stages, 8));
    assert_eq!(a, b, "same seed, same bytes");
    assert_ne!(
        a, c,
        "another seed draws other bytes from an untrained model"
    );
    // The split does not matter.
    let split = build_stages(&model, 3, &[1, 1]).unwrap();
    assert_eq!(a, draw(&split, 7));
    // Temperature draws follow the softmax: logits (0, ln 3) give P(1) = 3/4.
    let ones = frequencies(&[0.0, 3f32.ln()], &Sampling::with_temperature(1.0), 1, 4000)[1];
    assert!((ones - 0.75).abs() < 0.03, "{ones}");
    let mut rng = SplitMix64::new(1);
    assert_eq!(
        sample_token(&[0.0, 2.0, 2.0], &Sampling::with_temperature(0.0), &mut rng).unwrap(),
        1
    );
    let err = sample_token(&[0.0], &Sampling::with_temperature(-1.0), &mut rng)
        .unwrap_err()
        .to_string();
    assert!(err.contains("temperature"), "{err}");
}

#[test]
fn top_k_and_top_p_keep_only_the_most_likely_tokens_in_proportion() {
    // Probabilities 1/10, 2/10, 3/10, 4/10.
    let logits: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|p| p.ln()).collect();
    let plain = Sampling::with_temperature(1.0);
    for (how, want) in [
        (
            Sampling { top_k: 2, ..plain },
            [0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0],
        ),
        // 0.4 + 0.3 reaches 0.65: the same two.
        (
            Sampling {
                top_p: 0.65,
                ..plain
            },
            [0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0],
        ),
        (
            Sampling {
                top_p: 0.35,
                ..plain
            },
            [0.0, 0.0, 0.0, 1.0],
        ),
        (
            Sampling {
                top_k: 3,
                top_p: 0.99,
                ..plain
            },
            [0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0],
        ),
        (plain, [0.1, 0.2, 0.3, 0.4]),
    ] {
        let got = frequencies(&logits, &how, 5, 7000);
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 0.025, "{how:?}: {got:?} vs {want:?}");
        }
    }
    let mut rng = SplitMix64::new(1);
    let bad = Sampling {
        top_p: 0.0,
        ..plain
    };
    let err = sample_token(&logits, &bad, &mut rng)
        .unwrap_err()
        .to_string();
    assert!(err.contains("top-p"), "{err}");
}

#[test]
fn greedy_continues_a_learned_repetition() {
    let model = GptConfig::micro();
    let train = TrainConfig {
        microbatches: 2,
        warmup_steps: 10,
        ..TrainConfig::default()
    };
    let corpus = Corpus::from_bytes("abc".repeat(500).into_bytes()).unwrap();
    let mut r = ReferenceTrainer::new(&model, &train, corpus, &[2]).unwrap();
    let mut last = f32::NAN;
    for _ in 0..150 {
        last = r.train_step().unwrap().loss;
    }
    assert!(
        last < 0.1,
        "training on abcabc… should reach a low loss, got {last}"
    );
    let be = CpuBackend::single_thread();
    let out = generate(
        r.stages(),
        &be,
        &bytes("abcab"),
        7,
        &Sampling::with_temperature(0.0),
        0,
    )
    .unwrap();
    let text = String::from_utf8(out.iter().map(|&t| t as u8).collect()).unwrap();
    assert!(
        text.starts_with("cabc"),
        "greedy continuation of `abcab` was `{text}`"
    );
}

/// The KV cache's logits are the full window's, position by position, for both block
/// families (GQA and rotary positions on Llama), and generation past the window slides on.
#[test]
fn incremental_decoding_gives_the_full_windows_logits() {
    use nobubble_nn::config::Arch;
    use nobubble_nn::generate::Decoder;
    for arch in [Arch::Gpt, Arch::Llama] {
        let model = GptConfig {
            layers: 3,
            heads: 4,
            ..GptConfig::micro()
        }
        .with_arch(arch);
        let stages = build_stages(&model, 11, &[2, 1]).unwrap();
        let be = CpuBackend::single_thread();
        let text = bytes("And God said, Let there be light");
        let mut decoder = Decoder::new(&stages, &be).unwrap();
        for (n, &t) in text.iter().take(model.seq_len).enumerate() {
            let cached = decoder.push(t).unwrap();
            let full = next_token_logits(&stages, &be, &text[..=n]).unwrap();
            let worst = cached
                .iter()
                .zip(&full)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst < 1e-5,
                "{arch:?} position {n}: logits differ by {worst}"
            );
        }
        assert!(decoder.is_full());
        let err = decoder.push(1).unwrap_err().to_string();
        assert!(err.contains("seq_len"), "{err}");
        // Greedy generation across the end of the window: the cached steps and the sliding
        // ones pick what the full window picks.
        let greedy = Sampling::with_temperature(0.0);
        let prompt = &text[..5];
        let got = generate(&stages, &be, prompt, 2 * model.seq_len, &greedy, 0).unwrap();
        let mut context = prompt.to_vec();
        for &t in &got {
            let logits = next_token_logits(&stages, &be, &context).unwrap();
            let mut rng = SplitMix64::new(0);
            assert_eq!(
                t,
                sample_token(&logits, &greedy, &mut rng).unwrap(),
                "{arch:?}"
            );
            context.push(t);
        }
    }
}
