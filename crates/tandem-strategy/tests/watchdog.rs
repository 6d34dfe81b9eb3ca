//! The watchdog: stalled workers are reported, and a stop that a hung worker keeps from
//! happening hands the observer the last consistent state. Every run that could hang runs on a
//! thread of its own, and the test waits for it with a timeout: a hang fails the test.

mod common;

use common::{async_train, sync_train};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{batches, ema, sgd, LeastSquares, Quirks, EXAMPLES};
use tandem_collectives::{Channel, Collectives, Messages, Ranks, Transport};
use tandem_core::{Optimizer, ReplicaError, TrainState};
use tandem_optim::Sgd;
use tandem_pool::{Device, WorkerPool};
use tandem_strategy::{
    train_across, Batches, Epochs, Mode, NoObserver, Observer, Stall, TrainError, TrainReport,
};
use tandem_tensor::cpu::{sgd_ema_update, UpdateStep};

/// Long enough for any machine; only reached when the code under test hangs.
const LIMIT: Duration = Duration::from_secs(60);

/// The replica of worker `hang_at.0` blocks at its `hang_at.1`-th gradient computation until
/// released. Every gradient is logged in the order it is applied: the log's lock is held while
/// the strategy applies it.
struct Hang {
    hang_at: Option<u64>,
    release: Option<Receiver<()>>,
    /// Healthy workers take a little time, so that the hung one is not alone for long.
    pause: Duration,
    applied: Log,
}

impl Quirks for Hang {
    fn before_gradients(&mut self, call: u64) -> Result<Option<f32>, ReplicaError> {
        if Some(call) == self.hang_at {
            // Stuck, like a device call that never returns, until the test lets it go.
            let release = self.release.as_ref().ok_or("no release channel")?;
            release
                .recv_timeout(LIMIT)
                .map_err(|_| "the hung replica was never released")?;
        } else {
            std::thread::sleep(self.pause);
        }
        Ok(None)
    }
    fn read_gradients(&mut self, grad: &[f32; 2], read: &mut dyn FnMut(&[f32])) {
        let mut applied = self.applied.lock().unwrap();
        applied.push(*grad);
        read(grad);
    }
}

/// The tiny model of `common`, hanging when told to.
type Hanging = LeastSquares<Hang>;

/// The gradients applied, in order.
type Log = Arc<Mutex<Vec<[f32; 2]>>>;

/// What a training thread hands back: its result, the state it left, and the pool.
type Ended = (
    Result<TrainReport, TrainError>,
    TrainState,
    WorkerPool<Hanging>,
);

/// A pool of `workers`; worker `hung` (if any) blocks at its `at`-th gradient computation until
/// the returned sender sends.
fn hanging_pool(
    workers: usize,
    hung: Option<(usize, u64)>,
    pause: Duration,
) -> (WorkerPool<Hanging>, Sender<()>, Log) {
    let (release, released) = channel();
    let mut released = Some(released);
    let applied = Arc::new(Mutex::new(Vec::new()));
    let pool = common::pool(workers, |worker| {
        let hang_at = hung.filter(|&(w, _)| w == worker).map(|(_, at)| at);
        Hang {
            hang_at,
            release: hang_at.and_then(|_| released.take()),
            pause,
            applied: applied.clone(),
        }
    });
    (pool, release, applied)
}

/// Records what the watchdog tells it; asks to stop once a stall is reported (as a user who
/// sees the stall and presses Ctrl-C), and says when it is asked to abandon the run.
struct Watcher {
    stall_timeout: Option<Duration>,
    stop_grace: Duration,
    stop: AtomicBool,
    stalls: Mutex<Vec<Stall>>,
    /// When the first stall was reported, and so the stop asked for.
    stopped_at: Mutex<Option<Instant>>,
    abandons: Mutex<Vec<(Vec<Stall>, Option<TrainState>)>>,
    /// How long after the stop request the run was abandoned.
    abandoned_after: Mutex<Option<Duration>>,
    abandoned: Mutex<Sender<()>>,
}

