//! Helpers shared by the runtime's integration tests.
#![allow(dead_code)] // each test file uses a different subset

use nobubble_nn::Stage;

/// Every parameter of `stages` as (name, bit patterns), in stage order: what bit-identity
/// tests compare.
pub fn weight_bits(stages: &[Stage]) -> Vec<(String, Vec<u32>)> {
    stages
        .iter()
        .flat_map(|s| {
            s.params().into_iter().map(|p| {
                (
                    p.name.clone(),
                    p.value.data().iter().map(|v| v.to_bits()).collect(),
                )
            })
        })
        .collect()
}
