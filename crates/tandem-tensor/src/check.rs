//! The operand checks of every [`Backend`](crate::Backend) operation, in one place: each
//! backend calls the function of the operation before doing anything, so that every backend
//! refuses the same inputs with the same [`ShapeError`], checked in the same order.
//!
//! The checks see operands as lengths (and offsets), never as memory, so that a device backend
//! can run them on the host. The one check that needs the values of a device operand, labels
//! within `0..classes`, is [`labels`] on the host and the device's own count on a device,
//! which reports the first bad label through [`bad_label`], the error [`labels`] returns.
//!
//! ```
//! use tandem_tensor::check::{self, Operand};
//!
//! // column_sum over 0 columns is refused, on every backend.
//! let err = check::column_sum(0, 4, 0, Operand::whole(0)).unwrap_err();
//! assert_eq!((err.op, err.operand), ("column_sum", "cols"));
//! ```

use crate::{Gemm, ShapeError};

/// Where an operation reads or writes in a buffer: the buffer's length and the offset of the
/// operation's span in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Values in the buffer.
    pub len: usize,
    /// Where the operation's span starts.
    pub offset: usize,
}

impl Operand {
    /// A span from `offset` on in a buffer of `len` values.
    pub fn at(len: usize, offset: usize) -> Operand {
        Operand { len, offset }
    }

    /// A span from the start of a buffer of `len` values.
    pub fn whole(len: usize) -> Operand {
        Operand { len, offset: 0 }
    }
}

/// `Ok` when `operand` holds `needed` values from its offset on.
fn span(
    op: &'static str,
    name: &'static str,
    operand: Operand,
    needed: usize,
) -> Result<(), ShapeError> {
    ShapeError::check(op, name, operand.offset.saturating_add(needed), operand.len)
}

/// `Ok` when a dimension is at least 1.
fn positive(op: &'static str, name: &'static str, value: usize) -> Result<(), ShapeError> {
    ShapeError::check(op, name, 1, value)
}

/// [`Backend::upload`](crate::Backend::upload): `src_len` values into `dst`.
pub fn upload(src_len: usize, dst: Operand) -> Result<(), ShapeError> {
    span("upload", "dst", dst, src_len)
}

/// [`Backend::download`](crate::Backend::download): `dst_len` values out of `src`.
pub fn download(src: Operand, dst_len: usize) -> Result<(), ShapeError> {
    span("download", "src", src, dst_len)
}

/// [`Backend::unscale`](crate::Backend::unscale): `len` values of `x`.
pub fn unscale(x: Operand, len: usize) -> Result<(), ShapeError> {
    span("unscale", "x", x, len)
}

/// [`Backend::gather`](crate::Backend::gather): `indices` into a data set of `examples`
/// examples of `features` values each, into buffers of `x` and `labels` values.
pub fn gather(
    examples: usize,
    features: usize,
    indices: &[u32],
    x: usize,
    labels: usize,
) -> Result<(), ShapeError> {
    let op = "gather";
    let rows = indices.len();
    span(op, "x", Operand::whole(x), rows.saturating_mul(features))?;
    span(op, "labels", Operand::whole(labels), rows)?;
    match indices.iter().find(|&&i| i as usize >= examples) {
        Some(&bad) => Err(ShapeError {
            op,
            operand: "examples",
            needed: bad as usize + 1,
            available: examples,
        }),
        None => Ok(()),
    }
}

/// [`Backend::gather_matmul_bias`](crate::Backend::gather_matmul_bias)'s product against its
/// batch of `rows` examples of `features` values: `spec.m` the rows, `spec.k` the features,
/// op(A) (the batch) not transposed. (The gather and the product check the rest.)
pub fn gather_matmul(rows: usize, features: usize, spec: Gemm) -> Result<(), ShapeError> {
    let op = "gather_matmul_bias";
    ShapeError::check_exact(op, "rows of the product", rows, spec.m)?;
    ShapeError::check_exact(op, "features of the product", features, spec.k)?;
    let transposed = usize::from(spec.a_transposed);
    ShapeError::check_exact(op, "a transposed batch", 0, transposed)
}

/// [`Backend::matmul`](crate::Backend::matmul).
pub fn matmul(spec: Gemm, a: Operand, b: Operand, c: Operand) -> Result<(), ShapeError> {
    gemm("matmul", spec, a, b, c)
}

/// [`Backend::copy`](crate::Backend::copy): `len` values from each operand's offset.
pub fn copy(src: Operand, dst: Operand, len: usize) -> Result<(), ShapeError> {
    span("copy", "src", src, len)?;
    span("copy", "dst", dst, len)
}

