//! Classifiers written once against [`tandem_tensor::Backend`], so that the same code runs on
//! the CPU and on CUDA, and trains with any data-parallel strategy.
//!
//! * [`Network`]: the model seam. A model states its parameters, its activations and its
//!   forward and backward pass; initialisation, evaluation, predictions and probabilities
//!   come with the trait.
//! * [`layers`]: what models are composed of, each layer with its forward and backward pass
//!   (a dense layer with its bias and optional ReLU fused into one product, a stack of them,
//!   whose last product may be fused with the softmax cross-entropy loss).
//! * [`NetworkReplica`]: one copy of any network on one backend, implementing
//!   [`tandem_core::Replica`]; [`open_replica`] opens one on a `tandem_pool::Device`.
//! * [`Mlp`]: the multi-layer perceptron of the TensorFlow multi-GPU MNIST example's
//!   `mnist_inference.py` (784-500-10), of any depth.
//! * [`Confusion`]: a classifier's confusion matrix on a labelled set, as text with recall and
//!   precision.
//!
//! ```
//! use rand::SeedableRng;
//! use tandem_model::{Mlp, MlpReplica, Network};
//! use tandem_core::{Replica, StepLoss};
//! use tandem_tensor::{CpuBackend, ExampleSet};
//!
//! let mlp = Mlp::new(4, &[8], 3).unwrap();
//! let examples = ExampleSet::new(4, vec![0, 255, 10, 3, 200, 1, 0, 0], vec![2, 0]).unwrap();
//! let params = mlp.init(0.1, &mut rand::rngs::StdRng::seed_from_u64(1));
//! let mut replica = MlpReplica::new(mlp.clone(), CpuBackend, &examples, 2).unwrap();
//! replica.set_params(&mut |p| p.copy_from_slice(&params)).unwrap();
//! // On the CPU the loss is known at once (a device replica leaves it there: `take_losses`).
//! let StepLoss::Known(loss) = replica.compute_gradients(&[0, 1]).unwrap() else { panic!() };
//! assert!(loss > 0.0 && loss.is_finite());
//! let accuracy = mlp.evaluate(&CpuBackend, &params, &examples).unwrap();
//! assert!((0.0..=1.0).contains(&accuracy));
//! ```
#![warn(missing_docs)]

mod confusion;
pub mod layers;
mod mlp;
mod network;
mod replica;

pub use confusion::Confusion;
pub use mlp::{Mlp, MlpError, MAX_HIDDEN_LAYERS, MAX_PARAMS, MAX_WIDTH};
pub use network::Network;
pub use replica::{open_replica, MlpReplica, NetworkReplica};
