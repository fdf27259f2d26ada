//! Fully connected layer `y = x·W + b` — where the I/W split pays off.
//!
//! F saves `x`. I computes `dx = dy·Wᵀ` and queues `(x, dy)` with this microbatch's bias
//! gradient `Σ_rows dy` (`out` floats: summed where `dy` was just produced, so that W reads
//! `dy` once, for its product, not twice). W computes
//! `dW += xᵀ·dy`, adds the bias partial and frees all three.

use super::SplitLayer;
use crate::backend::Backend;
use crate::error::{MicrobatchId, NnError, Result};
use crate::memory::{PassState, Saved};
use crate::param::{Init, Param};
use crate::tensor::Tensor;

/// A linear map with weight `[in, out]` (or, `transposed`, `[out, in]`) and optional bias
/// `[out]`.
#[derive(Debug)]
pub struct Linear {
    /// Weight `[in_features, out_features]`, or `[out_features, in_features]` if
    /// `transposed` (an LM head sharing the `[vocab, h]` embedding).
    pub weight: Param,
    /// Optional bias `[out_features]`.
    pub bias: Option<Param>,
    /// The weight is stored `[out, in]` and used transposed (`y = x·Wᵀ`).
    pub transposed: bool,
    state: PassState<Tensor, WeightGradInputs>,
}

/// What a linear's I leaves for its W.
#[derive(Debug)]
struct WeightGradInputs {
    x: Tensor,
    dy: Tensor,
    /// `Σ_rows dy` (empty without a bias): summed in I, where `dy` has just been
    /// produced, rather than in W, which would read all of `dy` a second time (measured: W
    /// 6.5% shorter, I 2% longer).
    dbias: Vec<f32>,
}

impl Saved for WeightGradInputs {
    fn saved_bytes(&self) -> usize {
        self.x.saved_bytes() + self.dy.saved_bytes() + self.dbias.saved_bytes()
    }
}

impl Linear {
    /// New layer named `name` (parameters `name.weight`, `name.bias`), weights
    /// Normal(0, std²) seeded from `seed` and the names, bias zero.
    pub fn new(
        name: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
        std: f32,
        seed: u64,
    ) -> Self {
        Linear {
            weight: Param::new(
                format!("{name}.weight"),
                &[in_features, out_features],
                Init::Normal(std),
                true,
                seed,
            ),
            bias: bias.then(|| {
                Param::new(
                    format!("{name}.bias"),
                    &[out_features],
                    Init::Constant(0.0),
                    false,
                    seed,
                )
            }),
            transposed: false,
            state: PassState::new(name),
        }
    }

    /// A bias-free layer whose weight `[out, in]` is `weight` (e.g. a copy of the token
    /// embedding for a tied LM head), used transposed.
    pub fn transposed(name: &str, weight: Param) -> Self {
        Linear {
            weight,
            bias: None,
            transposed: true,
            state: PassState::new(name),
        }
    }

    /// Input feature count.
    pub fn in_features(&self) -> usize {
        self.weight.value.shape()[usize::from(self.transposed)]
    }

