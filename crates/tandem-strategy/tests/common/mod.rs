//! What the strategy tests share: replicas of tiny models (the strategies know nothing of
//! MNIST), among them a least-squares fit that each test gives its own faults, hangs or logs; a
//! deadline for runs that could hang (`tandem_testkit::within`).
#![allow(dead_code)] // each test binary uses its own part of this module

pub mod fake_device;
pub use tandem_collectives::threads as ranks;

use tandem_core::{Alone, Helpers, ParamSpan, Replica, ReplicaError, StepLoss, TrainState};
use tandem_optim::Sgd;
use tandem_pool::{Device, WorkerPool};
use tandem_strategy::Batches;

#[allow(unused_imports)] // each test binary uses its own part of this module
pub use tandem_testkit::{within, DEADLINE};

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

/// What a gradient computation answers: the loss, or why it failed.
pub type Loss = Result<f32, ReplicaError>;

/// What a test's model computes, in a [`TestReplica`].
pub trait Model: Send {
    /// The replica's `call`-th gradient computation (counted from 1), at `params`: writes the
    /// gradients of `batch` into `grads` (or leaves the last ones there) and returns the loss.
    fn gradients(&mut self, call: u64, batch: &[u32], params: &[f32], grads: &mut [f32]) -> Loss;

    /// [`gradients`](Self::gradients) where `helpers` (the other workers) may take part: what
    /// a replica computing from lent parameters is given.
    fn gradients_helped(
        &mut self,
        call: u64,
        batch: &[u32],
        params: &[f32],
        grads: &mut [f32],
        helpers: &dyn Helpers,
    ) -> Loss {
        let _ = helpers;
        self.gradients(call, batch, params, grads)
    }

    /// Hands the gradients to `read`, the strategy reading them.
    fn read_gradients(&mut self, grads: &[f32], read: &mut dyn FnMut(&[f32])) {
        read(grads);
    }
}

/// A replica that keeps the parameters the strategy sets and the gradients its model computes.
pub struct TestReplica<M> {
    layout: Vec<ParamSpan>,
    params: Vec<f32>,
    grads: Vec<f32>,
    examples: usize,
    /// How many gradient computations were started.
    pub calls: u64,
    /// Whether it computes from parameters a store lends it
    /// ([`Replica::compute_gradients_from`]), as a replica in host memory does, rather than
    /// only from its own copy.
    pub borrows: bool,
    /// Whether its gradients are host memory that a store may take in exchange for a buffer of
    /// its own ([`Replica::exchange_gradients`]), as a replica in host memory's are. Its model
    /// must then write every gradient every step.
    pub exchanges: bool,
    /// How many times its parameters were set (copied into it).
    pub loads: u64,
    /// The type it computes in: `set_params` rounds the parameters to it.
    pub dtype: tandem_core::DType,
    /// Its parameters and gradients in a fake device's memory, where a store may keep the
    /// parameters of record beside them ([`Replica::residence`]); `None`: host memory only.
    pub device: Option<fake_device::Resident>,
    pub model: M,
}

impl<M: Model> TestReplica<M> {
    fn compute_with(
        &mut self,
        lent: Option<&[f32]>,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<f32, ReplicaError> {
        self.calls += 1;
        let Self {
            params,
            grads,
            model,
            calls,
            ..
        } = self;
        if let Some(device) = &self.device {
            return device.step(params, grads, |p, g| model.gradients(*calls, batch, p, g));
        }
        let params = lent.unwrap_or(params);
        model.gradients_helped(*calls, batch, params, grads, helpers)
    }
}

impl<M: Model> Replica for TestReplica<M> {
    fn layout(&self) -> &[ParamSpan] {
        &self.layout
    }
    fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
        self.loads += 1;
        fill(&mut self.params);
        tandem_tensor::round_to(self.dtype, &mut self.params);
        if let Some(device) = &self.device {
            device.write_params(&self.params);
        }
        Ok(())
    }
    fn residence(&self) -> Option<tandem_core::Residence> {
        self.device.as_ref().map(fake_device::Resident::residence)
    }
    fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError> {
        self.compute_with(None, batch, &Alone).map(StepLoss::Known)
    }
    fn compute_gradients_from(
        &mut self,
        params: &Vec<f32>,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<Option<StepLoss>, ReplicaError> {
        if !self.borrows {
            return Ok(None);
        }
        assert_eq!(
            params.len(),
            self.params.len(),
            "lent parameters of another model"
        );
        self.compute_with(Some(params), batch, helpers)
            .map(|loss| Some(StepLoss::Known(loss)))
    }
    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
        self.model.read_gradients(&self.grads, read);
        Ok(())
    }
    fn exchange_gradients(&mut self, buffer: &mut Vec<f32>) -> Result<bool, ReplicaError> {
        let exchanged = self.exchanges && buffer.len() == self.grads.len();
        if exchanged {
            std::mem::swap(buffer, &mut self.grads);
        }
        Ok(exchanged)
    }
    fn training_examples(&self) -> usize {
        self.examples
    }
    fn dtype(&self) -> tandem_core::DType {
        self.dtype
    }
}