/// A matrix product with a layer's bias (and activation) fused into it
/// ([`Backend::matmul_bias`](crate::Backend::matmul_bias)): [`matmul`]'s checks, then a bias
/// of `spec.n` values.
pub fn matmul_bias(
    spec: Gemm,
    a: Operand,
    b: Operand,
    bias: Operand,
    c: Operand,
) -> Result<(), ShapeError> {
    let op = "matmul_bias";
    gemm(op, spec, a, b, c)?;
    span(op, "bias", bias, spec.n)
}

fn gemm(
    op: &'static str,
    spec: Gemm,
    a: Operand,
    b: Operand,
    c: Operand,
) -> Result<(), ShapeError> {
    span(op, "a", a, spec.m.saturating_mul(spec.k))?;
    span(op, "b", b, spec.k.saturating_mul(spec.n))?;
    span(op, "c", c, spec.m.saturating_mul(spec.n))
}

/// [`Backend::bias_add`](crate::Backend::bias_add) over the first `rows x cols` values of a
/// buffer of `x` values.
pub fn bias_add(x: usize, bias: Operand, rows: usize, cols: usize) -> Result<(), ShapeError> {
    let op = "bias_add";
    positive(op, "cols", cols)?;
    span(op, "bias", bias, cols)?;
    span(op, "x", Operand::whole(x), rows.saturating_mul(cols))
}

/// [`Backend::relu_backward`](crate::Backend::relu_backward) over the first `len` values.
pub fn relu_backward(grad: usize, activation: usize, len: usize) -> Result<(), ShapeError> {
    let op = "relu_backward";
    span(op, "activation", Operand::whole(activation), len)?;
    span(op, "grad", Operand::whole(grad), len)
}

/// [`Backend::softmax_cross_entropy`](crate::Backend::softmax_cross_entropy)'s operand
/// lengths; the labels' values are checked after these ([`labels`]).
pub fn softmax_cross_entropy(
    logits: usize,
    labels: usize,
    rows: usize,
    classes: usize,
    dlogits: usize,
) -> Result<(), ShapeError> {
    let op = "softmax_cross_entropy";
    scores(op, logits, labels, rows, classes)?;
    span(
        op,
        "dlogits",
        Operand::whole(dlogits),
        rows.saturating_mul(classes),
    )
}

/// [`Backend::column_sum`](crate::Backend::column_sum) over the first `rows x cols` values of
/// a buffer of `x` values.
pub fn column_sum(x: usize, rows: usize, cols: usize, out: Operand) -> Result<(), ShapeError> {
    let op = "column_sum";
    positive(op, "cols", cols)?;
    span(op, "x", Operand::whole(x), rows.saturating_mul(cols))?;
    span(op, "out", out, cols)
}

/// [`Backend::count_correct`](crate::Backend::count_correct)'s operand lengths; the labels'
/// values are checked after these ([`labels`]).
pub fn count_correct(
    logits: usize,
    labels: usize,
    rows: usize,
    classes: usize,
) -> Result<(), ShapeError> {
    scores("count_correct", logits, labels, rows, classes)
}

/// What [`softmax_cross_entropy`] and [`count_correct`] check first: `rows x classes` logits
/// (at least one class) and `rows` labels.
fn scores(
    op: &'static str,
    logits: usize,
    labels: usize,
    rows: usize,
    classes: usize,
) -> Result<(), ShapeError> {
    positive(op, "classes", classes)?;
    span(
        op,
        "logits",
        Operand::whole(logits),
        rows.saturating_mul(classes),
    )?;
    span(op, "labels", Operand::whole(labels), rows)
}

/// `Ok` when every label is below `classes`; else [`bad_label`] of the first that is not.
pub fn labels(op: &'static str, labels: &[u32], classes: usize) -> Result<(), ShapeError> {
    match labels.iter().find(|&&label| label as usize >= classes) {
        Some(&bad) => Err(bad_label(op, bad, classes)),
        None => Ok(()),
    }
}