impl Watcher {
    fn new(stall_timeout: Option<Duration>, stop_grace: Duration) -> (Arc<Self>, Receiver<()>) {
        let (abandoned, on_abandon) = channel();
        let watcher = Self {
            stall_timeout,
            stop_grace,
            stop: AtomicBool::new(false),
            stalls: Mutex::new(Vec::new()),
            stopped_at: Mutex::new(None),
            abandons: Mutex::new(Vec::new()),
            abandoned_after: Mutex::new(None),
            abandoned: Mutex::new(abandoned),
        };
        (Arc::new(watcher), on_abandon)
    }
}

impl Observer for Watcher {
    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
    fn stall_timeout(&self) -> Option<Duration> {
        self.stall_timeout
    }
    fn on_stall(&self, stall: &Stall) {
        self.stalls.lock().unwrap().push(stall.clone());
        self.stopped_at
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now);
        self.stop.store(true, Ordering::SeqCst);
    }
    fn on_abandon(&self, stalled: &[Stall], state: Option<&TrainState>) {
        self.abandons
            .lock()
            .unwrap()
            .push((stalled.to_vec(), state.cloned()));
        *self.abandoned_after.lock().unwrap() =
            self.stopped_at.lock().unwrap().map(|t| t.elapsed());
        let _ = self.abandoned.lock().unwrap().send(());
    }
    fn stop_grace(&self) -> Duration {
        self.stop_grace
    }
}

type Train = fn(
    &mut WorkerPool<Hanging>,
    &mut TrainState,
    &Sgd,
    &Batches,
    u64,
    &dyn Observer,
) -> Result<TrainReport, TrainError>;

/// Starts `train` on a thread of its own; its result comes back on the channel, with the pool.
fn start(
    train: Train,
    mut pool: WorkerPool<Hanging>,
    end_step: u64,
    observer: Arc<Watcher>,
) -> Receiver<Ended> {
    let (done, result) = channel();
    std::thread::spawn(move || {
        let mut state = TrainState::new(vec![0.0; 2], &sgd());
        let report = train(
            &mut pool,
            &mut state,
            &sgd(),
            &batches(),
            end_step,
            &*observer,
        );
        let _ = done.send((report, state, pool));
    });
    result
}

