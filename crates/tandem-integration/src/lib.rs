//! tandem's cross-layer tests, in `tests/`: what needs several layers at once (the model
//! trained by the strategies over the pool, on the CPU and, with the `cuda` feature, on the
//! GPU). Keeping them here lets every other crate dev-depend only on crates below it.
//!
//! - `training.rs`: sync runs on real MNIST (workers vs a larger batch, bitwise repeats,
//!   accuracy, stop-checkpoint-resume).
//! - `async_accuracy.rs`: asynchronous training's accuracy, in a test binary of its own.
//! - `model_gpu.rs` (feature `cuda`): the whole model and the sync strategy on the GPU against
//!   the CPU.
//!
//! The crate has no library code.
