//! Whole training runs on the real MNIST data.

mod common;

use common::{cpu_pool, ema, initial_state, test_accuracy, train_on_two_cpus};
use tandem_model::{Mlp, Network};
use tandem_optim::Sgd;
use tandem_strategy::{train, Batches, Mode, NoObserver};

fn max_relative_difference(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
    let diff = a.iter().zip(b).fold(0.0f64, |m, (&x, &y)| {
        m.max((f64::from(x) - f64::from(y)).abs())
    });
    diff / scale
}

#[test]
fn sync_with_n_workers_equals_one_worker_with_an_n_times_larger_batch() {
    let steps = 20;
    let run = |workers: usize, batch: usize| {
        let mut state = initial_state(5);
        let batches = Batches {
            batch_size: batch,
            ..Batches::default()
        };
        train(
            Mode::Sync,
            &mut cpu_pool(workers, batch),
            &mut state,
            &Sgd::default(),
            &batches,
            steps,
            &NoObserver,
        )
        .unwrap();
        state
    };
    let initial = initial_state(5);
    for workers in [2, 4] {
        let single = run(1, 25 * workers);
        let parallel = run(workers, 25);
        assert_eq!((single.step, parallel.step), (steps, steps));
        let moved = max_relative_difference(&single.params, &initial.params);
        assert!(
            moved > 1e-3,
            "the parameters barely moved ({moved}): the comparison would prove nothing"
        );
        let params = max_relative_difference(&parallel.params, &single.params);
        let ema = max_relative_difference(ema(&parallel), ema(&single));
        eprintln!("{workers} workers vs 1: params {params:.2e}, ema {ema:.2e} (moved {moved:.2e})");
        assert!(
            params <= 1e-5 && ema <= 1e-5,
            "{workers} workers: params {params}, ema {ema}"
        );
    }
}

#[test]
fn the_same_sync_run_twice_is_bitwise_identical() {
    let run = || {
        let mut state = initial_state(3);
        train_on_two_cpus(Mode::Sync, &mut state, &Batches::default(), 60, &NoObserver);
        state
    };
    let (a, b) = (run(), run());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.params), bits(&b.params));
    assert_eq!(bits(ema(&a)), bits(ema(&b)));
    assert_ne!(bits(&a.params), bits(&initial_state(3).params));
}

#[test]
fn a_short_sync_run_on_real_data_reaches_95_percent() {
    let mut state = initial_state(1);
    // One epoch of 55,000 examples at 2 x 100 per step.
    train_on_two_cpus(
        Mode::Sync,
        &mut state,
        &Batches::default(),
        275,
        &NoObserver,
    );
    let (ema, raw) = test_accuracy(&state);
    eprintln!("sync, 1 epoch: test accuracy {ema:.4} averaged, {raw:.4} raw");
    assert!(ema >= 0.95, "averaged {ema}");
}

/// Hears of every step and asks to stop once the strategy has reported step `at`.
struct StopAt {
    at: u64,
    seen: std::sync::atomic::AtomicU64,
}

impl tandem_strategy::Observer for StopAt {
    fn log_every(&self) -> u64 {
        1
    }
    fn on_log(&self, report: &tandem_strategy::StepReport) {
        self.seen
            .fetch_max(report.step, std::sync::atomic::Ordering::SeqCst);
    }
    fn should_stop(&self) -> bool {
        self.seen.load(std::sync::atomic::Ordering::SeqCst) >= self.at
    }
}

#[test]
fn a_sync_run_stopped_checkpointed_and_resumed_equals_the_uninterrupted_run_bitwise() {
    use tandem_checkpoint as checkpoint;
    let batches = Batches::default();
    let end = 50;
    let mut straight = initial_state(8);
    train_on_two_cpus(Mode::Sync, &mut straight, &batches, end, &NoObserver);

    let mut first = initial_state(8);
    let stop = StopAt {
        at: 17,
        seen: Default::default(),
    };
    let report = train_on_two_cpus(Mode::Sync, &mut first, &batches, end, &stop);
    assert!(report.stopped);
    // The stop is seen while step 18 runs, which completes.
    assert_eq!(first.step, 18);
    let dir = tempfile::tempdir().unwrap();
    let layout = Mlp::mnist().layout();
    let path =
        checkpoint::save_in_dir(dir.path(), &first, &layout, &Default::default(), 3).unwrap();

    // A new process would start from the file with fresh replicas.
    let mut resumed = checkpoint::load(&path, &layout).unwrap().state;
    train_on_two_cpus(Mode::Sync, &mut resumed, &batches, end, &NoObserver);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(resumed.step, end);
    assert_eq!(bits(&resumed.params), bits(&straight.params));
    assert_eq!(bits(ema(&resumed)), bits(ema(&straight)));
}
