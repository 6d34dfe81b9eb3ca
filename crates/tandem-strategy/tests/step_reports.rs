//! What training reports: the logged steps and their cadence, examples, and (asynchronous)
//! staleness, per update and in total; when a run counts as stopped; and asynchronous training
//! with more workers than parameter shards.

mod common;

use common::{async_train, sync_train};

use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::Duration;

use tandem_collectives::{Collectives, Transport};
use tandem_core::{ReplicaError, TrainState};
use tandem_strategy::{
    train, train_across, BatchScaling, Batches, Mode, NoObserver, Observer, StepReport, Strategy,
    TrainReport,
};

use common::{across, batches, pool, sgd, within, Quirks};

/// Asks for a report every `.0` steps and keeps every report the run logs.
struct Log(u64, Mutex<Vec<StepReport>>);

impl Log {
    fn every(log_every: u64) -> Self {
        Self(log_every, Mutex::default())
    }
}

impl Observer for Log {
    fn log_every(&self) -> u64 {
        self.0
    }
    fn on_log(&self, report: &StepReport) {
        self.1.lock().unwrap().push(report.clone());
    }
}

/// No quirk: the plain least-squares fit.
struct Plain;

impl Quirks for Plain {
    fn before_gradients(&mut self, _call: u64) -> Result<Option<f32>, ReplicaError> {
        Ok(None)
    }
}

/// Workers meet in every gradient computation, after each has read the parameters, so that of
/// every two updates one is computed from parameters the other has since changed. A worker
/// left alone (the other has finished) goes on after a moment.
#[derive(Clone)]
struct Meet(Arc<(Mutex<(usize, u64)>, Condvar)>);

impl Quirks for Meet {
    fn before_gradients(&mut self, _call: u64) -> Result<Option<f32>, ReplicaError> {
        let (lock, turn) = &*self.0;
        let mut state = lock.lock().unwrap();
        let generation = state.1;
        state.0 += 1;
        if state.0 == 2 {
            *state = (0, generation + 1);
            turn.notify_all();
        } else {
            let (_state, _timeout) = turn
                .wait_timeout_while(state, Duration::from_secs(2), |s| s.1 == generation)
                .unwrap();
        }
        Ok(None)
    }
}

fn train_async<Q: Quirks + 'static>(
    workers: usize,
    quirks: impl FnMut(usize) -> Q + Send + 'static,
    start: u64,
    end: u64,
    log_every: u64,
) -> (TrainReport, Vec<StepReport>, TrainState) {
    within("async training", move || {
        let mut pool = pool(workers, quirks);
        let mut state = TrainState::new(vec![0.0, 0.0], &sgd());
        state.step = start;
        let log = Log::every(log_every);
        let report = async_train(&mut pool, &mut state, &sgd(), &batches(), end, &log).unwrap();
        (report, log.1.into_inner().unwrap(), state)
    })
}

#[test]
fn one_worker_logs_every_nth_step_of_a_resumed_run_with_its_examples_and_no_staleness() {
    let (report, logged, state) = train_async(1, |_| Plain, 30, 60, 3);
    let steps: Vec<u64> = logged.iter().map(|r| r.step).collect();
    assert_eq!(steps, (11..=20).map(|i| i * 3).collect::<Vec<_>>());
    for r in &logged {
        assert_eq!(r.examples, (r.step - 30) * 10, "{r:?}");
        assert_eq!(r.staleness, Some(0), "one worker is never stale: {r:?}");
    }
    assert_eq!((report.steps, report.examples, state.step), (30, 300, 60));
    let staleness = report.staleness.expect("async measures staleness");
    assert_eq!((staleness.mean, staleness.max), (0.0, 0));
}

#[test]
fn the_staleness_totals_are_those_of_the_updates() {
    let meet = Meet(Arc::default());
    let (report, logged, _) = train_async(2, move |_| meet.clone(), 0, 40, 1);
    assert_eq!(logged.len(), 40);
    let each: Vec<u64> = logged.iter().map(|r| r.staleness.unwrap()).collect();
    // Of each pair of updates from the same parameters, the second is stale.
    assert!(each.iter().filter(|&&s| s >= 1).count() >= 15, "{each:?}");
    let staleness = report.staleness.unwrap();
    let mean = each.iter().sum::<u64>() as f64 / each.len() as f64;
    assert!(
        (staleness.mean - mean).abs() < 1e-12,
        "{staleness:?} vs {each:?}"
    );
    assert_eq!(staleness.max, *each.iter().max().unwrap());
}

/// Every worker's first gradient computation waits for all the others' (each has taken a
/// batch by then), so that every worker makes an update, however fast the first one is.
#[derive(Clone)]
struct StartTogether(Arc<Barrier>);

impl Quirks for StartTogether {
    fn before_gradients(&mut self, call: u64) -> Result<Option<f32>, ReplicaError> {
        if call == 1 {
            self.0.wait();
        }
        Ok(None)
    }
}

#[test]
fn more_workers_than_shards_update_every_shard() {
    // The fit's two parameters make one shard; four workers each start their update at a
    // shard of their own choosing, which must be a shard there is.
    let start = StartTogether(Arc::new(Barrier::new(4)));
    let (report, logged, state) = train_async(4, move |_| start.clone(), 0, 400, 0);
    assert!(
        logged.is_empty(),
        "log_every 0 logged {} steps",
        logged.len()
    );
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(state.step, 400);
}

/// Asks to stop from the first poll on.
struct StopAtOnce;

impl Observer for StopAtOnce {
    fn should_stop(&self) -> bool {
        true
    }
}

