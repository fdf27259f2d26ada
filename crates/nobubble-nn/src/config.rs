//! Model configuration, presets, and how blocks are split into pipeline stages.

use serde::{Deserialize, Serialize};

use crate::error::{NnError, Result};

/// Which transformer family a model's blocks belong to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// GPT-2 style: LayerNorm, learned positions, GELU MLP, biases, one K/V per head.
    #[default]
    Gpt,
    /// Llama style: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no
    /// biases — the blocks Hugging Face's `LlamaForCausalLM` has.
    Llama,
}

impl Arch {
    /// Name as the CLI and config files spell it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Gpt => "gpt",
            Arch::Llama => "llama",
        }
    }

    /// Parses `gpt` or `llama`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "gpt" => Ok(Arch::Gpt),
            "llama" => Ok(Arch::Llama),
            other => Err(NnError::Config(format!(
                "unknown architecture `{other}` (expected gpt or llama)"
            ))),
        }
    }
}

/// Shape of a model: a GPT-2-style or Llama-style decoder (see [`Arch`]). One microbatch is
/// `microbatch_size` sequences of `seq_len` tokens, i.e. `tokens_per_microbatch()` rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    /// Block family; configs saved before Llama blocks existed are GPT.
    #[serde(default)]
    pub arch: Arch,
    /// Number of transformer blocks.
    pub layers: usize,
    /// Hidden size h.
    pub hidden: usize,
    /// Attention heads a (must divide h).
    pub heads: usize,
    /// Key/value heads of grouped-query attention (must divide `heads`); `None`: one per
    /// query head. GPT blocks always have one per head.
    #[serde(default)]
    pub kv_heads: Option<usize>,
    /// Width of the MLP's hidden layer; `None`: 4h for GPT, for Llama 8h/3 rounded up to a
    /// multiple of 32 (the SwiGLU width that keeps the parameter count of a 4h MLP).
    #[serde(default)]
    pub ffn_hidden: Option<usize>,
    /// Base θ of the rotary position angles (Llama only).
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f32,
    /// Sequence length s (also the size of GPT's learned position table).
    pub seq_len: usize,
    /// Sequences per microbatch b.
    pub microbatch_size: usize,
    /// Vocabulary size; 256 for byte-level text.
    pub vocab: usize,
    /// Share the token embedding with the LM head: the last stage holds a copy
    /// ([`TIED_ALIAS`]) of [`TIED_EMBEDDING`], and the trainers sum the two copies'
    /// gradients before every optimizer step, so both stay equal and the model is trained as
    /// with one shared tensor.
    pub tie_embeddings: bool,
    /// Epsilon of every norm (LayerNorm or RMSNorm).
    pub ln_eps: f32,
}

/// The token embedding, the tensor a tied LM head shares.
pub const TIED_EMBEDDING: &str = "embed.tokens";
/// The last stage's copy of [`TIED_EMBEDDING`] under tied embeddings (`[vocab, h]`, used
/// transposed): never saved (checkpoints hold the embedding once) and not counted twice in the
/// gradient norm.
pub const TIED_ALIAS: &str = "lm_head.weight";

fn default_rope_theta() -> f32 {
    10_000.0
}

impl GptConfig {
    fn with(
        layers: usize,
        hidden: usize,
        heads: usize,
        seq_len: usize,
        microbatch_size: usize,
    ) -> Self {
        GptConfig {
            arch: Arch::Gpt,
            layers,
            hidden,
            heads,
            kv_heads: None,
            ffn_hidden: None,
            rope_theta: default_rope_theta(),
            seq_len,
            microbatch_size,
            vocab: 256,
            tie_embeddings: false,
            ln_eps: 1e-5,
        }
    }

    /// A model small enough for unit tests (milliseconds per step).
    pub fn micro() -> Self {
        Self::with(2, 32, 2, 16, 2)
    }

