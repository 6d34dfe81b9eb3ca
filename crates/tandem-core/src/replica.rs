use crate::{DType, Helpers, LossScaler, Residence, StepLoss};

/// A named, contiguous span of a model's flat parameter vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpan {
    /// The parameter's name, e.g. `"layer1/weights"`.
    pub name: String,
    /// Its shape, outermost dimension first.
    pub shape: Vec<usize>,
    /// Whether L2 regularisation applies (weights yes, biases no).
    pub weight_decay: bool,
}

impl ParamSpan {
    /// The span `name` of `shape`, regularised when `weight_decay` says so.
    pub fn new(name: impl Into<String>, shape: impl Into<Vec<usize>>, weight_decay: bool) -> Self {
        Self {
            name: name.into(),
            shape: shape.into(),
            weight_decay,
        }
    }

    /// The number of parameters in the span.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A replica's failure, boxed so that any backend's error fits.
pub type ReplicaError = Box<dyn std::error::Error + Send + Sync>;

/// One copy of a model on one device, as a data-parallel strategy drives it.
///
/// Parameters and gradients cross this boundary as flat `f32` vectors laid out as
/// [`Replica::layout`] says, span after span. The optimiser step is not the replica's business:
/// the strategy owns the parameters of record and applies updates to them.
pub trait Replica: Send {
    /// The parameter spans, in the order of the flat vectors.
    fn layout(&self) -> &[ParamSpan];

    /// Called once on the worker's thread before anything else (a GPU replica makes its context
    /// current here).
    fn bind_thread(&mut self) -> Result<(), ReplicaError> {
        Ok(())
    }

    /// Replaces the replica's parameters: `fill` writes the whole flat vector.
    fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError>;

    /// Computes the gradients of the mean data loss over the examples `batch` (indices into the
    /// replica's training set) and returns that loss, or says that it stays on the device until
    /// [`take_losses`](Self::take_losses). Regularisation is the strategy's.
    fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError>;

    /// [`compute_gradients`](Self::compute_gradients) from `params` (the whole flat vector, in
    /// host memory) instead of the replica's own parameters, where the replica computes in host
    /// memory: a store whose workers all read the same parameters lends them to every replica
    /// instead of copying them into each. `None` (the default) where it cannot: then nothing
    /// was computed. The parameters are a `Vec`, not a slice, so that a backend whose buffers
    /// are `Vec`s computes from them as from its own. `helpers` may run some of the step's
    /// tasks (other workers, done with their own step, that would otherwise wait for this one).
    #[allow(clippy::ptr_arg)]
    fn compute_gradients_from(
        &mut self,
        params: &Vec<f32>,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<Option<StepLoss>, ReplicaError> {
        let _ = (params, batch, helpers);
        Ok(None)
    }

    /// Appends to `losses` the losses that [`compute_gradients`](Self::compute_gradients) left
    /// on the device since the last call, oldest first (waiting for the device). A replica
    /// whose losses are always [`StepLoss::Known`] has none.
    fn take_losses(&mut self, losses: &mut Vec<f32>) -> Result<(), ReplicaError> {
        let _ = losses;
        Ok(())
    }

    /// Where the replica's parameters and gradients live, when they are in device memory that
    /// a store may keep the parameters of record beside (`None`: only through
    /// [`set_params`](Self::set_params) and [`read_gradients`](Self::read_gradients), as for
    /// a replica whose gradients the host must see each step, e.g. to check a loss-scaled
    /// pass for overflow).
    fn residence(&self) -> Option<Residence> {
        None
    }

    /// Hands the gradients of the last [`Replica::compute_gradients`] to `read`, flat.
    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError>;

    /// Exchanges the replica's gradients of the last
    /// [`compute_gradients`](Self::compute_gradients) with `buffer` (of the same length), where
    /// they are host memory: the caller takes them without a copy, and the replica's next step
    /// overwrites what it received. `false` (the default) where it cannot; then `buffer` is
    /// unchanged and [`read_gradients`](Self::read_gradients) hands them out.
    fn exchange_gradients(&mut self, buffer: &mut Vec<f32>) -> Result<bool, ReplicaError> {
        let _ = buffer;
        Ok(false)
    }

    /// The number of training examples `batch` indices may address.
    fn training_examples(&self) -> usize;

    /// The loss scaler of a replica whose pass is loss-scaled (an `f16`
    /// [`Precision`](crate::Precision)): its scale now and the passes it threw away. `None` (the
    /// default) for a replica that does not scale.
    fn loss_scaling(&self) -> Option<LossScaler> {
        None
    }

    /// The type its pass computes in: [`set_params`](Self::set_params) rounds the parameters
    /// to it (`f32`, the default, keeps them as they are).
    fn dtype(&self) -> DType {
        DType::F32
    }
}

/// Lets a pool hold replicas of different backends side by side.
impl<R: Replica + ?Sized> Replica for Box<R> {
    fn layout(&self) -> &[ParamSpan] {
        (**self).layout()
    }

    fn bind_thread(&mut self) -> Result<(), ReplicaError> {
        (**self).bind_thread()
    }

    fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
        (**self).set_params(fill)
    }

    fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError> {
        (**self).compute_gradients(batch)
    }

    fn compute_gradients_from(
        &mut self,
        params: &Vec<f32>,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<Option<StepLoss>, ReplicaError> {
        (**self).compute_gradients_from(params, batch, helpers)
    }

    fn take_losses(&mut self, losses: &mut Vec<f32>) -> Result<(), ReplicaError> {
        (**self).take_losses(losses)
    }

    fn residence(&self) -> Option<Residence> {
        (**self).residence()
    }

    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
        (**self).read_gradients(read)
    }