/// Starts `train` on 2 workers, worker 1 hung in its `hang_at`-th gradient computation and
/// healthy ones pausing `pause` in each, under a watcher that stops the run on a stall of
/// 200 ms and is to abandon it 300 ms later; returns once it has, with the run's result to
/// come, the hung worker's release, the log of applied gradients and the watcher.
fn abandoned(
    train: Train,
    hang_at: u64,
    pause: Duration,
) -> (Receiver<Ended>, Sender<()>, Log, Arc<Watcher>) {
    let (pool, release, applied) = hanging_pool(2, Some((1, hang_at)), pause);
    let (watcher, abandoned) =
        Watcher::new(Some(Duration::from_millis(200)), Duration::from_millis(300));
    let result = start(train, pool, 1_000_000, watcher.clone());
    abandoned
        .recv_timeout(LIMIT)
        .expect("on_abandon was never called: the run hangs for good");
    // The run gets its grace after the stop request before it is given up (a lower bound: a
    // slow machine only makes it longer).
    let after = watcher
        .abandoned_after
        .lock()
        .unwrap()
        .expect("a stop was asked for");
    assert!(
        after >= watcher.stop_grace,
        "abandoned {after:?} after the stop"
    );
    (result, release, applied, watcher)
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn sync_hang_is_reported_and_abandoned_with_the_last_completed_step() {
    // Worker 1 hangs in its 5th gradient computation: global step 5.
    let (result, release, _, watcher) = abandoned(sync_train, 5, Duration::ZERO);
    release.send(()).expect("the hung replica is gone");
    let (report, state, _) = result
        .recv_timeout(LIMIT)
        .expect("the run did not end once released");

    let stalls = watcher.stalls.lock().unwrap().clone();
    assert_eq!(stalls.len(), 1, "only the hung worker stalls: {stalls:?}");
    let stall = &stalls[0];
    assert_eq!(
        (stall.worker, stall.device, stall.step),
        (1, Device::Cpu { worker: 1 }, Some(5))
    );
    assert!(stall.idle >= Duration::from_millis(200), "{stall:?}");

    let abandons = watcher.abandons.lock().unwrap().clone();
    assert_eq!(abandons.len(), 1, "abandoned once");
    let (stalled, abandon_state) = &abandons[0];
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    assert_eq!((stalled[0].worker, stalled[0].step), (1, Some(5)));
    let abandon_state = abandon_state.as_ref().expect("a consistent state");

    // What an uninterrupted 4-step run gives, bit for bit.
    let (mut healthy, _, _) = hanging_pool(2, None, Duration::ZERO);
    let mut reference = TrainState::new(vec![0.0; 2], &sgd());
    sync_train(
        &mut healthy,
        &mut reference,
        &sgd(),
        &batches(),
        4,
        &tandem_strategy::NoObserver,
    )
    .unwrap();
    assert_eq!(abandon_state.step, 4);
    assert_eq!(bits(&abandon_state.params), bits(&reference.params));
    assert_eq!(bits(ema(abandon_state)), bits(ema(&reference)));

    // Released, the hung worker finishes step 5, and the stop ends the run after it.
    let report = report.unwrap();
    assert!(report.stopped);
    assert_eq!((report.steps, state.step), (5, 5));
}

#[test]
fn async_hang_is_reported_and_abandoned_with_every_applied_update() {
    // Worker 1 hangs in its 3rd gradient computation; worker 0 goes on until the stop.
    let (result, release, applied, watcher) = abandoned(async_train, 3, Duration::from_micros(200));
    // Worker 0 stopped before the abandon, and worker 1 is stuck: the log is complete.
    let applied_at_abandon = applied.lock().unwrap().clone();
    release.send(()).expect("the hung replica is gone");
    let (report, state, _) = result
        .recv_timeout(LIMIT)
        .expect("the run did not end once released");

    let stalls = watcher.stalls.lock().unwrap().clone();
    assert!(!stalls.is_empty());
    assert!(
        stalls.iter().all(|s| s.worker == 1),
        "only the hung worker stalls: {stalls:?}"
    );
    assert_eq!(stalls[0].device, Device::Cpu { worker: 1 });
    assert!(stalls[0].step.is_some(), "{stalls:?}");

    let abandons = watcher.abandons.lock().unwrap().clone();
    assert_eq!(abandons.len(), 1, "abandoned once");
    let (stalled, abandon_state) = &abandons[0];
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    assert_eq!(stalled[0].worker, 1);
    let abandon_state = abandon_state.as_ref().expect("a consistent state");
    assert_eq!(abandon_state.step, applied_at_abandon.len() as u64);

    // Replay the updates in the order they were applied: parameters and moving average match
    // bit for bit, so the state holds each of them whole and none other.
    let sgd = sgd();
    let epochs = Epochs::new(EXAMPLES, batches().batch_size as u64);
    let (mut params, mut average) = (vec![0.0f32; 2], vec![0.0f32; 2]);
    for (step, grad) in applied_at_abandon.iter().enumerate() {
        let step = step as u64;
        let update = UpdateStep {
            learning_rate: sgd.learning_rate(epochs.epoch_at(step)),
            weight_decay: sgd.weight_decay,
            ema_decay: sgd.ema_decay(step),
        };
        sgd_ema_update(&mut params, &mut average, &[grad.as_slice()], update);
    }
    assert_eq!(bits(&abandon_state.params), bits(&params));
    assert_eq!(bits(ema(abandon_state)), bits(&average));

    // Released, the hung worker applies its update and stops.
    let report = report.unwrap();
    assert!(report.stopped && report.failures.is_empty(), "{report:?}");
    assert_eq!(state.step, abandon_state.step + 1);
}

#[test]
fn a_healthy_run_is_never_reported_as_stalled() {
    for train in [sync_train as Train, async_train] {
        let (pool, _release, _) = hanging_pool(2, None, Duration::from_micros(100));
        let (watcher, _abandoned) = Watcher::new(Some(Duration::from_secs(30)), LIMIT);
        let (report, state, _) = start(train, pool, 300, watcher.clone())
            .recv_timeout(LIMIT)
            .expect("the run did not end");
        report.unwrap();
        assert_eq!(state.step, 300);
        assert!(watcher.stalls.lock().unwrap().is_empty());
        assert!(watcher.abandons.lock().unwrap().is_empty());
    }
}

#[test]
fn a_healthy_run_that_is_asked_to_stop_is_not_abandoned() {
    for train in [sync_train as Train, async_train] {
        let (pool, _release, _) = hanging_pool(2, None, Duration::from_micros(100));
        let (watcher, _abandoned) = Watcher::new(None, LIMIT);
        watcher.stop.store(true, Ordering::SeqCst);
        let (report, _, _) = start(train, pool, 1_000_000, watcher.clone())
            .recv_timeout(LIMIT)
            .expect("the run did not end");
        assert!(report.unwrap().stopped);
        assert!(watcher.abandons.lock().unwrap().is_empty());
    }
}

/// A rank as a process stopped at `until` looks to the others: its messages get through, but
/// its signs of life ([`Channel::Beacon`]) stop then.
#[derive(Debug)]
struct Silent<'r>(&'r dyn Ranks, Instant);

