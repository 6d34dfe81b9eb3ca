//! What a model, an optimiser and a data-parallel training strategy agree on, and nothing
//! else: the parameter layout ([`ParamSpan`]), the [`Replica`] trait a model implements to be
//! trained, the [`Optimizer`] trait that turns gradients into updates, and the [`TrainState`] a
//! strategy reads and leaves behind (parameters and the optimiser's named state).
//!
//! Threads appear only as [`Helpers`], idle workers a replica may hand tasks to.
//!
//! The crate knows no thread pools or CUDA: a model crate depends on it (and on its tensor layer)
//! without pulling in a worker pool, and a strategy drives any model through it. Device memory
//! appears only as addresses and the [`DeviceQueue`] trait a device backend implements, so that
//! a store can keep the parameters of record beside replicas that compute on a device.
//!
//! ```
//! use tandem_core::{Optimizer, ParamSpan, Piece, Replica, ReplicaError, StepLoss, TrainState};
//!
//! /// Plain gradient descent, no state.
//! struct Descent;
//! impl Optimizer for Descent {
//!     fn state_names(&self) -> &[&'static str] { &[] }
//!     fn initial_state(&self, _: &str, _: &[f32]) -> Vec<f32> { Vec::new() }
//!     fn update(&self, piece: Piece<'_, '_>, _step: u64, _epoch: f64) {
//!         let n = piece.grads.len() as f32;
//!         for (i, p) in piece.params.iter_mut().enumerate() {
//!             *p -= 0.1 * piece.grads.iter().map(|g| g[i]).sum::<f32>() / n;
//!         }
//!     }
//!     fn learning_rate(&self, _: f64) -> f32 { 0.1 }
//! }
//!
//! /// y = w . x on a data set where example i is x = i, fitted to y = 3x.
//! struct Scalar { layout: Vec<ParamSpan>, w: f32, grad: f32 }
//! impl Replica for Scalar {
//!     fn layout(&self) -> &[ParamSpan] { &self.layout }
//!     fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
//!         let mut p = [0.0]; fill(&mut p); self.w = p[0]; Ok(())
//!     }
//!     fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError> {
//!         let n = batch.len() as f32;
//!         let (mut loss, mut grad) = (0.0, 0.0);
//!         for &i in batch {
//!             let err = (self.w - 3.0) * i as f32;
//!             loss += 0.5 * err * err / n;
//!             grad += err * i as f32 / n;
//!         }
//!         self.grad = grad;
//!         Ok(StepLoss::Known(loss))
//!     }
//!     fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
//!         read(&[self.grad]); Ok(())
//!     }
//!     fn training_examples(&self) -> usize { 4 }
//! }
//!
//! let layout = vec![ParamSpan { name: "w".into(), shape: vec![1], weight_decay: false }];
//! let state = TrainState::new(vec![1.0], &Descent);
//! let mut replica = Scalar { layout, w: 0.0, grad: 0.0 };
//! replica.set_params(&mut |p| p.copy_from_slice(&state.params)).unwrap();
//! // (1 - 3) * 2 at x = 2: loss 8, gradient -8.
//! assert_eq!(replica.compute_gradients(&[2]).unwrap(), StepLoss::Known(8.0));
//! replica.read_gradients(&mut |g| assert_eq!(g, [-8.0])).unwrap();
//! let mut w = [1.0];
//! Descent.update(Piece { params: &mut w, state: &mut [], grads: &[&[-8.0]], weight_decay: false, rate_scale: 1.0 }, 0, 0.0);
//! assert_eq!(w, [1.8]);
//! ```
#![warn(missing_docs)]

mod device;
mod dtype;
mod helpers;
mod optimizer;
mod precision;
mod replica;
mod state;

pub use device::{
    f64_of_slots, slots_of_f64, DeviceAlloc, DeviceEvent, DeviceOp, DeviceQueue, DeviceUpdate,
    Residence, RoundedCopy, StepLoss, MAX_HYPER,
};
pub use dtype::{DType, UnknownDType};
pub use helpers::{Alone, Helpers};
pub use optimizer::{Optimizer, Piece};
pub use precision::{check_loss_scale, BadLossScale, LossScaler, NonFiniteGradients, Precision};
pub use replica::{ParamSpan, Replica, ReplicaError};
pub use state::{Slot, TrainState};