    fn exchange_gradients(&mut self, buffer: &mut Vec<f32>) -> Result<bool, ReplicaError> {
        (**self).exchange_gradients(buffer)
    }

    fn training_examples(&self) -> usize {
        (**self).training_examples()
    }

    fn loss_scaling(&self) -> Option<LossScaler> {
        (**self).loss_scaling()
    }

    fn dtype(&self) -> DType {
        (**self).dtype()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Alone;

    /// Answers every call in a way of its own, unlike the trait's defaults.
    struct Marked {
        layout: Vec<ParamSpan>,
        params: Vec<f32>,
        grads: Vec<f32>,
    }

    impl Replica for Marked {
        fn layout(&self) -> &[ParamSpan] {
            &self.layout
        }
        fn bind_thread(&mut self) -> Result<(), ReplicaError> {
            Err("no device here".into())
        }
        fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
            fill(&mut self.params);
            Ok(())
        }
        fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError> {
            Ok(StepLoss::Known(batch.len() as f32))
        }
        fn compute_gradients_from(
            &mut self,
            params: &Vec<f32>,
            batch: &[u32],
            _: &dyn Helpers,
        ) -> Result<Option<StepLoss>, ReplicaError> {
            Ok(Some(StepLoss::Known(params[0] + batch.len() as f32)))
        }
        fn take_losses(&mut self, losses: &mut Vec<f32>) -> Result<(), ReplicaError> {
            losses.push(7.0);
            Ok(())
        }
        fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
            read(&self.grads);
            Ok(())
        }
        fn exchange_gradients(&mut self, buffer: &mut Vec<f32>) -> Result<bool, ReplicaError> {
            std::mem::swap(buffer, &mut self.grads);
            Ok(true)
        }
        fn training_examples(&self) -> usize {
            60_000
        }
        fn loss_scaling(&self) -> Option<LossScaler> {
            Some(LossScaler::new(1024.0))
        }
        fn dtype(&self) -> DType {
            DType::BF16
        }
    }

    /// Calls every method of `replica` and checks the answers are `Marked`'s.
    fn assert_marked(replica: &mut impl Replica) {
        assert_eq!(replica.layout()[0].name, "w");
        assert!(replica.bind_thread().is_err());
        replica.set_params(&mut |p| p.fill(3.0)).unwrap();
        assert_eq!(
            replica.compute_gradients(&[1, 2]).unwrap(),
            StepLoss::Known(2.0)
        );
        let from = replica.compute_gradients_from(&vec![0.5], &[1, 2, 3], &Alone);
        assert_eq!(from.unwrap(), Some(StepLoss::Known(3.5)));
        let mut losses = Vec::new();
        replica.take_losses(&mut losses).unwrap();
        assert_eq!(losses, [7.0]);
        let mut read = Vec::new();
        replica.read_gradients(&mut |g| read = g.to_vec()).unwrap();
        assert_eq!(read, [1.0, 2.0]);
        let mut buffer = vec![0.0; 2];
        assert!(replica.exchange_gradients(&mut buffer).unwrap());
        assert_eq!(buffer, [1.0, 2.0]);
        assert_eq!(replica.training_examples(), 60_000);
        assert_eq!(replica.loss_scaling().map(|s| s.scale()), Some(1024.0));
        assert_eq!(replica.dtype(), DType::BF16);
    }

    #[test]
    fn a_boxed_replica_is_the_replica() {
        let marked = || Marked {
            layout: vec![ParamSpan::new("w", [2, 3], true)],
            params: vec![0.0; 6],
            grads: vec![1.0, 2.0],
        };
        let mut boxed = Box::new(marked());
        assert_marked(&mut boxed);
        assert_eq!(boxed.params, [3.0; 6]);
        assert_marked(&mut marked());
    }

    /// Implements only what a replica must.
    struct Plain;

    impl Replica for Plain {
        fn layout(&self) -> &[ParamSpan] {
            &[]
        }
        fn set_params(&mut self, _: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
            Ok(())
        }
        fn compute_gradients(&mut self, _: &[u32]) -> Result<StepLoss, ReplicaError> {
            Ok(StepLoss::OnDevice)
        }
        fn read_gradients(&mut self, _: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
            Ok(())
        }
        fn training_examples(&self) -> usize {
            0
        }
    }

    #[test]
    fn the_defaults_are_a_host_replica_that_offers_nothing_more() {
        let mut plain = Plain;
        assert_eq!(
            plain
                .compute_gradients_from(&vec![1.0], &[0], &Alone)
                .unwrap(),
            None
        );
        assert!(plain.residence().is_none());
        let mut buffer = vec![4.0];
        assert!(!plain.exchange_gradients(&mut buffer).unwrap());
        assert_eq!(buffer, [4.0]);
        assert!(plain.loss_scaling().is_none());
        assert_eq!(plain.dtype(), DType::F32);
    }

    #[test]
    fn a_span_has_the_product_of_its_shape() {
        let span = ParamSpan::new("w", [784, 500], true);
        assert_eq!((span.len(), span.is_empty()), (392_000, false));
        let scalar = ParamSpan::new("s", [], false);
        assert_eq!((scalar.len(), scalar.is_empty()), (1, false));
        assert!(ParamSpan::new("none", [3, 0], false).is_empty());
    }
}
