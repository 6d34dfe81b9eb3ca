//! The replica's hand-written backward pass against finite differences of an independent f64
//! forward pass.

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_core::{Alone, Helpers, Replica, StepLoss};
use tandem_model::{Mlp, MlpReplica, Network};
use tandem_tensor::{CpuBackend, ExampleSet};

/// Mean softmax cross-entropy of the MLP on `batch`, straight from the definition, in f64:
/// each layer `a' = relu(a . W + b)`, the last without the ReLU.
fn loss_f64(mlp: &Mlp, params: &[f64], examples: &ExampleSet, batch: &[u32]) -> f64 {
    let widths: Vec<usize> = std::iter::once(mlp.inputs())
        .chain(mlp.hidden())
        .chain([mlp.classes()])
        .collect();
    let mut total = 0.0;
    for &i in batch {
        let mut a: Vec<f64> = examples
            .features_of(i as usize)
            .iter()
            .map(|&p| f64::from(p) / 255.0)
            .collect();
        let mut rest = params;
        for (l, pair) in widths.windows(2).enumerate() {
            let (ins, outs) = (pair[0], pair[1]);
            let (w, after) = rest.split_at(ins * outs);
            let (b, after) = after.split_at(outs);
            rest = after;
            let last = l + 2 == widths.len();
            a = (0..outs)
                .map(|j| {
                    let z = b[j] + (0..ins).map(|k| a[k] * w[k * outs + j]).sum::<f64>();
                    if last {
                        z
                    } else {
                        z.max(0.0)
                    }
                })
                .collect();
        }
        assert!(rest.is_empty(), "{} parameters left over", rest.len());
        let max = a.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let log_sum = a.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
        total += log_sum - a[examples.label(i as usize) as usize];
    }
    total / batch.len() as f64
}

/// Networks of no, one and two hidden layers: a softmax regression, the reference's shape and
/// a deeper one.
#[test]
fn backward_pass_matches_finite_differences() {
    for hidden in [&[][..], &[7], &[6, 5]] {
        check_against_finite_differences(Mlp::new(12, hidden, 4).unwrap());
    }
}

fn check_against_finite_differences(mlp: Mlp) {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let count = 9;
    let pixels: Vec<u8> = (0..count * mlp.inputs()).map(|_| rng.random()).collect();
    let labels: Vec<u8> = (0..count).map(|_| rng.random_range(0..4)).collect();
    let examples = ExampleSet::new(mlp.inputs(), pixels, labels).unwrap();
    let mut params = mlp.init(0.5, &mut rng);
    // Non-zero biases, so that their gradients are exercised away from the initial point.
    for p in params.iter_mut().filter(|p| **p == 0.0) {
        *p = rng.random_range(-0.3..0.3);
    }
    let batch: Vec<u32> = (0..count as u32).collect();
    let mut replica = MlpReplica::new(mlp.clone(), CpuBackend, &examples, 4).unwrap();
    replica
        .set_params(&mut |p| p.copy_from_slice(&params))
        .unwrap();
    let StepLoss::Known(loss) = replica.compute_gradients(&batch).unwrap() else {
        panic!("a CPU replica knows its loss at once");
    };
    let mut grads = Vec::new();
    replica.read_gradients(&mut |g| grads = g.to_vec()).unwrap();

    let params64: Vec<f64> = params.iter().map(|&p| f64::from(p)).collect();
    let loss64 = loss_f64(&mlp, &params64, &examples, &batch);
    assert!(
        (f64::from(loss) - loss64).abs() < 1e-5 * loss64.abs(),
        "loss {loss} vs {loss64}"
    );

    let h = 1e-6;
    let mut worst = 0.0f64;
    for i in 0..params.len() {
        let mut plus = params64.clone();
        plus[i] += h;
        let mut minus = params64.clone();
        minus[i] -= h;
        let numeric = (loss_f64(&mlp, &plus, &examples, &batch)
            - loss_f64(&mlp, &minus, &examples, &batch))
            / (2.0 * h);
        let error = (f64::from(grads[i]) - numeric).abs() / (numeric.abs() + 1e-3);
        worst = worst.max(error);
        assert!(
            error < 1e-3,
            "parameter {i}: analytic {} vs numeric {numeric}",
            grads[i]
        );
    }
    assert!(
        grads.iter().any(|&g| g.abs() > 1e-3),
        "gradients are all ~0: the test would prove nothing"
    );
    eprintln!("worst relative gradient error: {worst:.2e}");
}

/// A 3-4-2 network and ten examples for it.
fn tiny() -> (Mlp, ExampleSet) {
    let mlp = Mlp::new(3, &[4], 2).unwrap();
    let examples =
        ExampleSet::new(3, (0..30).collect(), vec![0, 1, 0, 1, 1, 0, 0, 1, 1, 0]).unwrap();
    (mlp, examples)
}

#[test]
fn batches_larger_than_the_initial_capacity_are_handled() {
    let (mlp, examples) = tiny();
    let mut replica = MlpReplica::new(mlp.clone(), CpuBackend, &examples, 2).unwrap();
    let params = mlp.init(0.3, &mut ChaCha8Rng::seed_from_u64(1));
    replica
        .set_params(&mut |p| p.copy_from_slice(&params))
        .unwrap();
    let small = replica.compute_gradients(&[3, 4]).unwrap();
    let all = replica
        .compute_gradients(&(0..10).collect::<Vec<_>>())
        .unwrap();
    for loss in [small, all] {
        assert!(
            matches!(loss, StepLoss::Known(l) if l.is_finite()),
            "{loss:?}"
        );
    }
    assert!(
        replica.compute_gradients(&[10]).is_err(),
        "an index past the data set is an error"
    );
}

