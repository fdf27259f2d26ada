//! Forward-only inference and byte sampling.
//!
//! Training's forward saves activations per microbatch for I and W; sampling wants none
//! of that. These functions read the stages' weights and run each layer's `apply`, the
//! very code its training forward runs (so [`forward_logits`] gives the logits training
//! computes, bit for bit, for the same backend), but they take `&Stage`: nothing is
//! saved, no gradient or pass state is touched, and the result is a pure function of
//! the weights and the input.
//!
//! Generation decodes incrementally ([`Decoder`]): each attention layer keeps the keys and
//! values of the positions so far, so a new token costs one row through the model rather
//! than the whole window. Its logits equal the full window's up to the rounding of shorter
//! sums (tested against [`next_token_logits`]); once the context outgrows `seq_len` the
//! window slides, every position moves, and each token runs the whole window again.

use crate::backend::{on_backend, Backend};
use crate::error::{NnError, Result};
use crate::layers::{Embedding, KvRows, LmHead};
use crate::model::Stage;
use crate::param::SplitMix64;
use crate::tensor::Tensor;

/// Logits `[tokens.len(), vocab]` of the whole model held by `stages` (any split, in
/// order: first stage first, last stage last) for `tokens`, a whole number of sequences
/// of the model's `seq_len`. Row `r` predicts the token after `tokens[r]`.
pub fn forward_logits(stages: &[Stage], be: &dyn Backend, tokens: &[u32]) -> Result<Tensor> {
    let (embedding, head) = ends(stages)?;
    let config = stages[0].config();
    let s = config.seq_len;
    if tokens.is_empty() || !tokens.len().is_multiple_of(s) {
        return Err(NnError::BadInput(format!(
            "{} tokens are not a positive whole number of sequences of length {s}",
            tokens.len()
        )));
    }
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= config.vocab) {
        return Err(NnError::BadInput(format!(
            "token id {bad} is outside the vocabulary of {}",
            config.vocab
        )));
    }
    // On the backend's own threads, as training's passes run (else a multi-threaded
    // backend's parallel work would go to rayon's global pool).
    on_backend(be, || {
        let mut x = embedding.apply(be, tokens);
        for st in stages {
            for b in &st.blocks {
                x = b.apply(be, x);
            }
        }
        Ok(head.logits(be, &x))
    })
}

/// The whole model's embedding and LM head: `stages` must run from the first stage to the
/// last.
fn ends(stages: &[Stage]) -> Result<(&Embedding, &LmHead)> {
    let (first, last) = match (stages.first(), stages.last()) {
        (Some(f), Some(l)) => (f, l),
        _ => return Err(NnError::Config("no stages to run".into())),
    };
    let embedding = first.embedding.as_ref().ok_or_else(|| {
        NnError::Config("inference needs the stages from the first one on".into())
    })?;
    let head = last.head.as_ref().ok_or_else(|| {
        NnError::Config("inference needs the stages up to the last one (the LM head)".into())
    })?;
    Ok((embedding, head))
}

/// Incremental decoding of one sequence from position 0: feed tokens one at a time and get
/// the logits for the token after each, while every attention layer keeps the keys and
/// values of the positions so far (a KV cache).
pub struct Decoder<'a> {
    stages: &'a [Stage],
    be: &'a dyn Backend,
    embedding: &'a Embedding,
    head: &'a LmHead,
    caches: Vec<KvRows>,
    len: usize,
}

impl<'a> Decoder<'a> {
    /// An empty sequence over the whole model held by `stages` (any split, in order).
    pub fn new(stages: &'a [Stage], be: &'a dyn Backend) -> Result<Self> {
        let (embedding, head) = ends(stages)?;
        let layers = stages.iter().map(|st| st.blocks.len()).sum();
        Ok(Decoder {
            stages,
            be,
            embedding,
            head,
            caches: vec![KvRows::default(); layers],
            len: 0,
        })
    }

    /// Positions fed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token was fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the sequence holds `seq_len` tokens, all the positions the model has.
    pub fn is_full(&self) -> bool {
        self.len >= self.stages[0].config().seq_len
    }

    /// Feeds `token` at the next position and returns the logits for the token after it.
    /// Errors on an id outside the vocabulary or when the sequence is full.
    pub fn push(&mut self, token: u32) -> Result<Vec<f32>> {
        let config = self.stages[0].config();
        if token as usize >= config.vocab {
            return Err(NnError::BadInput(format!(
                "token id {token} is outside the vocabulary of {}",
                config.vocab
            )));
        }
        if self.is_full() {
            return Err(NnError::BadInput(format!(
                "the sequence already holds seq_len = {} tokens",
                config.seq_len
            )));
        }
        let (pos, be) = (self.len, self.be);
        let Decoder {
            stages,
            embedding,
            head,
            caches,
            ..
        } = self;
        let logits = on_backend(be, || {
            let mut x = embedding.apply_at(token, pos);
            let blocks = stages.iter().flat_map(|st| &st.blocks);
            for (b, cache) in blocks.zip(caches.iter_mut()) {
                x = b.decode(be, x, pos, cache);
            }
            head.logits(be, &x).into_vec()
        });
        self.len += 1;
        Ok(logits)
    }
}