    /// Trains visibly on 2 cores in a minute or two: 4 blocks, h 128, 4 heads, s 64.
    pub fn tiny() -> Self {
        Self::with(4, 128, 4, 64, 8)
    }

    /// 6 blocks, h 256, 8 heads, s 128.
    pub fn small() -> Self {
        Self::with(6, 256, 8, 128, 4)
    }

    /// 12 blocks, h 512, 8 heads, s 256 (the benchmark's block shape).
    pub fn medium() -> Self {
        Self::with(12, 512, 8, 256, 2)
    }

    /// The same shape with `arch`'s blocks: for Llama, half as many K/V heads as query heads
    /// (when the head count is even) — grouped-query attention, as Llama models have.
    pub fn with_arch(self, arch: Arch) -> Self {
        let kv_heads = match arch {
            Arch::Llama if self.heads.is_multiple_of(2) => Some(self.heads / 2),
            _ => None,
        };
        GptConfig {
            arch,
            kv_heads,
            ..self
        }
    }

    /// K/V heads (`heads` unless grouped-query attention sets fewer).
    pub fn kv_heads(&self) -> usize {
        self.kv_heads.unwrap_or(self.heads)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// Width of the MLP's hidden layer (see [`GptConfig::ffn_hidden`]).
    pub fn ffn_hidden(&self) -> usize {
        self.ffn_hidden.unwrap_or(match self.arch {
            Arch::Gpt => 4 * self.hidden,
            Arch::Llama => (8 * self.hidden).div_ceil(3).div_ceil(32) * 32,
        })
    }

    /// Preset by name: `micro`, `tiny`, `small`, `medium` (GPT blocks; see
    /// [`GptConfig::with_arch`]).
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "micro" => Ok(Self::micro()),
            "tiny" => Ok(Self::tiny()),
            "small" => Ok(Self::small()),
            "medium" => Ok(Self::medium()),
            other => Err(NnError::Config(format!(
                "unknown preset `{other}` (expected micro, tiny, small or medium)"
            ))),
        }
    }

    /// Checks every field; called by every constructor that takes a config.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("seq_len", self.seq_len),
            ("microbatch_size", self.microbatch_size),
            ("vocab", self.vocab),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(NnError::Config(format!("{name} must be positive")));
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(NnError::Config(format!(
                "hidden size {} is not divisible by {} heads",
                self.hidden, self.heads
            )));
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.heads.is_multiple_of(kv) {
            return Err(NnError::Config(format!(
                "{kv} key/value heads do not divide {} attention heads; use a divisor of it",
                self.heads
            )));
        }
        if self.arch == Arch::Gpt && kv != self.heads {
            return Err(NnError::Config(
                "grouped-query attention (kv_heads) needs Llama blocks (arch llama)".into(),
            ));
        }
        if self.ffn_hidden() == 0 {
            return Err(NnError::Config("ffn_hidden must be positive".into()));
        }
        if self.arch == Arch::Llama {
            if !self.head_dim().is_multiple_of(2) {
                return Err(NnError::Config(format!(
                    "rotary positions need an even head width; {} / {} heads is {}",
                    self.hidden,
                    self.heads,
                    self.head_dim()
                )));
            }
            if !self.rope_theta.is_finite() || self.rope_theta <= 1.0 {
                return Err(NnError::Config(format!(
                    "rope_theta must be a finite number above 1, not {}",
                    self.rope_theta
                )));
            }
        }
        if self.vocab > u32::MAX as usize {
            return Err(NnError::Config(
                "vocabulary too large for u32 token ids".into(),
            ));
        }
        if !self.ln_eps.is_finite() || self.ln_eps <= 0.0 {
            return Err(NnError::Config("ln_eps must be positive".into()));
        }
        Ok(())
    }

    /// Guards against typos that would try to allocate the machine away: at most 2³¹
    /// parameters, and neither a microbatch's `[tokens, h]` rows nor its attention
    /// probabilities (`b · a · s²`) over 4 GiB (the MLP's and the logits' wider tensors
    /// scale with these). Checked by `train` and the engine benchmark before anything is
    /// allocated; whether the machine has the memory is the runtime's check.
    pub fn check_size(&self) -> Result<()> {
        let activation = self.tokens_per_microbatch() as f64 * self.hidden as f64 * 4.0;
        let s = self.seq_len as f64;
        let scores = self.microbatch_size as f64 * self.heads as f64 * s * s * 4.0;
        let largest = activation.max(scores);
        if largest > (1u64 << 32) as f64 || self.parameter_count() > 1 << 31 {
            return Err(NnError::Config(format!(
                "this model is too large for this trainer: {} parameters, {:.1} GiB per \
                 activation tensor; reduce the hidden size, sequence length, microbatch size or layers",
                self.parameter_count(),
                largest / (1u64 << 30) as f64
            )));
        }
        Ok(())
    }

    /// Activation rows per microbatch: `microbatch_size × seq_len`.
    pub fn tokens_per_microbatch(&self) -> usize {
        self.microbatch_size * self.seq_len
    }

    /// The block's shape in the planner's FLOP model.
    pub fn block_shape(&self) -> nobubble_schedule::flops::BlockShape {
        nobubble_schedule::flops::BlockShape {
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads(),
            ffn_hidden: self.ffn_hidden(),
            gated: self.arch == Arch::Llama,
            seq_len: self.seq_len,
            microbatch_size: self.microbatch_size,
        }
    }

    /// The LM head's own parameters: none when it shares the embedding.
    fn head_params(&self) -> usize {
        if self.tie_embeddings {
            0
        } else {
            self.hidden * self.vocab
        }
    }

    /// Activation bytes one Llama block holds per microbatch after F and from I until W, as
    /// its layers store them (f32): the norms' normalized inputs and scales, the linears'
    /// inputs (and after I their output gradients), the rotated QKV and the attention
    /// probabilities, the SwiGLU input. What the runtime estimates a Llama stage with before
    /// it measures (the layer tests check it against the measured bytes).
    pub fn llama_block_bytes(&self) -> (f64, f64) {
        let (h, f) = (self.hidden as f64, self.ffn_hidden() as f64);
        let w = ((self.heads + 2 * self.kv_heads()) * self.head_dim()) as f64;
        let probs = (self.heads * self.seq_len) as f64;
        let tokens = self.tokens_per_microbatch() as f64;
        let after_f = tokens * (5.0 * h + 2.0 + w + probs + 3.0 * f);
        let after_i = tokens * (5.0 * h + w + 3.0 * f) + 2.0 * h;
        (4.0 * after_f, 4.0 * after_i)
    }

    /// Activation bytes one block holds per microbatch after F and from I until W, as its
    /// layers store them (f32). A GPT block keeps both LayerNorms' normalized inputs and
    /// scales, the four linears' inputs, Q, K and V, the attention probabilities and GELU's
    /// input; after I the linears' inputs with their output gradients, and the bias and
    /// norm-parameter gradients I computed (W adds them). Llama: [`Self::llama_block_bytes`].
    /// What the runtime checks memory with before it measures; its tests check it against
    /// the bytes the built stages hold. GELU's output (fc2's input) and its input gradient
    /// (fc1's output gradient) are stored with padded rows where they would alias in L1
    /// (`Tensor::for_overwrite_padded`).
    pub fn block_bytes(&self) -> (f64, f64) {
        if self.arch == Arch::Llama {
            return self.llama_block_bytes();
        }
        let (h, f) = (self.hidden as f64, self.ffn_hidden() as f64);
        let g = crate::tensor::padded_row_len(self.ffn_hidden()) as f64;
        let probs = (self.heads * self.seq_len) as f64;
        let tokens = self.tokens_per_microbatch() as f64;
        let after_f = tokens * (8.0 * h + f + g + probs + 2.0);
        let after_i = tokens * (8.0 * h + 2.0 * g) + 9.0 * h + f;
        (4.0 * after_f, 4.0 * after_i)
    }

    /// The embedding's activation bytes after F (the token ids) and from I until W (the
    /// ids and the output gradient its W scatters).
    pub fn embedding_bytes(&self) -> (f64, f64) {
        let tokens = self.tokens_per_microbatch() as f64;
        (4.0 * tokens, 4.0 * tokens * (self.hidden as f64 + 1.0))
    }

    /// The final norm and LM head's activation bytes: after F the norm's normalized input
    /// and scale, the head's input and the probabilities; from I until W the head's input
    /// and output gradient and the norm's parameter gradients.
    pub fn head_bytes(&self) -> (f64, f64) {
        let (h, v) = (self.hidden as f64, self.vocab as f64);
        let tokens = self.tokens_per_microbatch() as f64;
        let norm_grads = match self.arch {
            Arch::Gpt => 2.0 * h,
            Arch::Llama => h,
        };
        (
            4.0 * tokens * (v + 2.0 * h + 2.0),
            4.0 * (tokens * (v + h) + norm_grads),
        )
    }

    /// Total trainable parameters.
    pub fn parameter_count(&self) -> usize {
        self.embedding_parameter_count()
            + self.layers * self.block_parameter_count()
            + self.head_parameter_count()
    }

    /// Parameters of the token (and, for GPT, position) embedding: the first stage's.
    pub fn embedding_parameter_count(&self) -> usize {
        let h = self.hidden;
        match self.arch {
            Arch::Gpt => self.vocab * h + self.seq_len * h,
            Arch::Llama => self.vocab * h,
        }
    }

    /// Parameters of one transformer block.
    pub fn block_parameter_count(&self) -> usize {
        let (h, f) = (self.hidden, self.ffn_hidden());
        match self.arch {
            Arch::Gpt => 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h),
            Arch::Llama => {
                let qkv = h * (self.heads + 2 * self.kv_heads()) * self.head_dim();
                2 * h + qkv + h * h + h * 2 * f + f * h
            }
        }
    }

    /// Parameters of the final norm and the LM head (none for a tied head): the last stage's.
    pub fn head_parameter_count(&self) -> usize {
        let norm = match self.arch {
            Arch::Gpt => 2 * self.hidden,
            Arch::Llama => self.hidden,
        };
        norm + self.head_params()
    }

    /// Parameters the last stage holds beyond [`Self::head_parameter_count`]: a tied head's
    /// own copy of the embedding matrix (kept equal by summing the two copies' gradients),
    /// which takes memory like any parameter though it is not a parameter of its own.
    pub fn tied_copy_parameter_count(&self) -> usize {
        if self.tie_embeddings {
            self.vocab * self.hidden
        } else {
            0
        }
    }
}

