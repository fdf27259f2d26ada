//! Model configuration, presets, and how blocks are split into pipeline stages.

use serde::{Deserialize, Serialize};

use crate::error::{NnError, Result};

/// Shape of a byte-level GPT. One microbatch is `microbatch_size` sequences of
/// `seq_len` tokens, i.e. `tokens_per_microbatch()` activation rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    /// Number of transformer blocks.
    pub layers: usize,
    /// Hidden size h.
    pub hidden: usize,
    /// Attention heads a (must divide h).
    pub heads: usize,
    /// Sequence length s (also the size of the learned position table).
    pub seq_len: usize,
    /// Sequences per microbatch b.
    pub microbatch_size: usize,
    /// Vocabulary size; 256 for byte-level text.
    pub vocab: usize,
    /// Share the token embedding with the LM head. Not supported (refused by
    /// [`GptConfig::validate`]): across stages it would need a gradient exchange
    /// between the first and last stage, and a silent fallback would double-count.
    pub tie_embeddings: bool,
    /// LayerNorm epsilon.
    pub ln_eps: f32,
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
            layers,
            hidden,
            heads,
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

    /// Preset by name: `micro`, `tiny`, `small`, `medium`.
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
        if self.vocab > u32::MAX as usize {
            return Err(NnError::Config(
                "vocabulary too large for u32 token ids".into(),
            ));
        }
        if self.tie_embeddings {
            return Err(NnError::Config(
                "tied embedding/LM-head weights are not supported: the embedding lives on the first \
                 stage and the LM head on the last, and summing their gradients needs a cross-stage \
                 exchange that is not implemented; set tie_embeddings = false"
                    .into(),
            ));
        }
        if !self.ln_eps.is_finite() || self.ln_eps <= 0.0 {
            return Err(NnError::Config("ln_eps must be positive".into()));
        }
        Ok(())
    }

    /// Activation rows per microbatch: `microbatch_size × seq_len`.
    pub fn tokens_per_microbatch(&self) -> usize {
        self.microbatch_size * self.seq_len
    }

    /// Total trainable parameters.
    pub fn parameter_count(&self) -> usize {
        let h = self.hidden;
        let block =
            4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h);
        self.vocab * h + self.seq_len * h + self.layers * block + 2 * h + h * self.vocab
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
    fn presets_validate_and_tied_weights_are_refused() {
        for p in ["micro", "tiny", "small", "medium"] {
            GptConfig::preset(p).unwrap().validate().unwrap();
        }
        assert!(GptConfig::preset("huge").is_err());
        let mut c = GptConfig::tiny();
        c.tie_embeddings = true;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("tied"), "{err}");
        c.tie_embeddings = false;
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
