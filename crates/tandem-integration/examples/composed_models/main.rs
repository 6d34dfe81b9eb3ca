//! Models composed from tandem-model's layer library, trained through tandem-train in both
//! modes on any devices: a 784-256-128-10 perceptron and a softmax classifier (`softmax.rs`),
//! on the real MNIST data. CI runs it on two CPU workers and, with `--features cuda`, on two
//! replicas of the driver stand-in's GPU:
//!
//! ```text
//! cargo run -p tandem-integration --example composed_models -- cpu:2 300 100
//! cargo run -p tandem-integration --features cuda --example composed_models -- cuda:0x2 24 16
//! ```
//!
//! Arguments: devices, steps, batch per worker. It fails unless every run learns: the loss of
//! its last logged steps below that of its first, and, after 200 steps or more, test accuracy
//! of the averaged parameters of at least 0.85.

mod softmax;

use std::error::Error;
use std::io::Write;

use rand::SeedableRng;
use tandem_core::{ParamSpan, Precision, Replica, ReplicaError};
use tandem_mnist::Mnist;
use tandem_model::{Mlp, Network};
use tandem_optim::Sgd;
use tandem_pool::{Device, DeviceSpec, GpuCount};
use tandem_strategy::Batches;
use tandem_tensor::{CpuBackend, ExampleSet};
use tandem_train::{
    AsyncRule, BatchScaling, Fresh, Interrupt, Length, Mode, Model, ModelId, Setup, StalenessBound,
    Start, Trainer, Warmup, Watch,
};

/// A network on a training set, as the trainer sees a model.
struct Composed<'data, N> {
    name: &'static str,
    network: N,
    train: &'data ExampleSet,
}

impl<N: Network> Model for Composed<'_, N> {
    type Replica = Box<dyn Replica>;
    fn id(&self) -> ModelId {
        ModelId::new("composed-models-example-v1", self.name)
    }
    fn layout(&self) -> Vec<ParamSpan> {
        self.network.layout()
    }
    fn training_examples(&self) -> usize {
        self.train.len()
    }
    fn open(
        &self,
        device: &Device,
        batch: usize,
        precision: Precision,
    ) -> Result<Box<dyn Replica>, ReplicaError> {
        tandem_model::open_replica(self.network.clone(), device, self.train, batch, precision)
    }
}

/// What a run is asked to do.
struct Run {
    devices: DeviceSpec,
    steps: u64,
    batch: usize,
    train: ExampleSet,
    test: ExampleSet,
}

/// The CUDA GPUs there are, in a build with the `cuda` feature.
fn gpus() -> GpuCount {
    #[cfg(feature = "cuda")]
    return GpuCount::Driver(tandem_kernels::device_count().map_err(tandem_pool::DriverError::new));
    #[cfg(not(feature = "cuda"))]
    GpuCount::NoCuda
}

/// Trains `network` in both modes and checks that each run learns.
fn train<N: Network>(name: &'static str, network: N, run: &Run) -> Result<(), Box<dyn Error>> {
    for mode in [Mode::Sync, Mode::Async] {
        let params = network.init(0.1, &mut rand_chacha::ChaCha8Rng::seed_from_u64(1));
        let fresh = Fresh {
            mode,
            async_rule: AsyncRule::DEFAULT,
            async_warmup: Warmup::Epochs(0),
            async_bound: StalenessBound::Unbounded,
            lr_scaling: BatchScaling::Auto,
            optimizer: Sgd {
                // Not 0.3: asynchronous updates of 16 examples at that rate made the loss jump
                // back to chance now and then, and 12 steps on the stand-in once ended above
                // where they began; at 0.1 every run measured fell from about 2.4 to 1.5.
                learning_rate: 0.1,
                ..Sgd::DEFAULT
            },
            batches: Batches {
                batch_size: run.batch,
                seed: 1,
            },
            length: Length::Steps(run.steps),
            save_every: None,
            params,
            precision: Precision::F32,
            exchange: tandem_train::Exchange::F32,
        };
        let model = Composed {
            name,
            network: network.clone(),
            train: &run.train,
        };
        let setup = Setup {
            gpus,
            ..Setup::new(run.devices.clone())
        };
        let mut trainer = Trainer::open(model, Start::Fresh(fresh), &setup, None)?;
        let interrupt = Interrupt::new();
        let watch = Watch {
            log_every: 1,
            ..Watch::quiet(&interrupt)
        };
        // The mean loss of each quarter of the run.
        let mut losses = Vec::new();
        let plan = trainer.plan((run.steps / 4).max(1));
        let summary = trainer.train(&plan, &watch, &mut |segment| {
            losses.extend(segment.mean_loss);
            Ok(())
        })?;
        let (first, last) = match (losses.first(), losses.last()) {
            (Some(&first), Some(&last)) => (first, last),
            _ => return Err(format!("{name}: no loss was reported").into()),
        };
        let averaged = trainer
            .state
            .slot(Sgd::AVERAGE)
            .ok_or("no moving average")?;
        let accuracy = network.evaluate(&CpuBackend, averaged, &run.test)?;
        // Not println!, which panics when stdout is closed (`| head -1`).
        writeln!(
            std::io::stdout(),
            "{name}, {}, {} [{}]: {} steps, loss {first:.3} -> {last:.3}, test accuracy \
             {accuracy:.4}, {:.0} examples/sec",
            mode.name(),
            run.devices,
            trainer.device_names().join(", "),
            trainer.state.step,
            summary.totals.examples as f64 / summary.totals.seconds.max(1e-9),
        )?;
        // A NaN loss learns nothing either.
        let learnt = last < first;
        if !learnt || (run.steps >= 200 && accuracy < 0.85) {
            return Err(format!("{name} did not learn in {} mode", mode.name()).into());
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let devices: DeviceSpec = args.next().as_deref().unwrap_or("cpu:2").parse()?;
    let steps: u64 = args.next().as_deref().unwrap_or("300").parse()?;
    let batch: usize = args.next().as_deref().unwrap_or("100").parse()?;
    let mnist = Mnist::load(&tandem_testkit::mnist_dir())?;
    let run = Run {
        devices,
        steps,
        batch,
        train: mnist
            .train
            .into_examples()
            .ok_or("the training split is malformed")?,
        test: mnist
            .test
            .into_examples()
            .ok_or("the test split is malformed")?,
    };
    // The models, one registration line each.
    train("784-256-128-10", Mlp::mnist_with(&[256, 128])?, &run)?;
    train(
        "softmax-784-10",
        softmax::SoftmaxClassifier::new(784, 10),
        &run,
    )?;
    Ok(())
}