/// How blocks are distributed over stages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StageLayout {
    /// As even as possible; extra blocks go to middle stages first (the first and last
    /// stages already carry the embedding and the head).
    Even,
    /// The first and last stage each get `fewer` blocks less than a middle stage, as
    /// the paper does to balance the embedding and LM head.
    LighterEdges {
        /// How many blocks fewer than a middle stage.
        fewer: usize,
    },
    /// Exactly these block counts, first stage first.
    Explicit(Vec<usize>),
}

/// Blocks per stage for `layers` blocks on `stages` stages (or chunks). Every stage
/// but the first and last must get at least one block.
pub fn block_counts(layers: usize, stages: usize, layout: &StageLayout) -> Result<Vec<usize>> {
    if stages == 0 {
        return Err(NnError::Config("at least one stage is needed".into()));
    }
    let counts = match layout {
        StageLayout::Even => spread(layers, stages),
        StageLayout::LighterEdges { fewer } => {
            if stages <= 2 {
                spread(layers, stages)
            } else {
                let mut c = spread(layers + 2 * fewer, stages);
                for edge in [0, stages - 1] {
                    if c[edge] < *fewer {
                        return Err(NnError::Config(format!(
                            "{layers} blocks on {stages} stages cannot give the edge stages {fewer} blocks fewer"
                        )));
                    }
                    c[edge] -= fewer;
                }
                c
            }
        }
        StageLayout::Explicit(c) => {
            if c.len() != stages || c.iter().sum::<usize>() != layers {
                return Err(NnError::Config(format!(
                    "explicit split {c:?} must have {stages} entries summing to {layers}"
                )));
            }
            c.clone()
        }
    };
    if stages > 2 {
        if let Some(i) = (1..stages - 1).find(|&i| counts[i] == 0) {
            return Err(NnError::Config(format!(
                "middle stage {i} would get no block ({layers} blocks on {stages} stages)"
            )));
        }
    }
    Ok(counts)
}

