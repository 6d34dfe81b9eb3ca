//! The host backend in a 16-bit type ([`NarrowCpuBackend`]): every value it stores is rounded
//! to `bf16` or `f16` (round to nearest, ties to even: PTX's `cvt.rn`), every product and sum
//! is computed in `f32` from those values and rounded once when it is stored. That is what
//! tensor cores do (16-bit operands, exact products, `f32` accumulation), so this backend is
//! the reference the GPU's 16-bit kernels are tested against, as [`CpuBackend`] is for `f32`.
//! Speed is not its goal: it computes in `f32` and rounds after each operation.

use std::cell::Cell;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use tandem_core::{DType, Helpers};

use crate::backend::{Activation, Backend, CpuBackend, ExampleSet, Gemm, ShapeError};
use crate::check::{self, Operand};

/// Values converted at a time (a stack buffer of 16-bit values).
const CHUNK: usize = 256;

/// Rounds every value to the nearest value of `dtype` (ties to even; `f16` overflows to
/// infinity, as `cvt.rn.f16.f32` does), in place; `f32` leaves them as they are. Uses the
/// `half` crate's slice conversions (hardware instructions where the CPU has them).
pub fn round_to(dtype: DType, values: &mut [f32]) {
    match dtype {
        DType::F32 => {}
        DType::BF16 => round_through::<bf16>(values),
        DType::F16 => round_through::<f16>(values),
    }
}

/// `src` as `bf16` bit patterns in `dst` (round to nearest, ties to even): what travels when
/// values are exchanged in 16 bits.
pub fn encode_bf16(src: &[f32], dst: &mut Vec<u16>) {
    dst.clear();
    dst.extend(src.iter().map(|&v| bf16::from_f32(v).to_bits()));
}

/// `bf16` bit patterns back to `f32` (exactly) in `dst`.
pub fn decode_bf16(src: &[u16], dst: &mut [f32]) {
    for (d, &bits) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(bits).to_f32();
    }
}

fn round_through<T>(values: &mut [f32])
where
    T: Copy + Default,
    [T]: HalfFloatSliceExt,
{
    let mut narrow = [T::default(); CHUNK];
    for chunk in values.chunks_mut(CHUNK) {
        let narrow = &mut narrow[..chunk.len()];
        narrow.convert_from_f32_slice(chunk);
        narrow.convert_to_f32_slice(chunk);
    }
}

/// [`CpuBackend`] storing `bf16` or `f16` values (held in `f32`s that are always exactly
/// representable in the type): uploads and every operation's results are rounded, operations
/// compute in `f32`. [`Backend::set_loss_scale`] multiplies the loss's gradient before it is
/// rounded, as mixed-precision training with `f16` needs.
#[derive(Debug, Clone)]
pub struct NarrowCpuBackend {
    dtype: DType,
    loss_scale: Cell<f32>,
    /// Whether the last [`Backend::unscale`] saw only finite values.
    unscaled_finite: Cell<bool>,
}

impl NarrowCpuBackend {
    /// A backend storing `dtype`; `None` for `f32` (that is [`CpuBackend`]).
    pub fn new(dtype: DType) -> Option<Self> {
        (dtype != DType::F32).then_some(Self {
            dtype,
            loss_scale: Cell::new(1.0),
            unscaled_finite: Cell::new(true),
        })
    }

    fn round(&self, values: &mut [f32]) {
        round_to(self.dtype, values);
    }
}

impl Backend for NarrowCpuBackend {
    type Buffer = Vec<f32>;
    type Labels = Vec<u32>;
    type Examples = ExampleSet;
    type Error = ShapeError;

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn set_loss_scale(&self, scale: f32) -> Result<bool, ShapeError> {
        self.loss_scale.set(scale);
        Ok(true)
    }

