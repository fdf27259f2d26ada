//! # nobubble-nn: a transformer engine with split backward passes
//!
//! Zero-bubble pipeline schedules split each layer's backward into **I** (input
//! gradient, on the critical path) and **W** (weight gradient, deferrable). No Rust
//! autograd engine can do that, so this crate owns its layers, written by hand.
//! See `README.md` in this crate for the design (device seam, per-microbatch deferred
//! state, memory accounting, bit-identity contract).

#![warn(missing_docs)]

pub mod accumulate;
pub mod alloc;
pub mod backend;
pub mod bench;
pub mod config;
mod cpu;
pub mod data;
pub mod error;
pub mod generate;
pub mod hf;
mod kernels;
pub mod layers;
pub mod lending;
pub mod memory;
pub mod model;
#[cfg(test)]
mod model_tests;
pub mod optim;
pub mod param;
mod pool;
pub mod profiler;
pub mod reference;
mod sgemm;
pub mod simd;
mod small_gemm;
pub mod tensor;
#[cfg(test)]
mod testutil;

pub use backend::{Backend, CpuBackend};
pub use config::{GptConfig, StageLayout};
pub use data::Corpus;
pub use error::{MicrobatchId, NnError, Result};
pub use model::{
    add_tied_gradient, build_stages, build_stages_where, split_model, split_model_v,
    sum_tied_gradients, Stage, StageInput, StageOutput,
};
pub use optim::{AdamW, AdamWConfig, AdamWState, ParamMoments};
pub use reference::{ReferenceTrainer, TrainConfig};
pub use simd::Simd;
pub use tensor::Tensor;