#[test]
fn exchanged_gradients_are_the_steps_and_the_next_step_overwrites_what_it_received() {
    let (mlp, examples) = tiny();
    let params = mlp.init(0.3, &mut ChaCha8Rng::seed_from_u64(1));
    let gradients_of = |batch: &[u32]| {
        let mut fresh = MlpReplica::new(mlp.clone(), CpuBackend, &examples, 4).unwrap();
        fresh
            .set_params(&mut |p| p.copy_from_slice(&params))
            .unwrap();
        fresh.compute_gradients(batch).unwrap();
        let mut grads = Vec::new();
        fresh.read_gradients(&mut |g| grads = g.to_vec()).unwrap();
        grads
    };
    let (first, second) = ([1, 2, 3], [4, 5, 6, 7]);

    let mut replica = MlpReplica::new(mlp.clone(), CpuBackend, &examples, 4).unwrap();
    replica
        .set_params(&mut |p| p.copy_from_slice(&params))
        .unwrap();
    replica.compute_gradients(&first).unwrap();
    // The replica receives a buffer of NaNs: the next step must leave none of them.
    let mut slot = vec![f32::NAN; mlp.num_params()];
    assert!(replica.exchange_gradients(&mut slot).unwrap());
    assert_eq!(slot, gradients_of(&first));
    replica.compute_gradients(&second).unwrap();
    let mut after = Vec::new();
    replica.read_gradients(&mut |g| after = g.to_vec()).unwrap();
    assert_eq!(after, gradients_of(&second));

    // A buffer of another length is refused and left as it was.
    let mut short = vec![0.0; 3];
    assert!(!replica.exchange_gradients(&mut short).unwrap());
    assert_eq!(short, [0.0; 3]);
}

#[test]
fn gradients_from_lent_parameters_are_those_of_the_parameters_set_and_leave_its_own_alone() {
    let (mlp, examples) = tiny();
    let params = mlp.init(0.3, &mut ChaCha8Rng::seed_from_u64(1));
    let batch = [1, 2, 3];
    let gradients = |replica: &mut MlpReplica<CpuBackend>| {
        let mut grads = Vec::new();
        replica.read_gradients(&mut |g| grads = g.to_vec()).unwrap();
        grads
    };

    let mut set = MlpReplica::new(mlp.clone(), CpuBackend, &examples, 4).unwrap();
    set.set_params(&mut |p| p.copy_from_slice(&params)).unwrap();
    let StepLoss::Known(loss) = set.compute_gradients(&batch).unwrap() else {
        panic!("a CPU replica knows its loss");
    };

    // A replica whose own parameters stay zero computes from the lent ones.
    let mut lent = MlpReplica::new(mlp.clone(), CpuBackend, &examples, 4).unwrap();
    let from = lent
        .compute_gradients_from(&params, &batch, &Alone)
        .unwrap();
    assert_eq!(from, Some(StepLoss::Known(loss)));
    assert_eq!(gradients(&mut lent), gradients(&mut set));
    let own = lent.compute_gradients(&batch).unwrap();
    assert_ne!(
        own,
        StepLoss::Known(loss),
        "its own (zero) parameters were overwritten"
    );

    // Parameters of another model, shorter or longer, are an error.
    for len in [params.len() - 1, params.len() + 1] {
        assert!(lent
            .compute_gradients_from(&vec![0.0; len], &batch, &Alone)
            .is_err());
    }
}

/// Helpers that run the tasks last first, counting them.
#[derive(Default)]
struct Backwards {
    tasks: AtomicUsize,
}

impl Helpers for Backwards {
    fn share(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
        self.tasks.fetch_add(count, Ordering::Relaxed);
        (0..count).rev().for_each(task);
    }
}

/// The MNIST model's step shares its largest product in several tasks, and computed in another
/// order gives the very gradients of the step computed alone.
#[test]
fn gradients_computed_with_helpers_are_bitwise_those_computed_alone() {
    let mlp = Mlp::mnist();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let pixels: Vec<u8> = (0..20 * mlp.inputs()).map(|_| rng.random()).collect();
    let labels: Vec<u8> = (0..20).map(|i| i % 10).collect();
    let examples = ExampleSet::new(mlp.inputs(), pixels, labels).unwrap();
    let params = mlp.init(0.1, &mut rng);
    let batch: Vec<u32> = (0..20).rev().collect();
    let mut gradients = Vec::new();
    let backwards = Backwards::default();
    for helpers in [&Alone as &dyn Helpers, &backwards] {
        let mut replica = MlpReplica::new(mlp.clone(), CpuBackend, &examples, 20).unwrap();
        let loss = replica
            .compute_gradients_from(&params, &batch, helpers)
            .unwrap();
        let mut grads = Vec::new();
        replica.read_gradients(&mut |g| grads = g.to_vec()).unwrap();
        let bits: Vec<u32> = grads.iter().map(|g| g.to_bits()).collect();
        gradients.push((loss, bits));
    }
    assert!(gradients[0].1.iter().any(|&b| b != 0));
    assert_eq!(gradients[0], gradients[1]);
    assert!(
        backwards.tasks.load(Ordering::Relaxed) > 1,
        "dW1 was not shared"
    );
}