    fn unscale(&self, (x, offset): (&mut Vec<f32>, usize), len: usize) -> Result<(), ShapeError> {
        check::unscale(Operand::at(x.len(), offset), len)?;
        let values = &mut x[offset..offset + len];
        self.unscaled_finite
            .set(values.iter().all(|v| v.is_finite()));
        // In f32, where they no longer underflow: multiplying by the inverse of a power of two
        // is exact.
        let inverse = 1.0 / self.loss_scale.get();
        values.iter_mut().for_each(|v| *v *= inverse);
        Ok(())
    }

    fn unscaled_finite(&self) -> Result<bool, ShapeError> {
        Ok(self.unscaled_finite.get())
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>, ShapeError> {
        CpuBackend.zeros(len)
    }

    fn zero_labels(&self, len: usize) -> Result<Vec<u32>, ShapeError> {
        CpuBackend.zero_labels(len)
    }

    fn upload(&self, src: &[f32], dst: &mut Vec<f32>, offset: usize) -> Result<(), ShapeError> {
        CpuBackend.upload(src, dst, offset)?;
        self.round(&mut dst[offset..offset + src.len()]);
        Ok(())
    }

    fn download(&self, src: &Vec<f32>, offset: usize, dst: &mut [f32]) -> Result<(), ShapeError> {
        CpuBackend.download(src, offset, dst)
    }

    fn write_with(
        &self,
        dst: &mut Vec<f32>,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<(), ShapeError> {
        fill(dst);
        self.round(dst);
        Ok(())
    }

    fn read_with(&self, src: &Vec<f32>, read: &mut dyn FnMut(&[f32])) -> Result<(), ShapeError> {
        CpuBackend.read_with(src, read)
    }

    fn exchange(&self, buffer: &mut Vec<f32>, host: &mut Vec<f32>) -> bool {
        // What the replica receives is overwritten (and rounded) by its next step.
        CpuBackend.exchange(buffer, host)
    }

    fn upload_examples(&self, examples: &ExampleSet) -> Result<ExampleSet, ShapeError> {
        CpuBackend.upload_examples(examples)
    }

    fn gather(
        &self,
        examples: &ExampleSet,
        indices: &[u32],
        x: &mut Vec<f32>,
        labels: &mut Vec<u32>,
    ) -> Result<(), ShapeError> {
        CpuBackend.gather(examples, indices, x, labels)?;
        self.round(&mut x[..indices.len() * examples.features()]);
        Ok(())
    }

    fn matmul(
        &self,
        spec: Gemm,
        a: (&Vec<f32>, usize),
        b: (&Vec<f32>, usize),
        (c, c_at): (&mut Vec<f32>, usize),
    ) -> Result<(), ShapeError> {
        CpuBackend.matmul(spec, a, b, (c, c_at))?;
        self.round(&mut c[c_at..c_at + spec.m * spec.n]);
        Ok(())
    }

    fn matmul_shared(
        &self,
        spec: Gemm,
        a: (&Vec<f32>, usize),
        b: (&Vec<f32>, usize),
        (c, c_at): (&mut Vec<f32>, usize),
        helpers: &dyn Helpers,
    ) -> Result<(), ShapeError> {
        CpuBackend.matmul_shared(spec, a, b, (c, c_at), helpers)?;
        self.round(&mut c[c_at..c_at + spec.m * spec.n]);
        Ok(())
    }

    fn matmul_bias(
        &self,
        spec: Gemm,
        a: (&Vec<f32>, usize),
        b: (&Vec<f32>, usize),
        bias: (&Vec<f32>, usize),
        (c, c_at): (&mut Vec<f32>, usize),
        activation: Activation,
    ) -> Result<(), ShapeError> {
        // The bias (and ReLU) in f32 on the f32 product, one rounding: the fused kernel's
        // epilogue.
        CpuBackend.matmul_bias(spec, a, b, bias, (c, c_at), activation)?;
        self.round(&mut c[c_at..c_at + spec.m * spec.n]);
        Ok(())
    }

    fn copy(
        &self,
        src: (&Vec<f32>, usize),
        dst: (&mut Vec<f32>, usize),
        len: usize,
    ) -> Result<(), ShapeError> {
        CpuBackend.copy(src, dst, len)
    }

    fn bias_add(
        &self,
        x: &mut Vec<f32>,
        bias: (&Vec<f32>, usize),
        rows: usize,
        cols: usize,
        activation: Activation,
    ) -> Result<(), ShapeError> {
        CpuBackend.bias_add(x, bias, rows, cols, activation)?;
        self.round(&mut x[..rows * cols]);
        Ok(())
    }

    fn relu_backward(
        &self,
        grad: &mut Vec<f32>,
        activation: &Vec<f32>,
        len: usize,
    ) -> Result<(), ShapeError> {
        // Zeroing keeps every value representable.
        CpuBackend.relu_backward(grad, activation, len)
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Vec<f32>,
        labels: &Vec<u32>,
        rows: usize,
        classes: usize,
        dlogits: &mut Vec<f32>,
    ) -> Result<f32, ShapeError> {
        let loss = CpuBackend.softmax_cross_entropy(logits, labels, rows, classes, dlogits)?;
        let dlogits = &mut dlogits[..rows * classes];
        // Scaled in f32 before the rounding: small gradients survive it (a power of two is
        // exact unless the product overflows).
        let scale = self.loss_scale.get();
        if scale != 1.0 {
            dlogits.iter_mut().for_each(|d| *d *= scale);
        }
        self.round(dlogits);
        Ok(loss)
    }

    fn column_sum(
        &self,
        x: &Vec<f32>,
        rows: usize,
        cols: usize,
        (out, out_at): (&mut Vec<f32>, usize),
    ) -> Result<(), ShapeError> {
        CpuBackend.column_sum(x, rows, cols, (out, out_at))?;
        self.round(&mut out[out_at..out_at + cols]);
        Ok(())
    }

    fn count_correct(
        &self,
        logits: &Vec<f32>,
        labels: &Vec<u32>,
        rows: usize,
        classes: usize,
    ) -> Result<usize, ShapeError> {
        CpuBackend.count_correct(logits, labels, rows, classes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 by bit manipulation, independently of `half`: round to nearest even on the upper
    /// 16 bits of the f32 pattern.
    fn bf16_by_bits(x: f32) -> f32 {
        let bits = x.to_bits();
        if x.is_nan() {
            return x;
        }
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
        f32::from_bits(rounded & 0xffff_0000)
    }

    #[test]
    fn bf16_rounding_is_round_to_nearest_even_on_the_upper_half() {
        let mut values: Vec<f32> = (0..20_000u32)
            .map(|i| f32::from_bits(0x3f80_0000u32.wrapping_add(i.wrapping_mul(0x9e37))))
            .chain([
                1.0 + 1.0 / 256.0,
                1.0 + 3.0 / 256.0,
                -0.0,
                f32::MAX,
                f32::MIN_POSITIVE,
            ])
            .collect();
        let expected: Vec<f32> = values.iter().map(|&v| bf16_by_bits(v)).collect();
        round_to(DType::BF16, &mut values);
        assert_eq!(values, expected);
        // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to the even one, 1.
        let mut tie = [1.0 + 1.0 / 256.0];
        round_to(DType::BF16, &mut tie);
        assert_eq!(tie, [1.0]);
    }

    #[test]
    fn bf16_bits_round_trip_as_rounding_does() {
        let values: Vec<f32> = (0..5_000).map(|i| (i as f32 - 2_500.0) * 1.37e-3).collect();
        let mut bits = Vec::new();
        encode_bf16(&values, &mut bits);
        let mut back = vec![0.0; values.len()];
        decode_bf16(&bits, &mut back);
        let expected: Vec<f32> = values.iter().map(|&v| bf16_by_bits(v)).collect();
        assert_eq!(back, expected);
        assert!(bits
            .iter()
            .zip(&values)
            .all(|(&b, &v)| b == (bf16_by_bits(v).to_bits() >> 16) as u16));
    }

    #[test]
    fn f16_rounding_keeps_eleven_bits_and_overflows_to_infinity() {
        let mut values = [
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            65_504.0,
            65_520.0,
            1e-8,
            3e-5,
        ];
        round_to(DType::F16, &mut values);
        // Ties to even; 65,520 is halfway to 2^16, which f16 cannot hold: infinity.
        assert_eq!(values[0], 1.0);
        assert_eq!(values[1], 1.0 + 4.0 / 2048.0);
        assert_eq!(values[2], 65_504.0);
        assert_eq!(values[3], f32::INFINITY);
        // Below half the smallest subnormal (2^-24): zero; subnormals keep their spacing.
        assert_eq!(values[4], 0.0);
        assert_eq!(
            values[5],
            (3e-5f64 / 2f64.powi(-24)).round() as f32 * 2f32.powi(-24)
        );
    }

    #[test]
    fn products_round_once_from_f32_accumulation() {
        let backend = NarrowCpuBackend::new(DType::BF16).unwrap();
        // 1 + 2^-7 is a bf16; its square, 1 + 2^-6 + 2^-14, is exact in f32 but not in bf16.
        // Summed 128 times in f32 and rounded once: 130 + 2^-7, i.e. 130 in bf16 (spacing 1
        // there); rounding each product to bf16 first would give 128 + 2 too, but rounding
        // each partial sum would lose the 2^-6s once the sum passes 2^7 / 2.
        let k = 128;
        let mut a = backend.zeros(k).unwrap();
        backend
            .upload(&vec![1.0 + 1.0 / 128.0; k], &mut a, 0)
            .unwrap();
        let mut c = backend.zeros(1).unwrap();
        backend
            .matmul(Gemm::nn(1, 1, k), (&a, 0), (&a, 0), (&mut c, 0))
            .unwrap();
        let exact: f64 = (0..k).map(|_| (1.0 + 1.0 / 128.0f64).powi(2)).sum();
        let mut expected = [exact as f32];
        round_to(DType::BF16, &mut expected);
        assert_eq!(c, expected);
        assert_eq!(c, [130.0]);
        assert!(NarrowCpuBackend::new(DType::F32).is_none());
    }

    #[test]
    fn the_loss_gradient_is_scaled_before_it_is_rounded() {
        let backend = NarrowCpuBackend::new(DType::F16).unwrap();
        // Confident logits: the wrong classes' gradients fall below f16's smallest subnormal
        // unless they are scaled.
        let (rows, classes) = (4, 3);
        let logits = vec![
            30.0, 0.0, 0.0, 0.0, 30.0, 0.0, 0.0, 0.0, 30.0, 30.0, 0.0, 0.0,
        ];
        let labels = vec![0, 1, 2, 0];
        let mut plain = vec![0.0; rows * classes];
        let mut reference = plain.clone();
        let loss = CpuBackend
            .softmax_cross_entropy(&logits, &labels, rows, classes, &mut reference)
            .unwrap();
        backend
            .softmax_cross_entropy(&logits, &labels, rows, classes, &mut plain)
            .unwrap();
        // e^-30 / 4 is about 2e-14: zero in f16.
        assert_eq!(plain[1], 0.0);
        assert!(reference[1] > 0.0);
        let scale = 2f32.powi(30);
        assert_eq!(backend.set_loss_scale(scale), Ok(true));
        let mut scaled = vec![0.0; rows * classes];
        let scaled_loss = backend
            .softmax_cross_entropy(&logits, &labels, rows, classes, &mut scaled)
            .unwrap();
        assert_eq!(scaled_loss, loss, "the loss itself is not scaled");
        for (s, r) in scaled.iter().zip(&reference) {
            let mut expected = [r * scale];
            round_to(DType::F16, &mut expected);
            assert_eq!(*s, expected[0]);
        }
        assert!(scaled[1] > 0.0);
    }
}
