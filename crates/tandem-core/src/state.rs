/// Everything that defines where a training run stands: the parameters of record, their moving
/// average and the global step. Both strategies read it at the start of a run and leave the
/// final values in it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainState {
    /// The parameters, flat, in the replicas' layout.
    pub params: Vec<f32>,
    /// The moving average of the parameters.
    pub ema: Vec<f32>,
    /// Updates applied so far.
    pub step: u64,
}

impl TrainState {
    /// A fresh run from `params` (the moving average starts equal to them).
    pub fn new(params: Vec<f32>) -> Self {
        Self {
            ema: params.clone(),
            params,
            step: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_state_averages_its_own_parameters_at_step_zero() {
        let state = TrainState::new(vec![1.0, -2.0]);
        assert_eq!(state.params, [1.0, -2.0]);
        assert_eq!(state.ema, state.params);
        assert_eq!(state.step, 0);
    }
}
