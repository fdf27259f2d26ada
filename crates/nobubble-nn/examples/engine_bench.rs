//! Runs the single-thread block benchmark and prints the table and JSON.
//!
//! `cargo run --release -p nobubble-nn --example engine_bench -- [hidden heads seq_len microbatch_size repeats]`

use nobubble_nn::bench::{engine_bench, EngineBenchConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let d = EngineBenchConfig::default();
    let cfg = EngineBenchConfig {
        hidden: a.first().copied().unwrap_or(d.hidden),
        heads: a.get(1).copied().unwrap_or(d.heads),
        seq_len: a.get(2).copied().unwrap_or(d.seq_len),
        microbatch_size: a.get(3).copied().unwrap_or(d.microbatch_size),
        repeats: a.get(4).copied().unwrap_or(d.repeats),
        ..d
    };
    let r = engine_bench(&cfg)?;
    print!("{}", r.to_table());
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}