/// Even spread; leftovers go to middle stages, then the first, then the last.
fn spread(layers: usize, stages: usize) -> Vec<usize> {
    let mut counts = vec![layers / stages; stages];
    let order: Vec<usize> = (1..stages.saturating_sub(1))
        .chain([0, stages - 1])
        .collect();
    for &i in order.iter().take(layers % stages) {
        counts[i] += 1;
    }
    counts
}

/// Device holding chunk `chunk` of `2·devices` chunks in V placement: chunk `d` and
/// chunk `2·devices − 1 − d` live on device `d`, so the data flows down the devices
/// and back up, and the turn at the last device is local.
pub fn v_placement_device(chunk: usize, devices: usize) -> Result<usize> {
    if chunk >= 2 * devices {
        return Err(NnError::Config(format!(
            "chunk {chunk} does not exist with {devices} devices"
        )));
    }
    Ok(if chunk < devices {
        chunk
    } else {
        2 * devices - 1 - chunk
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_bad_shapes_are_refused() {
        for p in ["micro", "tiny", "small", "medium"] {
            GptConfig::preset(p).unwrap().validate().unwrap();
        }
        assert!(GptConfig::preset("huge").is_err());
        let mut c = GptConfig::tiny();
        c.tie_embeddings = true;
        c.validate().unwrap();
        assert_eq!(
            GptConfig::tiny().parameter_count() - c.parameter_count(),
            c.hidden * c.vocab
        );
        c.heads = 3;
        assert!(c.validate().is_err());
    }

    #[test]
    fn splits_cover_all_blocks() {
        assert_eq!(
            block_counts(8, 4, &StageLayout::Even).unwrap(),
            vec![2, 2, 2, 2]
        );
        assert_eq!(
            block_counts(10, 4, &StageLayout::Even).unwrap(),
            vec![2, 3, 3, 2]
        );
        assert_eq!(
            block_counts(11, 4, &StageLayout::Even).unwrap(),
            vec![3, 3, 3, 2]
        );
        assert_eq!(
            block_counts(10, 4, &StageLayout::LighterEdges { fewer: 1 }).unwrap(),
            vec![2, 3, 3, 2]
        );
        assert_eq!(
            block_counts(8, 4, &StageLayout::LighterEdges { fewer: 1 }).unwrap(),
            vec![1, 3, 3, 1]
        );
        assert_eq!(block_counts(3, 1, &StageLayout::Even).unwrap(), vec![3]);
        assert_eq!(
            block_counts(2, 4, &StageLayout::Even).unwrap(),
            vec![0, 1, 1, 0]
        );
        assert!(block_counts(1, 4, &StageLayout::Even).is_err());
        assert!(block_counts(4, 2, &StageLayout::Explicit(vec![1, 2])).is_err());
        assert_eq!(v_placement_device(0, 4).unwrap(), 0);
        assert_eq!(v_placement_device(7, 4).unwrap(), 0);
        assert_eq!(v_placement_device(4, 4).unwrap(), 3);
        assert!(v_placement_device(8, 4).is_err());
    }
}