impl Collectives for Silent<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn ranks(&self) -> usize {
        self.0.ranks()
    }
    fn open_lanes(&self, lanes: usize) {
        self.0.open_lanes(lanes)
    }
    fn all_to_all(
        &self,
        lane: usize,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) {
        self.0
            .all_to_all(lane, send, send_counts, recv, recv_counts)
    }
    fn all_gather(&self, lane: usize, mine: &[f32], all: &mut [f32], counts: &[usize]) {
        self.0.all_gather(lane, mine, all, counts)
    }
    fn all_to_all_half(
        &self,
        lane: usize,
        send: &[u16],
        send_counts: &[usize],
        recv: &mut [u16],
        recv_counts: &[usize],
    ) {
        self.0
            .all_to_all_half(lane, send, send_counts, recv, recv_counts)
    }
    fn all_gather_half(&self, lane: usize, mine: &[u16], all: &mut [u16], counts: &[usize]) {
        self.0.all_gather_half(lane, mine, all, counts)
    }
    fn sent_bytes(&self) -> u64 {
        self.0.sent_bytes()
    }
    fn all_sum(&self, lane: usize, values: &mut [f64]) {
        self.0.all_sum(lane, values)
    }
    fn all_max(&self, lane: usize, values: &mut [u64]) {
        self.0.all_max(lane, values)
    }
    fn broadcast(&self, bytes: &mut Vec<u8>) {
        self.0.broadcast(bytes)
    }
    fn abort(&self, code: i32) -> ! {
        self.0.abort(code)
    }
}

impl Messages for Silent<'_> {
    fn send(&self, channel: Channel, to: usize, tag: u16, header: &[u64], payload: &[f32]) {
        if channel != Channel::Beacon || Instant::now() < self.1 {
            self.0.send(channel, to, tag, header, payload)
        }
    }
    fn poll(&self, channel: Channel) -> Option<(usize, u16)> {
        self.0.poll(channel)
    }
    fn receive(
        &self,
        channel: Channel,
        from: usize,
        tag: u16,
        header: &mut Vec<u64>,
        payload: &mut Vec<f32>,
    ) {
        self.0.receive(channel, from, tag, header, payload)
    }
}

/// Records the stalls it is told of, and releases a hung worker at the first.
struct ReleaseOnStall {
    stalls: Mutex<Vec<Stall>>,
    release: Mutex<Sender<()>>,
}

impl Observer for ReleaseOnStall {
    fn stall_timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(6))
    }
    fn on_stall(&self, stall: &Stall) {
        self.stalls.lock().unwrap().push(stall.clone());
        let _ = self.release.lock().unwrap().send(());
    }
}

