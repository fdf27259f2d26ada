//! `nobubble sample`: load a checkpoint written by `nobubble train --save` and continue a
//! prompt byte by byte.

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use nobubble_nn::data::Codec;
use nobubble_nn::generate::{generate_with, Sampling};
use nobubble_nn::CpuBackend;
use std::io::IsTerminal;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `sample`.
#[derive(Args, Debug)]
pub struct SampleArgs {
    /// Checkpoint directory written by `nobubble train --save DIR`, or a Hugging Face model
    /// directory (`config.json` + `model.safetensors`).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Text to continue; only its last seq-len tokens are the model's context.
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate (bytes, or the model's tokenizer's).
    #[arg(long, default_value_t = 200)]
    pub tokens: usize,
    /// Sampling temperature; 0 picks the most likely byte every time (greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Sample only among the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: only among the most likely tokens whose probabilities reach P
    /// together (1 = all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Context window for a Hugging Face model directory [default: its
    /// max_position_embeddings, at most 1024].
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Seed of the sampler: the same checkpoint, prompt, sampling settings and seed give the
    /// same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs `sample`.
pub fn run(a: &SampleArgs) -> Result<(), String> {
    let how = sampling(a)?;
    let longest = |codec: &nobubble_nn::data::Codec| -> Result<usize, String> {
        let prompt = codec.encode(&a.prompt).map_err(|e| e.message())?;
        Ok(prompt.len().saturating_add(a.tokens))
    };
    let model = crate::model_source::open(&a.checkpoint, a.seq_len, longest)?;
    let stage = model.stage;
    let origin = model.origin;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let m = stage.config();
    eprintln!(
        "nobubble sample: {origin} ({} {} layers, h {}, context {} tokens, {}), temperature {}, top-k {}, top-p {}, seed {}",
        m.arch.name(),
        m.layers,
        m.hidden,
        model.context,
        if model.codec.is_bytes() { "bytes" } else { "BPE tokenizer" },
        a.temperature,
        a.top_k,
        a.top_p,
        a.seed
    );
    let prompt = model.codec.encode(&a.prompt).map_err(|e| e.message())?;
    check_prompt(&prompt, stage.config().vocab)?;
    let be = CpuBackend::with_threads(threads);
    let bar = progress_bar(a.tokens);
    let mut stdout = std::io::stdout().lock();
    let write_failed = |e: std::io::Error| format!("cannot write the sample: {e}");
    stdout
        .write_all(a.prompt.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(write_failed)?;
    let mut io_error = None;
    let mut pending = Vec::new();
    // BPE: the prompt's and the new ids decoded together (a decoder may treat the first token
    // differently), printed from where the prompt's text ends.
    let mut generated = prompt.clone();
    let mut shown = if model.codec.is_bytes() {
        0
    } else {
        model.codec.decode(&prompt).map_err(|e| e.message())?.len()
    };
    let streamed = generate_with(
        std::slice::from_ref(&stage),
        &be,
        &prompt,
        a.tokens,
        &how,
        a.seed,
        &mut |t| {
            bar.inc(1);
            let text = if model.codec.is_bytes() {
                if t < 256 {
                    pending.push(t as u8);
                }
                take_decoded(&mut pending, false)
            } else {
                bpe_text(&model.codec, &mut generated, &mut shown, t)?
            };
            stdout
                .write_all(text.as_bytes())
                .and_then(|_| stdout.flush())
                .map_err(|e| {
                    let msg = write_failed(e);
                    io_error = Some(msg.clone());
                    nobubble_nn::NnError::Config(msg)
                })
        },
    );
    bar.finish_and_clear();
    if let Some(e) = io_error {
        return Err(e);
    }
    streamed.map_err(|e| e.to_string())?;
    let rest = if model.codec.is_bytes() {
        take_decoded(&mut pending, true)
    } else {
        let text = model.codec.decode(&generated).map_err(|e| e.message())?;
        text.get(shown..).unwrap_or("").to_string()
    };
    writeln!(stdout, "{rest}")
        .and_then(|_| stdout.flush())
        .map_err(write_failed)
}

/// The sampling settings, checked.
fn sampling(a: &SampleArgs) -> Result<Sampling, String> {
    if a.prompt.is_empty() {
        return Err(
            "--prompt must not be empty: the model needs at least one byte of context".into(),
        );
    }
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        return Err(format!(
            "--temperature must be 0 (greedy) or positive, got {}",
            a.temperature
        ));
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        return Err(format!("--top-p must be in (0, 1], got {}", a.top_p));
    }
    Ok(Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
    })
}

/// Refuses a prompt of no tokens, or with an id the model has no embedding for.
fn check_prompt(prompt: &[u32], vocab: usize) -> Result<(), String> {
    if prompt.is_empty() {
        return Err("--prompt encodes to no tokens".into());
    }
    if let Some(t) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(format!(
            "--prompt holds id {t}, outside the model's vocabulary of {vocab} (is this the \
             model's tokenizer?)"
        ));
    }
    Ok(())
}

/// The bytes are streamed as they come: a progress bar on stderr only when stdout goes
/// elsewhere (a file, a pipe) and stderr is a terminal.
fn progress_bar(tokens: usize) -> ProgressBar {
    if !std::io::stderr().is_terminal() || std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(tokens as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} sampling [{bar:28}] {pos}/{len} bytes · ETA {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

/// The text a BPE token adds: the prompt and all generated ids decoded again, less what was
/// shown, held back while it ends in an incomplete character (U+FFFD until its last byte
/// comes; what is still held at the end is printed then).
fn bpe_text(
    codec: &Codec,
    generated: &mut Vec<u32>,
    shown: &mut usize,
    t: u32,
) -> nobubble_nn::Result<String> {
    generated.push(t);
    let text = codec.decode(generated)?;
    if text.ends_with(char::REPLACEMENT_CHARACTER) || !text.is_char_boundary(*shown) {
        return Ok(String::new());
    }
    let new = text[*shown..].to_string();
    *shown = text.len();
    Ok(new)
}

/// Takes what of `pending` decodes as UTF-8 now: complete characters, and U+FFFD for each
/// invalid sequence, exactly as `String::from_utf8_lossy` would for the whole text; an
/// incomplete character at the end waits for its next bytes (unless `end`).
fn take_decoded(pending: &mut Vec<u8>, end: bool) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(pending) {
            Ok(text) => {
                out.push_str(text);
                pending.clear();
                return out;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&pending[..valid]).expect("valid prefix"));
                match e.error_len() {
                    Some(bad) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        pending.drain(..valid + bad);
                    }
                    None if end => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        pending.clear();
                        return out;
                    }
                    None => {
                        pending.drain(..valid);
                        return out;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::take_decoded;

    #[test]
    fn streaming_decoding_equals_lossy_decoding_of_the_whole() {
        let mut seed = 7u64;
        for _ in 0..500 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (seed >> 50) as usize % 40;
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Mostly UTF-8 lead and continuation bytes, to make partial characters.
                    [
                        b'a', 0xc3, 0xa9, 0xe2, 0x82, 0xac, 0xf0, 0x9f, 0x98, 0x80, 0xff,
                    ][(seed >> 40) as usize % 11]
                })
                .collect();
            let mut pending = Vec::new();
            let mut streamed = String::new();
            for b in &bytes {
                pending.push(*b);
                streamed.push_str(&take_decoded(&mut pending, false));
            }
            streamed.push_str(&take_decoded(&mut pending, true));
            assert_eq!(streamed, String::from_utf8_lossy(&bytes), "{bytes:x?}");
        }
    }
}