    /// The weight as the `[in, out]` matrix of `y = x·W`.
    fn w(&self) -> crate::tensor::MatRef<'_> {
        let w = self.weight.value.mat();
        if self.transposed {
            w.t()
        } else {
            w
        }
    }

    /// `x·W + b` alone (what F computes; inference saves nothing).
    pub(crate) fn apply(&self, be: &dyn Backend, x: &Tensor) -> Tensor {
        // With a bias, start from the broadcast bias and let gemm accumulate onto it:
        // one pass over the output instead of a zero-fill plus a bias pass.
        match &self.bias {
            Some(b) => {
                let mut y = be.broadcast_rows(b.value.data(), x.rows());
                be.matmul(y.mat_mut(), x.mat(), self.w(), 1.0, true);
                y
            }
            None => self.apply_unbiased(be, x),
        }
    }

    /// `x·W` alone, the bias left to the caller ([`Self::bias_values`]): for an output that
    /// goes straight into a kernel that loads every element anyway (GELU, the attention
    /// core's packs), which adds the bias there — a pass over the output less than [`Self::apply`] pays.
    pub(crate) fn apply_unbiased(&self, be: &dyn Backend, x: &Tensor) -> Tensor {
        let mut y = Tensor::for_overwrite(&[x.rows(), self.out_features()]);
        be.matmul(y.mat_mut(), x.mat(), self.w(), 1.0, false);
        y
    }

    /// The output gradient I queued for `mb`'s W: a residual block reads its own gradient
    /// back from here instead of keeping a copy of what it handed to this layer.
    pub(crate) fn queued_output_grad(&self, mb: MicrobatchId) -> Result<&Tensor> {
        self.state.check_weight_grad(mb)?;
        Ok(&self.state.peek_weight_grad(mb).expect("checked above").dy)
    }

    /// The bias values (empty without a bias).
    pub(crate) fn bias_values(&self) -> &[f32] {
        self.bias.as_ref().map_or(&[], |b| b.value.data())
    }

    /// F without the bias (see [`Self::apply_unbiased`]); the same state is saved as by
    /// [`SplitLayer::forward`], so I and W are unchanged.
    pub(crate) fn forward_unbiased(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: Tensor,
    ) -> Result<Tensor> {
        self.forward_with(be, mb, x, Self::apply_unbiased)
    }

    /// F adding `x·W` onto `dst` (the bias left to the caller, see [`Self::apply_onto`]); the
    /// same state is saved as by [`SplitLayer::forward`].
    pub(crate) fn forward_onto(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: Tensor,
        dst: &mut Tensor,
    ) -> Result<()> {
        self.forward_with(be, mb, x, |l, be, x| l.apply_onto(be, x, dst))
    }

    /// `dst += x·W`, the bias left to the caller: a residual branch's last layer adds its
    /// product onto the residual stream itself (the product reads `dst` as it writes it),
    /// not into a tensor of its own that a pass then adds.
    pub(crate) fn apply_onto(&self, be: &dyn Backend, x: &Tensor, dst: &mut Tensor) {
        assert_eq!(
            dst.shape(),
            [x.rows(), self.out_features()],
            "the residual stream has the output's shape"
        );
        be.matmul(dst.mat_mut(), x.mat(), self.w(), 1.0, true);
    }

    fn forward_with<T>(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: Tensor,
        apply: impl FnOnce(&Self, &dyn Backend, &Tensor) -> T,
    ) -> Result<T> {
        if x.cols() != self.in_features() {
            return Err(NnError::BadInput(format!(
                "layer `{}` expects {} input features, got shape {:?}",
                self.state.layer(),
                self.in_features(),
                x.shape()
            )));
        }
        self.state.check_forward(mb)?;
        let y = apply(self, be, &x);
        self.state.save_forward(mb, x)?;
        Ok(y)
    }

    /// I, with the bias gradient already summed by the caller (`dbias`: the column sums of
    /// `dy`, as [`Backend::accumulate_column_sums`] sums them; empty without a bias), or
    /// summed here (`None`).
    pub(crate) fn backward_input_given(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        dy: Tensor,
        dbias: Option<Vec<f32>>,
    ) -> Result<Tensor> {
        self.backward_input_into(be, mb, dy, dbias, false)
    }

    /// I, with the input gradient's rows padded where they would alias in L1
    /// ([`Tensor::for_overwrite_padded`]): for a caller whose kernels take padded rows and
    /// whose next linear keeps the result for its weight gradient (fc2 before GELU's
    /// backward, whose output fc1's W reads).
    pub(crate) fn backward_input_padded(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        dy: Tensor,
    ) -> Result<Tensor> {
        self.backward_input_into(be, mb, dy, None, true)
    }

    fn backward_input_into(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        dy: Tensor,
        dbias: Option<Vec<f32>>,
        padded: bool,
    ) -> Result<Tensor> {
        self.state.check_input_grad(mb)?;
        if dy.cols() != self.out_features() {
            return Err(NnError::BadInput(format!(
                "layer `{}` expects an output gradient with {} features, got shape {:?}",
                self.state.layer(),
                self.out_features(),
                dy.shape()
            )));
        }
        let rows = self.state.peek_forward(mb).map_or(0, Tensor::rows);
        if dy.rows() != rows {
            return Err(NnError::BadInput(format!(
                "layer `{}`: output gradient has {} rows, the forward had {rows}",
                self.state.layer(),
                dy.rows()
            )));
        }
        let x = self.state.take_forward(mb)?;
        let mut dx = if padded {
            Tensor::for_overwrite_padded(dy.rows(), self.in_features())
        } else {
            Tensor::for_overwrite(&[dy.rows(), self.in_features()])
        };
        let biases = self.bias.as_ref().map_or(0, |_| dy.cols());
        let dbias = dbias.unwrap_or_else(|| {
            let mut dbias = vec![0.0; biases];
            if biases > 0 {
                be.accumulate_column_sums(&mut dbias, &dy);
            }
            dbias
        });
        if dbias.len() != biases {
            return Err(NnError::BadInput(format!(
                "layer `{}`: a bias gradient of {} values for {biases} biases; pass one column \
                 sum of the output gradient per bias (none without a bias)",
                self.state.layer(),
                dbias.len(),
            )));
        }
        be.matmul(dx.mat_mut(), dy.mat(), self.w().t(), 1.0, false);
        self.state
            .queue_weight_grad(mb, WeightGradInputs { x, dy, dbias });
        Ok(dx)
    }

    /// Output feature count.
    pub fn out_features(&self) -> usize {
        self.weight.value.shape()[usize::from(!self.transposed)]
    }
}

impl SplitLayer for Linear {
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, x: Tensor) -> Result<Tensor> {
        self.forward_with(be, mb, x, Self::apply)
    }

    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor> {
        self.backward_input_given(be, mb, dy, None)
    }

    fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()> {
        let WeightGradInputs { x, dy, dbias } = self.state.take_weight_grad(mb)?;
        if self.transposed {
            // dWᵀ = dyᵀ·x, `[out, in]`.
            be.matmul(self.weight.grad.mat_mut(), dy.mat().t(), x.mat(), 1.0, true);
        } else {
            be.matmul(self.weight.grad.mat_mut(), x.mat().t(), dy.mat(), 1.0, true);
        }
        if let Some(b) = &mut self.bias {
            be.add_assign(b.grad.data_mut(), &dbias);
        }
        Ok(())
    }

    fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_forward(mb)
    }

    fn check_input_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_input_grad(mb)
    }

    fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_weight_grad(mb)
    }

    fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.state.held_bytes(mb)
    }

    fn discard(&mut self, mb: MicrobatchId) {
        self.state.discard(mb);
    }

    fn params(&self) -> Vec<&Param> {
        std::iter::once(&self.weight)
            .chain(self.bias.as_ref())
            .collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        std::iter::once(&mut self.weight)
            .chain(self.bias.as_mut())
            .collect()
    }
}
