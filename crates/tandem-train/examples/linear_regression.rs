//! A model tandem does not ship, trained through `tandem-train`: linear regression on a
//! synthetic data set. Both modes, each checkpointed half-way and resumed from there. CI runs
//! `cargo run -p tandem-train --example linear_regression`; it fails unless both modes find
//! the true weights.

use std::error::Error;
use std::path::Path;
use std::sync::LazyLock;

use tandem_core::{ParamSpan, Replica, ReplicaError, StepLoss, TrainState};
use tandem_optim::Sgd;
use tandem_pool::{Device, DeviceSpec};
use tandem_strategy::Batches;
use tandem_train::{
    AsyncRule, BatchScaling, Checkpoints, Fresh, Interrupt, Length, Mode, Model, ModelId,
    Precision, StalenessBound,
};
use tandem_train::{Resume, Setup, Start, Trainer, Warmup, Watch};

const EXAMPLES: usize = 2_000;
/// The weights and bias that generate the targets, and that training must find.
const TRUE: [f32; 4] = [1.5, -2.0, 0.5, 0.25];

/// Example `i`: three deterministic features and the target they give.
fn example(i: u32) -> ([f32; 3], f32) {
    let t = i as f32;
    let x = [(0.37 * t).sin(), (1.13 * t).cos(), (0.29 * t).cos()];
    let y = TRUE[3] + (0..3).map(|k| TRUE[k] * x[k]).sum::<f32>();
    (x, y)
}

/// The parameters: three weights (regularised) and a bias.
static LAYOUT: LazyLock<Vec<ParamSpan>> = LazyLock::new(|| {
    vec![
        ParamSpan::new("w", [3], true),
        ParamSpan::new("b", [1], false),
    ]
});

/// One replica: the parameters `[w0, w1, w2, b]` and the gradients of its last batch.
#[derive(Default)]
struct Linear {
    params: [f32; 4],
    grads: [f32; 4],
}

impl Replica for Linear {
    fn layout(&self) -> &[ParamSpan] {
        &LAYOUT
    }
    fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
        fill(&mut self.params);
        Ok(())
    }
    /// Mean of `(w . x + b - y)^2 / 2` over the batch.
    fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError> {
        let (n, mut loss) = (batch.len() as f32, 0.0);
        self.grads = [0.0; 4];
        for &i in batch {
            let (x, y) = example(i);
            let error = self.params[3] + (0..3).map(|k| self.params[k] * x[k]).sum::<f32>() - y;
            loss += error * error / (2.0 * n);
            for (g, input) in self.grads.iter_mut().zip([x[0], x[1], x[2], 1.0]) {
                *g += error * input / n;
            }
        }
        Ok(StepLoss::Known(loss))
    }
    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
        read(&self.grads);
        Ok(())
    }
    fn training_examples(&self) -> usize {
        EXAMPLES
    }
}

struct LinearModel;

impl Model for LinearModel {
    type Replica = Linear;
    fn id(&self) -> ModelId {
        ModelId::new("linear-example-v1", "3-1")
    }
    fn layout(&self) -> Vec<ParamSpan> {
        LAYOUT.clone()
    }
    fn training_examples(&self) -> usize {
        EXAMPLES
    }
    fn open(&self, _: &Device, _: usize, precision: Precision) -> Result<Linear, ReplicaError> {
        // Its gradients are computed in f32 only.
        match precision == Precision::F32 {
            true => Ok(Linear::default()),
            false => Err(format!("the linear model computes in f32, not {precision}").into()),
        }
    }
}

/// Trains `start` on two CPU workers with checkpoints in `dir`; returns the final state and
/// whether it resumed from a checkpoint.
fn train(start: Start<Sgd>, dir: &Path) -> Result<(TrainState, bool), Box<dyn Error>> {
    let resume = matches!(start, Start::Resume(_)).then_some(dir);
    let checkpoints = Checkpoints::take(Some(dir), resume, 2)?;
    let setup = Setup::new(DeviceSpec::Cpu(2));
    let mut trainer = Trainer::open(LinearModel, start, &setup, checkpoints)?;
    let interrupt = Interrupt::new();
    trainer.train(&trainer.plan(0), &Watch::quiet(&interrupt), &mut |_| Ok(()))?;
    let resumed = trainer.resumed_from().is_some();
    Ok((trainer.state, resumed))
}

fn main() -> Result<(), Box<dyn Error>> {
    let root = tempfile::tempdir()?;
    for mode in [Mode::Sync, Mode::Async] {
        let dir = root.path().join(mode.name());
        let optimizer = Sgd {
            learning_rate: 0.5,
            weight_decay: 0.0,
            ..Sgd::DEFAULT
        };
        let batches = Batches {
            batch_size: 20,
            seed: 7,
        };
        let (length, save_every, params) = (Length::Steps(300), Some(100), vec![0.0; 4]);
        let fresh = Fresh {
            mode,
            async_rule: AsyncRule::DEFAULT,
            async_warmup: Warmup::Auto,
            async_bound: StalenessBound::Unbounded,
            lr_scaling: BatchScaling::Auto,
            optimizer,
            batches,
            length,
            save_every,
            params,
            precision: Precision::F32,
            exchange: tandem_train::Exchange::F32,
        };
        train(Start::Fresh(fresh), &dir)?;
        let resume = Resume {
            length: Some(Length::Steps(600)),
            ..Resume::from(&dir)
        };
        let (state, resumed) = train(Start::Resume(resume), &dir)?;
        let errors = state.params.iter().zip(TRUE).map(|(p, t)| (p - t).abs());
        let error = errors.fold(0.0, f32::max);
        let name = mode.name();
        println!(
            "{name}: step {}, resumed: {resumed}, largest error {error:.5}",
            state.step
        );
        if state.step != 600 || !resumed || error > 1e-3 {
            return Err(format!("{name} did not train as expected").into());
        }
    }
    Ok(())
}
