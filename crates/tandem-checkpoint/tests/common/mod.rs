//! The checkpoint tests' fixtures: layouts of a few values, and checkpoint files written by hand.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::collections::HashMap;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use tandem_core::ParamSpan;

/// A weight span "w" of shape `w` (with L2) and a bias span "b" of `b` values (without).
pub fn weights_and_bias(w: Vec<usize>, b: usize) -> Vec<ParamSpan> {
    vec![
        ParamSpan {
            name: "w".into(),
            shape: w,
            weight_decay: true,
        },
        ParamSpan {
            name: "b".into(),
            shape: vec![b],
            weight_decay: false,
        },
    ]
}

/// Weights of shape [2, 3] and 3 biases.
pub fn layout() -> Vec<ParamSpan> {
    weights_and_bias(vec![2, 3], 3)
}

fn size_of(dtype: Dtype) -> usize {
    match dtype {
        Dtype::F16 | Dtype::BF16 => 2,
        Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
        Dtype::F64 | Dtype::I64 => 8,
        other => panic!("no size for {other:?} here"),
    }
}

/// A checkpoint file's bytes with `metadata` as the file's and tensors "params/..." and
/// "ema/..." of the [`layout`]'s shapes, each of the dtype `dtype_of` gives its name; every
/// value is small, finite and non-zero in any of these types (bytes `0x01, 0x3c`, repeated).
pub fn file_with_metadata(
    dtype_of: impl Fn(&str) -> Dtype,
    metadata: Option<HashMap<String, String>>,
) -> Vec<u8> {
    let data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = ["params", "ema"]
        .into_iter()
        .flat_map(|kind| layout().into_iter().map(move |span| (kind, span)))
        .map(|(kind, span)| {
            let name = format!("{kind}/{}", span.name);
            let dtype = dtype_of(&name);
            let len = span.len() * size_of(dtype);
            let bytes = (0..len)
                .map(|i| if i % 2 == 0 { 0x01 } else { 0x3c })
                .collect();
            (name, dtype, span.shape, bytes)
        })
        .collect();
    let views = data.iter().map(|(name, dtype, shape, bytes)| {
        (
            name.as_str(),
            TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
        )
    });
    safetensors::serialize(views, metadata).unwrap()
}