/// A pool of `workers` CPU replicas with parameters of `layout` and `examples` training
/// examples, worker `w` with the model `model(w)`; parameters and gradients start at 0.
pub fn pool_of<M: Model>(
    workers: usize,
    layout: Vec<ParamSpan>,
    examples: usize,
    model: impl FnMut(usize) -> M,
) -> WorkerPool<TestReplica<M>> {
    let devices = (0..workers).map(|worker| Device::Cpu { worker }).collect();
    pool_on(devices, layout, examples, model)
}

/// [`pool_of`] on `devices`: CPU workers ([`Device::Cpu`]) or simulated ones ([`Device::Sim`]).
pub fn pool_on<M: Model>(
    devices: Vec<Device>,
    layout: Vec<ParamSpan>,
    examples: usize,
    mut model: impl FnMut(usize) -> M,
) -> WorkerPool<TestReplica<M>> {
    let len: usize = layout.iter().map(ParamSpan::len).sum();
    WorkerPool::new(devices, |d| {
        let (Device::Cpu { worker } | Device::Sim { worker }) = *d else {
            unreachable!("CPU or simulated devices only")
        };
        Ok::<_, ReplicaError>(TestReplica {
            layout: layout.clone(),
            params: vec![0.0; len],
            grads: vec![0.0; len],
            examples,
            calls: 0,
            borrows: false,
            exchanges: false,
            loads: 0,
            dtype: tandem_core::DType::F32,
            device: None,
            model: model(worker),
        })
    })
    .unwrap()
}

/// The number of training examples of the least-squares fit.
pub const EXAMPLES: usize = 70;

/// What a test adds to the least-squares fit.
pub trait Quirks: Send {
    /// Called at the start of the replica's `call`-th gradient computation (counted from 1):
    /// may wait, fail, or answer a loss of its own (`Some`) instead of computing the gradients.
    fn before_gradients(&mut self, call: u64) -> Result<Option<f32>, ReplicaError>;

    /// Hands the gradients to `read`, the strategy reading them.
    fn read_gradients(&mut self, grad: &[f32; 2], read: &mut dyn FnMut(&[f32])) {
        read(grad);
    }
}

/// Fits w to targets 2*x with loss 0.5 * (w.x - 2*x)^2 over x = (i % 7, 1), with the quirks of
/// a test.
pub struct LeastSquaresFit<Q> {
    pub quirks: Q,
}

/// A replica of the least-squares fit.
pub type LeastSquares<Q> = TestReplica<LeastSquaresFit<Q>>;

impl<Q: Quirks> Model for LeastSquaresFit<Q> {
    fn gradients(&mut self, call: u64, batch: &[u32], w: &[f32], grads: &mut [f32]) -> Loss {
        if let Some(loss) = self.quirks.before_gradients(call)? {
            return Ok(loss);
        }
        let n = batch.len() as f32;
        let (mut loss, mut grad) = (0.0, [0.0; 2]);
        for &i in batch {
            let x = [(i % 7) as f32 / 7.0, 1.0];
            let err = w[0] * x[0] + w[1] * x[1] - 2.0 * x[0];
            loss += 0.5 * err * err / n;
            grad[0] += err * x[0] / n;
            grad[1] += err / n;
        }
        grads.copy_from_slice(&grad);
        Ok(loss)
    }
    fn read_gradients(&mut self, grads: &[f32], read: &mut dyn FnMut(&[f32])) {
        let grad = grads.try_into().expect("the fit has two parameters");
        self.quirks.read_gradients(grad, read);
    }
}

