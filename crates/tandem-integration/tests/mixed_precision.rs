//! Mixed precision on CPU workers: the 16-bit replicas' gradients against f32's, loss scaling,
//! and whole runs on the real MNIST data (`--precision bf16|f16`).

mod common;

use common::{gradients, initial_state, largest_logit, mnist, relative_error, test_accuracy};
use tandem_core::{DType, Replica, TrainState};
use tandem_model::{Mlp, MlpReplica};
use tandem_optim::Sgd;
use tandem_pool::{Device, WorkerPool};
use tandem_strategy::{train, Batches, Mode, NoObserver};
use tandem_tensor::{Backend, CpuBackend, NarrowCpuBackend};

/// A replica of the MNIST network storing `dtype`, its loss scale starting at `scale`.
fn narrow_replica(dtype: DType, scale: f32, batch: usize) -> MlpReplica<NarrowCpuBackend> {
    let backend = NarrowCpuBackend::new(dtype).unwrap();
    MlpReplica::new(Mlp::mnist(), backend, &mnist().train, batch)
        .unwrap()
        .with_initial_loss_scale(scale)
}

/// Parameters after a few f32 steps, so that the gradients are those of a network that has
/// started learning (at initialisation they are dominated by the first layer's noise).
fn trained_params() -> TrainState {
    let mut state = initial_state(1);
    let mut pool = WorkerPool::new(vec![Device::Cpu { worker: 0 }], |_| {
        MlpReplica::new(Mlp::mnist(), CpuBackend, &mnist().train, 100)
    })
    .unwrap();
    let batches = Batches::default();
    train(
        Mode::Sync,
        &mut pool,
        &mut state,
        &Sgd::default(),
        &batches,
        50,
        &NoObserver,
    )
    .unwrap();
    state
}

/// The 16-bit passes agree with f32 to within what their rounding allows. Every value the
/// pass stores is rounded once, to a relative error of at most u (2^-9 for bf16's 8
/// significant bits, 2^-12 for f16's 11). A gradient is reached through about eight such
/// roundings (x, W1, h, W2, logits, dlogits, dh, dW), and the products' f32 accumulation adds
/// nothing measurable: 8u. The logits are the exception: their rounding error, up to L u for
/// the largest |logit| L, is an absolute error of every log-probability, so a relative error
/// of up to L u of the softmax's outputs and of every gradient below them. Hence the bound
/// (8 + L) u on the gradients' relative error in norm: about 4% for bf16 and 0.5% for f16 at
/// L = 12. It must not be zero either: then nothing would have been rounded.
#[test]
fn narrow_gradients_equal_f32_within_the_roundings_of_the_pass() {
    let state = trained_params();
    let batch: Vec<u32> = (0..100).map(|i| i * 37 % 55_000).collect();
    let mut reference = MlpReplica::new(Mlp::mnist(), CpuBackend, &mnist().train, 100).unwrap();
    let exact = gradients(&mut reference, &state.params, &batch);
    let logit = largest_logit(&state.params, &batch);
    for (dtype, significant_bits) in [(DType::BF16, 8), (DType::F16, 11)] {
        let bound = (8.0 + logit) * 2f64.powi(-(significant_bits + 1));
        let mut replica = narrow_replica(dtype, 1024.0, 100);
        let narrow = gradients(&mut replica, &state.params, &batch);
        let error = relative_error(&narrow, &exact);
        eprintln!(
            "{dtype}: relative error {error:.2e} (bound {bound:.2e}, largest logit {logit:.1})"
        );
        assert!(error > 0.0, "{dtype}: nothing was rounded");
        assert!(error <= bound, "{dtype}: {error} > {bound}");
    }
}

/// Without a scale, the f16 pass flushes the smallest gradients to zero (below 2^-25, half
/// f16's smallest subnormal); scaled by 2^16 they survive.
#[test]
fn loss_scaling_keeps_the_small_f16_gradients() {
    let state = trained_params();
    let batch: Vec<u32> = (0..100).map(|i| i * 53 % 55_000).collect();
    let mut reference = MlpReplica::new(Mlp::mnist(), CpuBackend, &mnist().train, 100).unwrap();
    let exact = gradients(&mut reference, &state.params, &batch);
    let at = |scale| {
        let mut replica = narrow_replica(DType::F16, scale, 100);
        let g = gradients(&mut replica, &state.params, &batch);
        assert_eq!(replica.loss_scaling().unwrap().overflows(), 0);
        g
    };
    let (unscaled, scaled) = (at(1.0), at(65_536.0));
    let lost = |g: &[f32]| -> Vec<usize> {
        (0..exact.len())
            .filter(|&i| g[i] == 0.0 && exact[i] != 0.0)
            .collect()
    };
    let (lost_unscaled, lost_scaled) = (lost(&unscaled), lost(&scaled));
    let pick = |g: &[f32]| lost_unscaled.iter().map(|&i| g[i]).collect::<Vec<f32>>();
    let kept = relative_error(&pick(&scaled), &pick(&exact));
    eprintln!(
        "f16: {} gradients lost unscaled, {} scaled; the scaled pass's error on them {kept:.2e}",
        lost_unscaled.len(),
        lost_scaled.len()
    );
    assert!(lost_unscaled.len() > 100, "{}", lost_unscaled.len());
    assert!(
        lost_scaled.len() * 10 < lost_unscaled.len(),
        "{}",
        lost_scaled.len()
    );
    // Lost, the error on them is 100%. Kept, it is less, but not small: values this far below
    // the others are sums that cancel (dW = x^T dh), and carry the pass's other roundings
    // magnified (0.69 measured).
    assert!(kept < 0.9, "{kept}");
}

