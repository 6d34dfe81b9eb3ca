//! Asynchronous training's accuracy, in a test binary of its own: cargo runs test binaries one
//! after another, so no other test's threads take the cores from its two workers (which would
//! change how stale their updates are).

mod common;

use common::{initial_state, test_accuracy, train_on_two_cpus};
use tandem_strategy::{Batches, Mode, NoObserver};

#[test]
fn async_with_two_workers_reaches_97_percent_in_two_epochs_with_stale_updates() {
    // An asynchronous run depends on timing: single runs of two epochs land at 0.967-0.976
    // (mean about 0.973). The claim is about the typical run, the median of five.
    let mut accuracies: Vec<f64> = (2..7)
        .map(|seed| {
            let mut state = initial_state(seed);
            let batches = Batches { seed, ..Batches::default() };
            // Two epochs: 1,100 updates of 100 examples.
            let report = train_on_two_cpus(Mode::Async, &mut state, &batches, 1100, &NoObserver);
            let (ema, raw) = test_accuracy(&state);
            let staleness = report.staleness.unwrap();
            eprintln!("async, 2 epochs, seed {seed}: {ema:.4} averaged, {raw:.4} raw; staleness {staleness:?}");
            assert_eq!((report.steps, state.step), (1100, 1100));
            assert!(staleness.mean > 0.0 && staleness.max > 0, "{staleness:?}");
            ema
        })
        .collect();
    accuracies.sort_by(f64::total_cmp);
    assert!(accuracies[2] >= 0.97, "median of {accuracies:?}");
}