/// A pool of `workers` least-squares replicas, worker `w` with the quirks `quirks(w)`.
pub fn pool<Q: Quirks>(
    workers: usize,
    quirks: impl FnMut(usize) -> Q,
) -> WorkerPool<LeastSquares<Q>> {
    pool_on_devices(
        (0..workers).map(|worker| Device::Cpu { worker }).collect(),
        quirks,
    )
}

/// [`pool`] of simulated workers ([`Device::Sim`]).
pub fn sim_pool<Q: Quirks>(
    workers: usize,
    quirks: impl FnMut(usize) -> Q,
) -> WorkerPool<LeastSquares<Q>> {
    pool_on_devices(
        (0..workers).map(|worker| Device::Sim { worker }).collect(),
        quirks,
    )
}

/// The least-squares fit's parameters: two, regularised.
pub fn least_squares_layout() -> Vec<ParamSpan> {
    vec![ParamSpan {
        name: "w".into(),
        shape: vec![2],
        weight_decay: true,
    }]
}

fn pool_on_devices<Q: Quirks>(
    devices: Vec<Device>,
    mut quirks: impl FnMut(usize) -> Q,
) -> WorkerPool<LeastSquares<Q>> {
    pool_on(devices, least_squares_layout(), EXAMPLES, |worker| {
        LeastSquaresFit {
            quirks: quirks(worker),
        }
    })
}

/// The least-squares fit's optimiser.
pub fn sgd() -> Sgd {
    Sgd {
        learning_rate: 0.5,
        ..Sgd::default()
    }
}

/// The least-squares fit's batches.
pub fn batches() -> Batches {
    Batches {
        batch_size: 10,
        ..Batches::default()
    }
}

/// The moving average of the parameters, [`Sgd::AVERAGE`]: a state trained by [`Sgd`] has it.
pub fn ema(state: &TrainState) -> &[f32] {
    state
        .slot(Sgd::AVERAGE)
        .expect("a state trained by Sgd holds its moving average")
}

/// [`tandem_strategy::train`] in sync mode, as a function the tests can pass around.
pub fn sync_train<R: Replica, O: tandem_core::Optimizer + ?Sized>(
    pool: &mut WorkerPool<R>,
    state: &mut TrainState,
    optimizer: &O,
    batches: &Batches,
    end_step: u64,
    observer: &dyn tandem_strategy::Observer,
) -> Result<tandem_strategy::TrainReport, tandem_strategy::TrainError> {
    let mode = tandem_strategy::Mode::Sync;
    tandem_strategy::train(mode, pool, state, optimizer, batches, end_step, observer)
}

/// Asynchronous training at the full learning rate for every update, every worker from the
/// start: the tests of the strategy's bookkeeping count exact steps and stale updates (the
/// rules and the warm-up have their own tests).
pub const PLAIN_ASYNC: tandem_strategy::Strategy = tandem_strategy::Strategy {
    mode: tandem_strategy::Mode::Async,
    rule: tandem_strategy::AsyncRule::Plain,
    warmup: tandem_strategy::Warmup::Epochs(0),
    bound: tandem_strategy::StalenessBound::Unbounded,
    batch_scaling: tandem_strategy::BatchScaling::Auto,
    exchange: tandem_strategy::Exchange::F32,
};

/// [`tandem_strategy::train`] in async mode with the [`PLAIN_ASYNC`] rule, as a function the
/// tests can pass around.
pub fn async_train<R: Replica, O: tandem_core::Optimizer + ?Sized>(
    pool: &mut WorkerPool<R>,
    state: &mut TrainState,
    optimizer: &O,
    batches: &Batches,
    end_step: u64,
    observer: &dyn tandem_strategy::Observer,
) -> Result<tandem_strategy::TrainReport, tandem_strategy::TrainError> {
    tandem_strategy::train(
        PLAIN_ASYNC,
        pool,
        state,
        optimizer,
        batches,
        end_step,
        observer,
    )
}

/// Runs `rank_run` on each of `ranks` ranks of a cluster of threads ([`ranks::cluster`]), as
/// `mpirun` would run a process per rank; returns each rank's result, in rank order.
pub fn across<T: Send>(ranks: usize, rank_run: impl Fn(&ranks::ThreadRank) -> T + Sync) -> Vec<T> {
    let cluster = ranks::cluster(ranks);
    std::thread::scope(|scope| {
        let running: Vec<_> = cluster
            .iter()
            .map(|rank| scope.spawn(|| rank_run(rank)))
            .collect();
        running
            .into_iter()
            .map(|r| r.join().expect("a rank panicked"))
            .collect()
    })
}