/// The gradients a scaled replica hands out are unscaled. Scaling by a power of two commutes
/// with rounding wherever no value is subnormal or overflows, so the gradients handed out at
/// scales 2^10 and 2^12 agree bit for bit but for the few values near f16's subnormals.
#[test]
fn scaled_gradients_are_handed_out_unscaled() {
    let state = trained_params();
    let batch: Vec<u32> = (0..100).collect();
    let at = |scale| {
        gradients(
            &mut narrow_replica(DType::F16, scale, 100),
            &state.params,
            &batch,
        )
    };
    let (low, high) = (at(1024.0), at(4096.0));
    let differing = low.iter().zip(&high).filter(|(a, b)| a != b).count();
    assert!(
        differing * 100 < low.len(),
        "{differing} of {} differ",
        low.len()
    );
    // A gradient handed out four times too large (unscaled by the wrong scale) would fail this.
    assert!(relative_error(&high, &low) < 1e-2);
}

/// A pool of `workers` workers computing in `dtype` from loss scale `scale`: CPU workers for
/// sync, simulated ones for async (whose order of updates, and so result, does not depend on
/// the machine's timing: two async runs on real threads differ by up to half a point after an
/// epoch, which would hide what the scale does).
fn narrow_pool(
    mode: Mode,
    dtype: DType,
    scale: f32,
    workers: usize,
) -> WorkerPool<MlpReplica<NarrowCpuBackend>> {
    let devices = (0..workers)
        .map(|worker| match mode {
            Mode::Sync => Device::Cpu { worker },
            Mode::Async => Device::Sim { worker },
        })
        .collect();
    WorkerPool::new(devices, |_| {
        Ok::<_, tandem_tensor::ShapeError>(narrow_replica(dtype, scale, 100))
    })
    .unwrap()
}

/// One epoch in `mode` on two workers computing in `dtype` from loss scale `scale`: the state
/// and the pool (whose replicas hold their loss scalers).
fn one_epoch(
    mode: Mode,
    dtype: DType,
    scale: f32,
) -> (TrainState, WorkerPool<MlpReplica<NarrowCpuBackend>>) {
    let mut state = initial_state(1);
    let mut pool = narrow_pool(mode, dtype, scale, 2);
    let steps = match mode {
        Mode::Sync => 275,
        Mode::Async => 550,
    };
    let batches = Batches::default();
    train(
        mode,
        &mut pool,
        &mut state,
        &Sgd::default(),
        &batches,
        steps,
        &NoObserver,
    )
    .unwrap();
    (state, pool)
}

/// f16 with a loss scale forced far too high (2^60): every replica's first passes overflow,
/// the scale halves each time (the batch computed again), the overflows are counted, and the
/// run learns as one started at the default scale does.
#[test]
fn f16_with_a_loss_scale_forced_too_high_halves_counts_and_still_learns() {
    for mode in [Mode::Sync, Mode::Async] {
        let (forced, pool) = one_epoch(mode, DType::F16, 2f32.powi(60));
        let (default, _) = one_epoch(mode, DType::F16, 65_536.0);
        for replica in pool.replicas() {
            let scaler = replica.loss_scaling().unwrap();
            // From 2^60 down to at most the default's 2^16: 44 halvings at least.
            assert!(scaler.overflows() >= 44, "{mode:?}: {}", scaler.overflows());
            assert!(scaler.scale() <= 65_536.0, "{mode:?}: {}", scaler.scale());
        }
        let (forced, default) = (test_accuracy(&forced).0, test_accuracy(&default).0);
        eprintln!("{mode:?}: forced 2^60 {forced:.4}, default scale {default:.4}");
        assert!(
            forced >= 0.95 && (forced - default).abs() < 0.005,
            "{mode:?}: {forced} vs {default}"
        );
    }
}

/// Sync in 16 bits is as reproducible as in f32: every replica's rounding and loss scale
/// depend only on its own batches.
#[test]
fn sync_in_sixteen_bits_is_bitwise_reproducible_and_learns() {
    for dtype in [DType::BF16, DType::F16] {
        let bits = |s: &TrainState| s.params.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let (a, _) = one_epoch(Mode::Sync, dtype, 65_536.0);
        let (b, _) = one_epoch(Mode::Sync, dtype, 65_536.0);
        assert_eq!(bits(&a), bits(&b), "{dtype}");
        let accuracy = test_accuracy(&a).0;
        assert!(accuracy >= 0.95, "{dtype}: {accuracy}");
    }
    // The narrow backend is not the f32 one in disguise.
    assert_eq!(
        NarrowCpuBackend::new(DType::BF16).unwrap().dtype(),
        DType::BF16
    );
}