/// Logits for the byte following `context`. Only the last `seq_len` tokens are used (the
/// position table has `seq_len` rows); a shorter context is padded on the right with
/// token 0, which causal attention keeps from influencing the row we read. Errors on an
/// empty context.
pub fn next_token_logits(stages: &[Stage], be: &dyn Backend, context: &[u32]) -> Result<Vec<f32>> {
    let s = stages
        .first()
        .map(|st| st.config().seq_len)
        .ok_or_else(|| NnError::Config("no stages to run".into()))?;
    if context.is_empty() {
        return Err(NnError::BadInput(
            "sampling needs a non-empty prompt".into(),
        ));
    }
    let window = &context[context.len().saturating_sub(s)..];
    let mut tokens = window.to_vec();
    tokens.resize(s, 0);
    let logits = forward_logits(stages, be, &tokens)?;
    let vocab = logits.cols();
    let row = window.len() - 1;
    Ok(logits.data()[row * vocab..(row + 1) * vocab].to_vec())
}

/// How to pick the next token from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0 always picks the most likely token (greedy).
    pub temperature: f32,
    /// Draw only among the `top_k` most likely tokens (0: no limit).
    pub top_k: usize,
    /// Draw only among the most likely tokens whose probabilities (after the temperature
    /// and `top_k`) reach `top_p` together — nucleus sampling (1: no limit).
    pub top_p: f32,
}

impl Sampling {
    /// A plain draw from `softmax(logits / temperature)`.
    pub fn with_temperature(temperature: f32) -> Self {
        Sampling {
            temperature,
            top_k: 0,
            top_p: 1.0,
        }
    }

    /// Errors on a negative or non-finite temperature or a `top_p` outside (0, 1].
    pub fn check(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(NnError::BadInput(format!(
                "temperature must be 0 (greedy) or positive, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(NnError::BadInput(format!(
                "top-p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// Picks a token from `logits`: the arg-max (first one on ties) for temperature 0, otherwise
/// a draw from `softmax(logits / temperature)` restricted by `top_k` and `top_p`, using one
/// value of `rng`. Errors on bad settings ([`Sampling::check`]) or non-finite logits.
pub fn sample_token(logits: &[f32], how: &Sampling, rng: &mut SplitMix64) -> Result<u32> {
    how.check()?;
    if logits.is_empty() || logits.iter().any(|l| !l.is_finite()) {
        return Err(NnError::BadInput(
            "the model produced non-finite logits (is the checkpoint damaged?)".into(),
        ));
    }
    // Most likely first; ties in token order, so the choice is a function of the logits.
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if how.temperature == 0.0 {
        return Ok(order[0] as u32);
    }
    if how.top_k > 0 {
        order.truncate(how.top_k);
    }
    let t = how.temperature as f64;
    let max = logits[order[0]] as f64;
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] as f64 - max) / t).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    // The nucleus: the shortest most-likely prefix holding top_p of the probability.
    let mut kept = weights.len();
    if how.top_p < 1.0 {
        let mut mass = 0.0;
        for (n, w) in weights.iter().enumerate() {
            mass += w / total;
            if mass >= how.top_p as f64 {
                kept = n + 1;
                break;
            }
        }
    }
    let total: f64 = weights[..kept].iter().sum();
    let mut u = rng.next_unit() * total;
    for (&i, w) in order.iter().zip(&weights[..kept]) {
        u -= w;
        if u <= 0.0 {
            return Ok(i as u32);
        }
    }
    Ok(order[kept - 1] as u32)
}

/// Appends `count` sampled tokens to `prompt` and returns only the new ones.
/// Deterministic: the same weights, prompt, sampling settings and `seed` give the same bytes.
pub fn generate(
    stages: &[Stage],
    be: &dyn Backend,
    prompt: &[u32],
    count: usize,
    how: &Sampling,
    seed: u64,
) -> Result<Vec<u32>> {
    generate_with(stages, be, prompt, count, how, seed, &mut |_| Ok(()))
}

/// [`generate`], handing each token to `on_token` as soon as it is sampled (to stream it);
/// an error from `on_token` stops the generation.
pub fn generate_with(
    stages: &[Stage],
    be: &dyn Backend,
    prompt: &[u32],
    count: usize,
    how: &Sampling,
    seed: u64,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<Vec<u32>> {
    let mut rng = SplitMix64::new(seed);
    let mut context = prompt.to_vec();
    // Not `count` up front: a huge count is a long run (stopped by the caller), not an
    // allocation that aborts.
    let mut out = Vec::with_capacity(count.min(1 << 16));
    if count == 0 {
        return Ok(out);
    }
    // While the context fits the model's positions, decode incrementally; after, the window
    // slides and each token needs the whole window (`next_token_logits`).
    let fits = prompt.len() <= stages.first().map_or(0, |st| st.config().seq_len);
    let mut decoder = if fits {
        Some(Decoder::new(stages, be)?)
    } else {
        None
    };
    let mut cached = None;
    if let Some(d) = &mut decoder {
        for &t in prompt {
            cached = Some(d.push(t)?);
        }
    }
    for _ in 0..count {
        let logits = match cached.take() {
            Some(l) => l,
            None => next_token_logits(stages, be, &context)?,
        };
        let t = sample_token(&logits, how, &mut rng)?;
        context.push(t);
        out.push(t);
        on_token(t)?;
        match &mut decoder {
            Some(d) if out.len() < count && !d.is_full() => cached = Some(d.push(t)?),
            _ => decoder = None,
        }
    }
    Ok(out)
}