/// The error for a label (the first bad one) that is not below `classes`.
pub fn bad_label(op: &'static str, label: u32, classes: usize) -> ShapeError {
    ShapeError {
        op,
        operand: "labels",
        needed: label as usize + 1,
        available: classes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fails(result: Result<(), ShapeError>, op: &str, operand: &str, needed: usize) {
        let err = result.expect_err("an error");
        assert_eq!((err.op, err.operand, err.needed), (op, operand, needed));
    }

    #[test]
    fn spans_count_from_their_offset() {
        assert!(upload(3, Operand::at(5, 2)).is_ok());
        fails(upload(3, Operand::at(5, 3)), "upload", "dst", 6);
        assert!(download(Operand::at(5, 2), 3).is_ok());
        fails(download(Operand::at(5, 4), 2), "download", "src", 6);
    }

    #[test]
    fn sizes_that_overflow_are_errors_not_panics() {
        let huge = usize::MAX / 2;
        fails(
            matmul(
                Gemm::nn(huge, 3, 4),
                Operand::whole(8),
                Operand::whole(12),
                Operand::whole(0),
            ),
            "matmul",
            "a",
            usize::MAX,
        );
        fails(
            upload(5, Operand::at(10, usize::MAX)),
            "upload",
            "dst",
            usize::MAX,
        );
        fails(
            column_sum(10, huge, 3, Operand::whole(3)),
            "column_sum",
            "x",
            usize::MAX,
        );
    }

    #[test]
    fn matmul_checks_a_then_b_then_c() {
        let spec = Gemm::nn(2, 3, 4);
        let (a, b, c) = (Operand::whole(8), Operand::whole(12), Operand::whole(6));
        assert!(matmul(spec, a, b, c).is_ok());
        fails(matmul(spec, Operand::whole(7), b, c), "matmul", "a", 8);
        fails(matmul(spec, a, Operand::at(12, 1), c), "matmul", "b", 13);
        fails(matmul(spec, a, b, Operand::whole(5)), "matmul", "c", 6);
        let fused = "matmul_bias";
        assert!(matmul_bias(spec, a, b, Operand::whole(3), c).is_ok());
        fails(
            matmul_bias(spec, a, b, Operand::at(3, 1), c),
            fused,
            "bias",
            4,
        );
        fails(
            matmul_bias(spec, a, b, Operand::whole(3), Operand::whole(5)),
            fused,
            "c",
            6,
        );
    }

    #[test]
    fn zero_widths_are_refused() {
        fails(bias_add(0, Operand::whole(0), 4, 0), "bias_add", "cols", 1);
        fails(
            column_sum(0, 4, 0, Operand::whole(0)),
            "column_sum",
            "cols",
            1,
        );
        fails(
            softmax_cross_entropy(0, 4, 4, 0, 0),
            "softmax_cross_entropy",
            "classes",
            1,
        );
        fails(count_correct(0, 4, 4, 0), "count_correct", "classes", 1);
        // No rows is fine.
        assert!(column_sum(0, 0, 3, Operand::whole(3)).is_ok());
        assert!(softmax_cross_entropy(0, 0, 0, 10, 0).is_ok());
    }

    #[test]
    fn every_operand_is_named() {
        fails(bias_add(8, Operand::at(4, 1), 2, 4), "bias_add", "bias", 5);
        fails(bias_add(7, Operand::whole(4), 2, 4), "bias_add", "x", 8);
        fails(relu_backward(4, 3, 4), "relu_backward", "activation", 4);
        fails(relu_backward(3, 4, 4), "relu_backward", "grad", 4);
        let sx = "softmax_cross_entropy";
        fails(softmax_cross_entropy(19, 2, 2, 10, 20), sx, "logits", 20);
        fails(softmax_cross_entropy(20, 1, 2, 10, 20), sx, "labels", 2);
        fails(softmax_cross_entropy(20, 2, 2, 10, 19), sx, "dlogits", 20);
        fails(count_correct(19, 2, 2, 10), "count_correct", "logits", 20);
        fails(count_correct(20, 1, 2, 10), "count_correct", "labels", 2);
        fails(column_sum(5, 2, 3, Operand::whole(3)), "column_sum", "x", 6);
        fails(
            column_sum(6, 2, 3, Operand::at(3, 1)),
            "column_sum",
            "out",
            4,
        );
    }

    #[test]
    fn gather_checks_its_outputs_then_every_index() {
        assert!(gather(5, 3, &[0, 4], 6, 2).is_ok());
        fails(gather(5, 3, &[0, 4], 5, 2), "gather", "x", 6);
        fails(gather(5, 3, &[0, 4], 6, 1), "gather", "labels", 2);
        fails(gather(5, 3, &[0, 7, 5], 9, 3), "gather", "examples", 8);
    }

    #[test]
    fn the_first_bad_label_is_reported() {
        assert!(labels("op", &[0, 9, 3], 10).is_ok());
        let err = labels("op", &[0, 12, 10, 99], 10).unwrap_err();
        assert_eq!(err, bad_label("op", 12, 10));
        assert_eq!((err.operand, err.needed, err.available), ("labels", 13, 10));
        assert_eq!(bad_label("op", u32::MAX, 10).needed, u32::MAX as usize + 1);
    }
}