#[test]
fn a_run_stopped_before_its_end_says_so_and_one_that_reached_it_does_not() {
    for (end, stopped) in [(5, true), (1, false)] {
        let report = within("async training", move || {
            let mut pool = pool(1, |_| Plain);
            let mut state = TrainState::new(vec![0.0, 0.0], &sgd());
            let report =
                async_train(&mut pool, &mut state, &sgd(), &batches(), end, &StopAtOnce).unwrap();
            // The one worker finishes the update it began, then stops.
            assert_eq!(state.step, 1);
            report
        });
        assert_eq!(report.stopped, stopped, "end {end}: {report:?}");
        assert_eq!(report.steps, 1);
    }
}

#[test]
fn sync_logs_every_nth_step_of_a_resumed_run_with_the_global_batchs_examples() {
    let (report, logged) = within("sync training", || {
        let mut pool = pool(2, |_| Plain);
        let mut state = TrainState::new(vec![0.0, 0.0], &sgd());
        state.step = 30;
        let log = Log::every(3);
        let report = sync_train(&mut pool, &mut state, &sgd(), &batches(), 60, &log).unwrap();
        (report, log.1.into_inner().unwrap())
    });
    let steps: Vec<u64> = logged.iter().map(|r| r.step).collect();
    assert_eq!(steps, (11..=20).map(|i| i * 3).collect::<Vec<_>>());
    for r in &logged {
        // Two workers of 10 examples a step.
        assert_eq!(r.examples, (r.step - 30) * 20, "{r:?}");
        assert_eq!(r.staleness, None, "{r:?}");
    }
    assert_eq!((report.steps, report.examples), (30, 600));
    assert_eq!(report.staleness, None);
}

/// The learning rates a synchronous run of `ranks` x `local` workers of `batch` examples each
/// reports at its first 6 steps, its rate scaled by `scaling` (rank 0's reports).
fn sync_rates(ranks: usize, local: usize, batch: usize, scaling: BatchScaling) -> Vec<f32> {
    let strategy = Strategy {
        batch_scaling: scaling,
        ..Strategy::from(Mode::Sync)
    };
    let batches = Batches {
        batch_size: batch,
        ..batches()
    };
    let run = move |transport: Option<Transport<'_>>, log: &dyn Observer| {
        let mut state = TrainState::new(vec![0.0, 0.0], &sgd());
        let mut pool = pool(local, |_| Plain);
        let (optimizer, end) = (sgd(), 6);
        let report = match transport {
            None => train(
                strategy, &mut pool, &mut state, &optimizer, &batches, end, log,
            ),
            Some(t) => train_across(
                t, strategy, &mut pool, &mut state, &optimizer, &batches, end, log,
            ),
        };
        report.unwrap();
    };
    let logged = within("sync training", move || {
        let log = Log::every(1);
        match ranks {
            1 => run(None, &log),
            _ => {
                across(ranks, |rank| {
                    let watching: &dyn Observer = match rank.rank() {
                        0 => &log,
                        _ => &NoObserver,
                    };
                    run(Some(Transport::Collectives(rank)), watching)
                });
            }
        }
        log.1.into_inner().unwrap()
    });
    logged.iter().map(|r| r.learning_rate).collect()
}

/// `--lr-scaling auto` follows the global batch of every worker on every rank: 4 workers of 300
/// examples (1,200 in all, 1.5 times the 800 that auto keeps the rate at) train at the rates of
/// a factor of 1.5, in one process or as 2 ranks of 2 (each step is 17 epochs of the fit's 70
/// examples: the scaled rate's warm-up is over by the second step).
#[test]
fn a_sync_rate_scales_with_the_global_batch_of_every_worker_on_every_rank() {
    let scaled = sync_rates(1, 4, 300, BatchScaling::Factor(1.5));
    let unscaled = sync_rates(1, 4, 300, BatchScaling::Factor(1.0));
    assert_eq!(scaled.len(), 6);
    assert!(scaled[1..].iter().zip(&unscaled[1..]).all(|(s, u)| s > u));
    for (ranks, local) in [(1, 4), (2, 2)] {
        let auto = sync_rates(ranks, local, 300, BatchScaling::Auto);
        assert_eq!(auto, scaled, "{ranks} rank(s) x {local} workers");
    }
    // 2 workers of 300: 600 examples, under 800, keep the rate.
    let two = sync_rates(1, 2, 300, BatchScaling::Factor(1.0));
    assert_eq!(sync_rates(1, 2, 300, BatchScaling::Auto), two);
}

/// Counts the reports and stalls it is given; names no cadence and no stall timeout (the
/// defaults: never).
#[derive(Default)]
struct Unasked {
    reports: Mutex<u64>,
    stalls: Mutex<u64>,
}

impl Observer for Unasked {
    fn on_log(&self, _: &StepReport) {
        *self.reports.lock().unwrap() += 1;
    }
    fn on_stall(&self, _: &tandem_strategy::Stall) {
        *self.stalls.lock().unwrap() += 1;
    }
}

/// Steps of 100 ms: long enough for the watchdog to see a worker at work.
struct Slow;

impl Quirks for Slow {
    fn before_gradients(&mut self, _call: u64) -> Result<Option<f32>, ReplicaError> {
        std::thread::sleep(Duration::from_millis(100));
        Ok(None)
    }
}

/// An observer that asks for no reports and watches for no stalls is given neither, however
/// long the steps take.
#[test]
fn an_observer_that_asks_for_no_reports_or_stalls_is_given_none() {
    let observer = within("sync training", || {
        let observer = Unasked::default();
        let mut state = TrainState::new(vec![0.0, 0.0], &sgd());
        sync_train(
            &mut pool(2, |_| Slow),
            &mut state,
            &sgd(),
            &batches(),
            3,
            &observer,
        )
        .unwrap();
        observer
    });
    assert_eq!(*observer.reports.lock().unwrap(), 0);
    assert_eq!(*observer.stalls.lock().unwrap(), 0);
}
