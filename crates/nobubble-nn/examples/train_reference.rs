//! Trains a model with the reference trainer and prints the loss curve.
//!
//! `cargo run --release -p nobubble-nn --example train_reference -- [preset] [steps] [microbatches] [threads]`

use nobubble_nn::{Corpus, GptConfig, ReferenceTrainer, TrainConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let preset = args.get(1).map(String::as_str).unwrap_or("tiny");
    let steps: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(200);
    let model = match preset {
        "test" => GptConfig {
            layers: 2,
            hidden: 64,
            heads: 4,
            seq_len: 32,
            microbatch_size: 4,
            ..GptConfig::micro()
        },
        p => GptConfig::preset(p)?,
    };
    let train = TrainConfig {
        microbatches: args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(2),
        threads: args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(1),
        ..TrainConfig::default()
    };
    let mut t = ReferenceTrainer::new(&model, &train, Corpus::builtin(), &[model.layers])?;
    let start = std::time::Instant::now();
    for _ in 0..steps {
        let r = t.train_step()?;
        if r.step % 10 == 0 || r.step + 1 == steps {
            println!(
                "step {:4} loss {:?} grad_norm {:.3} clip {:.3} lr {:.2e} ({:.1}s)",
                r.step,
                r.loss,
                r.grad_norm,
                r.clip_scale,
                r.lr,
                start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