/// Three ranks; rank 1 stops as a process would (its worker hung at its third step, its signs
/// of life ending 2.5 s in): rank 0's stall report names rank 1, at the step it stopped in,
/// and not rank 2, which waits for it too but is alive. Released, the run ends as any other.
#[test]
fn rank_0_names_the_rank_that_gives_no_sign_of_life_in_its_stall_report() {
    let pools: Vec<_> = (0..3)
        .map(|rank| hanging_pool(1, (rank == 1).then_some((0, 3)), Duration::ZERO))
        .collect();
    let watcher = Arc::new(ReleaseOnStall {
        stalls: Mutex::new(Vec::new()),
        release: Mutex::new(pools[1].1.clone()),
    });
    let pools: Vec<Mutex<Option<WorkerPool<Hanging>>>> = pools
        .into_iter()
        .map(|(pool, ..)| Mutex::new(Some(pool)))
        .collect();
    let observer = watcher.clone();
    let (done, result) = channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let states = common::across(3, |rank| {
            let mut pool = pools[rank.rank()].lock().unwrap().take().unwrap();
            let silent = Silent(rank, started + Duration::from_millis(2500));
            let (ranks, observer): (&dyn Ranks, &dyn Observer) = match rank.rank() {
                0 => (rank, &*observer),
                1 => (&silent, &NoObserver),
                _ => (rank, &NoObserver),
            };
            let mut state = TrainState::new(vec![0.0; 2], &sgd());
            train_across(
                Transport::Ranks(ranks),
                Mode::Sync,
                &mut pool,
                &mut state,
                &sgd(),
                &batches(),
                6,
                observer,
            )
            .expect("the run ends once released");
            state
        });
        let _ = done.send(states);
    });
    let states = result.recv_timeout(LIMIT).expect("the run ends");
    assert!(states.iter().all(|s| *s == states[0] && s.step == 6));
    let stalls = watcher.stalls.lock().unwrap();
    let silent = &stalls
        .first()
        .expect("rank 0 reported a stall")
        .silent_ranks;
    assert_eq!(silent.len(), 1, "{stalls:?}");
    assert_eq!(silent[0].rank, 1, "{silent:?}");
    // Rank 1 stopped in the step rank 0 waits in.
    assert!(stalls[0].step.is_some());
    assert_eq!(silent[0].step, stalls[0].step, "{stalls:?}");
    assert!(silent[0].silence >= Duration::from_secs(3), "{silent:?}");
}

/// Asks to stop from the start and counts the times it is asked to abandon the run; keeps the
/// default grace, as `mnist-train`'s observer does.
#[derive(Default)]
struct StopsAtOnce {
    abandons: Mutex<usize>,
}

impl Observer for StopsAtOnce {
    fn should_stop(&self) -> bool {
        true
    }
    fn on_abandon(&self, _: &[Stall], _: Option<&TrainState>) {
        *self.abandons.lock().unwrap() += 1;
    }
}

/// A stop waits for a step that takes a while: a step of 300 ms is well within the default
/// grace (10 s), so a run asked to stop ends after the step it is in, and is never abandoned
/// (which, in `mnist-train`, would end the process).
#[test]
fn a_stop_waits_out_a_slow_step_within_the_default_grace() {
    let (report, abandons) = common::within("a stopped run", || {
        let (mut pool, _release, _) = hanging_pool(1, None, Duration::from_millis(300));
        let observer = StopsAtOnce::default();
        let mut state = TrainState::new(vec![0.0; 2], &sgd());
        let report = sync_train(&mut pool, &mut state, &sgd(), &batches(), 100, &observer);
        (
            report
                .map(|r| (r.stopped, r.steps))
                .map_err(|e| e.to_string()),
            observer.abandons,
        )
    });
    assert_eq!(report, Ok((true, 1)));
    assert_eq!(
        abandons.into_inner().unwrap(),
        0,
        "abandoned within the default grace"
    );
}
