//! Token embedding plus (GPT) learned absolute positions — the first layer of stage 0.
//! Llama blocks rotate their queries and keys instead, so their embedding has no table
//! of positions.
//!
//! F saves the token ids. Tokens are discrete, so I has no input gradient to compute:
//! it only queues `(tokens, dy)`. W scatter-adds `dy` into both tables in row order.

use crate::backend::Backend;
use crate::error::{MicrobatchId, NnError, Result};
use crate::memory::PassState;
use crate::param::{Init, Param};
use crate::tensor::Tensor;

/// Token and position embedding tables.
#[derive(Debug)]
pub struct Embedding {
    /// Token table `[vocab, h]` (`embed.tokens`).
    pub tokens: Param,
    /// Position table `[seq_len, h]` (`embed.positions`); `None` with rotary positions.
    pub positions: Option<Param>,
    seq_len: usize,
    state: PassState<Vec<u32>, (Vec<u32>, Tensor)>,
}

impl Embedding {
    /// New embedding for `vocab` tokens, sequences of `seq_len`, width `hidden`, with a
    /// learned position table if `learned_positions`.
    pub fn new(
        vocab: usize,
        seq_len: usize,
        hidden: usize,
        learned_positions: bool,
        seed: u64,
    ) -> Self {
        Embedding {
            tokens: Param::new(
                crate::config::TIED_EMBEDDING,
                &[vocab, hidden],
                Init::Normal(super::INIT_STD),
                false,
                seed,
            ),
            positions: learned_positions.then(|| {
                Param::new(
                    "embed.positions",
                    &[seq_len, hidden],
                    Init::Normal(super::INIT_STD / 2.0),
                    false,
                    seed,
                )
            }),
            seq_len,
            state: PassState::new("embed"),
        }
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The embedded rows of `tokens` (inference: nothing saved; ids already checked).
    pub(crate) fn apply(&self, be: &dyn Backend, tokens: &[u32]) -> Tensor {
        let pos = self.positions.as_ref().map(|p| &p.value);
        be.embedding_forward(&self.tokens.value, pos, tokens, self.seq_len)
    }

    /// The embedding of one `token` (< vocab) at position `pos` (< seq_len), `[1, h]`: the
    /// row [`Self::apply`] gives it there, for incremental decoding.
    pub(crate) fn apply_at(&self, token: u32, pos: usize) -> Tensor {
        let h = self.tokens.value.cols();
        let te = &self.tokens.value.data()[token as usize * h..][..h];
        let row = match &self.positions {
            Some(p) => {
                let pe = &p.value.data()[pos * h..][..h];
                te.iter().zip(pe).map(|(t, p)| t + p).collect()
            }
            None => te.to_vec(),
        };
        Tensor::from_vec(&[1, h], row).expect("one row of h values")
    }

    /// F: looks up `tokens` (a whole number of sequences, each id < vocab).
    pub fn forward(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        tokens: &[u32],
    ) -> Result<Tensor> {
        let vocab = self.tokens.value.rows();
        let s = self.seq_len();
        if tokens.is_empty() || !tokens.len().is_multiple_of(s) {
            return Err(NnError::BadInput(format!(
                "{} tokens are not a positive whole number of sequences of length {s}",
                tokens.len()
            )));
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(NnError::BadInput(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        self.state.check_forward(mb)?;
        let x = self.apply(be, tokens);
        self.state.save_forward(mb, tokens.to_vec())?;
        Ok(x)
    }

    /// I: nothing flows further back; keeps `dy` for W.
    pub fn backward_input(&mut self, mb: MicrobatchId, dy: Tensor) -> Result<()> {
        self.state.check_input_grad(mb)?;
        let tokens = self.state.take_forward(mb)?;
        if dy.rows() != tokens.len() || dy.cols() != self.tokens.value.cols() {
            let err = NnError::BadInput(format!(
                "embedding output gradient has shape {:?}",
                dy.shape()
            ));
            self.state.save_forward(mb, tokens)?;
            return Err(err);
        }
        self.state.queue_weight_grad(mb, (tokens, dy));
        Ok(())
    }

    /// W: scatter-adds the queued gradient into the tables.
    pub fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()> {
        let (tokens, dy) = self.state.take_weight_grad(mb)?;
        let s = self.seq_len();
        be.embedding_backward(
            &mut self.tokens.grad,
            self.positions.as_mut().map(|p| &mut p.grad),
            &tokens,
            &dy,
            s,
        );
        Ok(())
    }

    /// Errors if F may not run for `mb` now.
    pub fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_forward(mb)
    }

    /// Errors if I may not run for `mb` now.
    pub fn check_input_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_input_grad(mb)
    }

    /// Errors if W may not run for `mb` now.
    pub fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_weight_grad(mb)
    }

    /// Activation bytes held for `mb`.
    pub fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.state.held_bytes(mb)
    }

    /// Forgets everything held for `mb`.
    pub fn discard(&mut self, mb: MicrobatchId) {
        self.state.discard(mb);
    }

    /// Parameters: token table, position table (if any).
    pub fn params(&self) -> Vec<&Param> {
        std::iter::once(&self.tokens)
            .chain(self.positions.as_ref())
            .collect()
    }

    /// Mutable parameters, same order.
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        std::iter::once(&mut self.tokens)
            .chain(self.positions.as_mut())
            .collect()
    }
}
