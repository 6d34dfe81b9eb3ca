use crate::Optimizer;

/// One named per-parameter state vector of the optimiser (e.g. the moving average, `"ema"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    /// The optimiser's name for it ([`Optimizer::state_names`]).
    pub name: String,
    /// As long as the parameters, in their layout.
    pub values: Vec<f32>,
}

/// Everything that defines where a training run stands: the parameters of record, the
/// optimiser's state beside them and the global step. Both strategies read it at the start of a
/// run and leave the final values in it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainState {
    /// The parameters, flat, in the replicas' layout.
    pub params: Vec<f32>,
    /// The optimiser's state, in the order of its [`Optimizer::state_names`].
    pub slots: Vec<Slot>,
    /// Updates applied so far.
    pub step: u64,
}

impl TrainState {
    /// A fresh run from `params`, with `optimizer`'s initial state.
    pub fn new(params: Vec<f32>, optimizer: &(impl Optimizer + ?Sized)) -> Self {
        let slots = optimizer
            .state_names()
            .iter()
            .map(|&name| Slot {
                name: name.to_string(),
                values: optimizer.initial_state(name, &params),
            })
            .collect();
        Self {
            params,
            slots,
            step: 0,
        }
    }

    /// The optimiser state vector `name`, if the state has one.
    pub fn slot(&self, name: &str) -> Option<&[f32]> {
        self.slots
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.values.as_slice())
    }

    /// The values evaluation reads: the state vector `optimizer` names for it
    /// ([`Optimizer::evaluated_slot`]), or the parameters where it names none; `None` where
    /// the named vector is missing (a state of another optimiser).
    pub fn evaluated(&self, optimizer: &(impl Optimizer + ?Sized)) -> Option<&[f32]> {
        match optimizer.evaluated_slot() {
            Some(name) => self.slot(name),
            None => Some(&self.params),
        }
    }

    /// Whether the state has exactly `optimizer`'s state vectors, in its order, each as long as
    /// the parameters.
    pub fn fits(&self, optimizer: &(impl Optimizer + ?Sized)) -> bool {
        let names = optimizer.state_names();
        self.slots.len() == names.len()
            && self
                .slots
                .iter()
                .zip(names)
                .all(|(slot, &name)| slot.name == name && slot.values.len() == self.params.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Piece;

    /// Keeps a running sum of the parameters' gradients beside them, starting at the parameters.
    struct Summing;
    impl Optimizer for Summing {
        fn state_names(&self) -> &[&'static str] {
            &["sum"]
        }
        fn initial_state(&self, _: &str, params: &[f32]) -> Vec<f32> {
            params.iter().map(|p| p * 10.0).collect()
        }
        fn update(&self, piece: Piece<'_, '_>, _: u64, _: f64) {
            for (s, g) in piece.state[0].iter_mut().zip(piece.grads[0]) {
                *s += g;
            }
        }
        fn learning_rate(&self, _: f64) -> f32 {
            1.0
        }
    }

    /// A velocity and an average of the parameters, which evaluation reads.
    struct Averaging;
    impl Optimizer for Averaging {
        fn state_names(&self) -> &[&'static str] {
            &["velocity", "average"]
        }
        fn initial_state(&self, name: &str, params: &[f32]) -> Vec<f32> {
            match name {
                "average" => params.to_vec(),
                _ => vec![0.0; params.len()],
            }
        }
        fn update(&self, _: Piece<'_, '_>, _: u64, _: f64) {}
        fn learning_rate(&self, _: f64) -> f32 {
            1.0
        }
        fn evaluated_slot(&self) -> Option<&'static str> {
            Some("average")
        }
    }

    #[test]
    fn evaluation_reads_the_slot_the_optimiser_names_or_else_the_parameters() {
        let mut state = TrainState::new(vec![1.0, 2.0], &Averaging);
        state.slots[1].values = vec![3.0, 4.0];
        assert_eq!(state.evaluated(&Averaging), Some(&[3.0, 4.0][..]));
        assert_eq!(state.evaluated(&Summing), Some(&[1.0, 2.0][..]));
        // A state of another optimiser has no average to evaluate.
        let summed = TrainState::new(vec![1.0, 2.0], &Summing);
        assert_eq!(summed.evaluated(&Averaging), None);
    }

    #[test]
    fn a_state_with_fewer_or_more_slots_does_not_fit() {
        let state = TrainState::new(vec![1.0, 2.0], &Averaging);
        assert!(state.fits(&Averaging));
        let mut fewer = state.clone();
        fewer.slots.pop();
        assert!(!fewer.fits(&Averaging));
        let mut more = state;
        more.slots.push(Slot {
            name: "extra".into(),
            values: vec![0.0; 2],
        });
        assert!(!more.fits(&Averaging));
    }

    #[test]
    fn a_fresh_state_holds_the_optimisers_initial_state_by_name() {
        let state = TrainState::new(vec![1.0, -2.0], &Summing);
        assert_eq!(state.params, [1.0, -2.0]);
        assert_eq!(state.slot("sum"), Some(&[10.0, -20.0][..]));
        assert_eq!(state.slot("ema"), None);
        assert_eq!(state.step, 0);
        assert!(state.fits(&Summing));
        let mut short = state.clone();
        short.slots[0].values.pop();
        assert!(!short.fits(&Summing));
        let mut renamed = state;
        renamed.slots[0].name = "other".into();
        assert!(!renamed.fits(&Summing));
    }
}
