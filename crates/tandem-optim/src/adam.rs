//! Adam (Kingma and Ba, 2015), with bias correction, L2 as the reference's loss term, the
//! reference's learning-rate decay and an optional moving average of the parameters.

use tandem_core::{DeviceUpdate, Optimizer, Piece};

use crate::{
    check, decayed_rate, parse_finite, read_value, warmed_ema_decay, MetadataError,
    RecordedOptimizer, ValueError,
};

/// Adam over the mean gradient plus the L2 term (`g + weight_decay * p`, the gradient of the
/// reference's regularised loss), per element:
///
/// ```text
/// m = beta1 * m + (1 - beta1) * g
/// v = beta2 * v + (1 - beta2) * g * g
/// p = p - step_size * (m / (sqrt(v) + epsilon_hat))
/// e = d * e + (1 - d) * p                      (with a moving average)
/// ```
///
/// where, for update `t` (from 1), `step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t)` and
/// `epsilon_hat = epsilon * sqrt(1 - beta2^t)` (the paper's section 2 form of the bias
/// correction, computed on the host in f64), `lr` decaying as [`Sgd`](crate::Sgd)'s does and
/// `d` warmed up as its average's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adam {
    /// Base learning rate.
    pub learning_rate: f32,
    /// The learning rate is multiplied by this once per epoch, continuously.
    pub lr_decay: f32,
    /// The first moment's decay.
    pub beta1: f32,
    /// The second moment's decay.
    pub beta2: f32,
    /// Added to the root of the second moment.
    pub epsilon: f32,
    /// L2 coefficient on weights: the loss gains `weight_decay / 2 * sum w^2`.
    pub weight_decay: f32,
    /// Upper bound of the moving average's decay; `None`: no moving average (evaluation reads
    /// the parameters).
    pub ema_decay: Option<f32>,
}

/// The state vectors, with and without the moving average.
const MOMENTS: [&str; 2] = ["m", "v"];
const MOMENTS_AND_AVERAGE: [&str; 3] = ["m", "v", "ema"];

impl Adam {
    /// The usual Adam values (Kingma and Ba: 0.001, 0.9, 0.999, 1e-8) with the reference's
    /// decay, L2 and moving average; 100 epochs of it train the MNIST network to 0.98 in both
    /// modes (README, "Optimisers").
    pub const DEFAULT: Adam = Adam {
        learning_rate: 0.001,
        lr_decay: 0.99,
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
        weight_decay: 1e-4,
        ema_decay: Some(0.99),
    };

    /// The device kernel of its update (`kernels/update.cu`).
    pub const KERNEL: &'static str = "adam_update";

    /// The kernel's values for update `step` (0-based) at `epoch`: `[step_size, beta1, beta2,
    /// epsilon_hat, wd, d]`.
    fn hyper(&self, step: u64, epoch: f64, weight_decay: bool, rate_scale: f32) -> [f32; 6] {
        let t = step.saturating_add(1).min(i32::MAX as u64) as i32;
        let (c1, c2) = (
            1.0 - f64::from(self.beta1).powi(t),
            (1.0 - f64::from(self.beta2).powi(t)).sqrt(),
        );
        let rate = f64::from(self.learning_rate(epoch) * rate_scale);
        [
            (rate * c2 / c1) as f32,
            self.beta1,
            self.beta2,
            (f64::from(self.epsilon) * c2) as f32,
            if weight_decay { self.weight_decay } else { 0.0 },
            self.ema_decay.map_or(0.0, |d| warmed_ema_decay(d, step)),
        ]
    }
}

impl Default for Adam {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One Adam update of `p` and its state from the mean of `grads` with the kernel's values
/// `hyper` (`[step_size, beta1, beta2, epsilon_hat, wd, d]`, what [`Adam`]'s device update
/// gives): the arithmetic `adam_update` in `kernels/update.cu` does, one
/// rounded f32 operation at a time.
pub fn adam_update(
    p: &mut [f32],
    state: &mut [&mut [f32]],
    grads: &[&[f32]],
    [step_size, b1, b2, eps, wd, d]: [f32; 6],
) {
    let inv_n = 1.0 / grads.len() as f32;
    let (moments, average) = state.split_at_mut(2);
    let [m, v] = moments else {
        unreachable!("Adam keeps its two moments first")
    };
    for i in 0..p.len() {
        let mut g = grads[0][i];
        if grads.len() > 1 {
            for other in &grads[1..] {
                g += other[i];
            }
            g *= inv_n;
        }
        let g = g + wd * p[i];
        m[i] = b1 * m[i] + (1.0 - b1) * g;
        v[i] = b2 * v[i] + (1.0 - b2) * (g * g);
        p[i] -= step_size * (m[i] / (v[i].sqrt() + eps));
        if let [e] = average {
            e[i] = d * e[i] + (1.0 - d) * p[i];
        }
    }
}

impl Optimizer for Adam {
    fn state_names(&self) -> &[&'static str] {
        match self.ema_decay {
            Some(_) => &MOMENTS_AND_AVERAGE,
            None => &MOMENTS,
        }
    }

    /// The moments start at zero, the average at the parameters.
    fn initial_state(&self, name: &str, params: &[f32]) -> Vec<f32> {
        match name {
            "ema" => params.to_vec(),
            _ => vec![0.0; params.len()],
        }
    }

    fn update(&self, piece: Piece<'_, '_>, step: u64, epoch: f64) {
        let hyper = self.hyper(step, epoch, piece.weight_decay, piece.rate_scale);
        adam_update(piece.params, piece.state, piece.grads, hyper);
    }

    fn device_update(
        &self,
        step: u64,
        epoch: f64,
        weight_decay: bool,
        rate_scale: f32,
    ) -> Option<DeviceUpdate> {
        Some(DeviceUpdate {
            kernel: Self::KERNEL,
            hyper: self.hyper(step, epoch, weight_decay, rate_scale).to_vec(),
        })
    }

    fn evaluated_slot(&self) -> Option<&'static str> {
        self.ema_decay.map(|_| "ema")
    }

    fn learning_rate(&self, epoch: f64) -> f32 {
        decayed_rate(self.learning_rate, self.lr_decay, epoch)
    }

    fn weight_decay(&self) -> f32 {
        self.weight_decay
    }
}

/// A moment's decay: in [0, 1).
fn beta(text: &str) -> Result<f32, ValueError> {
    parse_finite(
        text,
        |v| (0.0..1.0).contains(&v),
        "a moment's decay must be in [0, 1)",
    )
}

/// The moving-average decay, or `off`.
fn optional_ema_decay(text: &str) -> Result<Option<f32>, ValueError> {
    match text.trim() {
        "off" => Ok(None),
        _ => check::ema_decay(text).map(Some),
    }
}

impl RecordedOptimizer for Adam {
    fn record(&self) -> Vec<(&'static str, String)> {
        vec![
            ("learning_rate", self.learning_rate.to_string()),
            ("lr_decay", self.lr_decay.to_string()),
            ("beta1", self.beta1.to_string()),
            ("beta2", self.beta2.to_string()),
            ("epsilon", self.epsilon.to_string()),
            ("weight_decay", self.weight_decay.to_string()),
            (
                "ema_decay",
                self.ema_decay.map_or("off".into(), |d| d.to_string()),
            ),
        ]
    }

    fn from_values(value: &dyn Fn(&str) -> Option<String>) -> Result<Self, MetadataError> {
        Ok(Adam {
            learning_rate: read_value(value, "learning_rate", check::learning_rate)?,
            lr_decay: read_value(value, "lr_decay", check::lr_decay)?,
            beta1: read_value(value, "beta1", beta)?,
            beta2: read_value(value, "beta2", beta)?,
            epsilon: read_value(value, "epsilon", |t| {
                parse_finite(t, |v| v > 0.0, "epsilon must be > 0 (0 divides by zero)")
            })?,
            weight_decay: read_value(value, "weight_decay", check::weight_decay)?,
            ema_decay: read_value(value, "ema_decay", optional_ema_decay)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adam in f64, straight from the paper's algorithm 1 (bias-corrected moments), with L2 in
    /// the gradient: the independent computation the f32 update is checked against.
    fn reference(adam: &Adam, p: f64, grads: &[f64]) -> f64 {
        let (b1, b2, eps) = (
            f64::from(adam.beta1),
            f64::from(adam.beta2),
            f64::from(adam.epsilon),
        );
        let (mut p, mut m, mut v) = (p, 0.0, 0.0);
        for (t, &g) in grads.iter().enumerate() {
            let t = t as i32 + 1;
            let g = g + f64::from(adam.weight_decay) * p;
            m = b1 * m + (1.0 - b1) * g;
            v = b2 * v + (1.0 - b2) * g * g;
            let (m_hat, v_hat) = (m / (1.0 - b1.powi(t)), v / (1.0 - b2.powi(t)));
            p -= f64::from(adam.learning_rate) * m_hat / (v_hat.sqrt() + eps);
        }
        p
    }

    #[test]
    fn steps_follow_the_papers_algorithm_in_f64() {
        let adam = Adam {
            lr_decay: 1.0,
            epsilon: 1e-3,
            weight_decay: 0.01,
            ema_decay: None,
            ..Adam::DEFAULT
        };
        let grads = [0.5, -1.25, 2.0, 0.01, -0.3, 0.0, 1e-3, 4.0];
        let (mut p, mut m, mut v) = ([1.5f32], [0.0f32], [0.0f32]);
        for (step, &g) in grads.iter().enumerate() {
            adam.update(
                Piece {
                    params: &mut p,
                    state: &mut [&mut m, &mut v],
                    grads: &[&[g as f32]],
                    weight_decay: true,
                    rate_scale: 1.0,
                },
                step as u64,
                0.0,
            );
            let want = reference(&adam, 1.5, &grads[..=step]);
            // The section-2 form folds the corrections into the step and epsilon: equal in
            // exact arithmetic, a few f32 roundings apart here.
            assert!(
                (f64::from(p[0]) - want).abs() < 1e-6,
                "step {step}: {} {want}",
                p[0]
            );
        }
        // The first step moves every parameter by about the learning rate, whatever the
        // gradient's size: Adam's signature.
        let (mut p, mut m, mut v) = ([0.0f32; 2], [0.0f32; 2], [0.0f32; 2]);
        adam.update(
            Piece {
                params: &mut p,
                state: &mut [&mut m, &mut v],
                grads: &[&[100.0, -0.01]],
                weight_decay: false,
                rate_scale: 1.0,
            },
            0,
            0.0,
        );
        assert!(
            (p[0] + 0.001).abs() < 1e-6 && (p[1] - 0.000_909).abs() < 1e-5,
            "{p:?}"
        );
    }

    /// Two replicas' gradients are averaged in their order; the rate scale and the L2 switch
    /// reach the step; the average follows the parameters.
    #[test]
    fn gradients_are_averaged_and_the_average_follows() {
        let adam = Adam::DEFAULT;
        let run = |grads: &[&[f32]], scale: f32, decayed: bool| {
            let (mut p, mut m, mut v, mut e) = ([0.5f32], [0.0], [0.0], [0.5]);
            adam.update(
                Piece {
                    params: &mut p,
                    state: &mut [&mut m, &mut v, &mut e],
                    grads,
                    weight_decay: decayed,
                    rate_scale: scale,
                },
                0,
                0.0,
            );
            (p[0], m[0], e[0])
        };
        let (p, m, e) = run(&[&[1.0], &[3.0]], 1.0, false);
        assert_eq!(m, (1.0 - 0.9) * 2.0);
        assert_eq!(run(&[&[2.0]], 1.0, false), (p, m, e));
        // Step 0's average decay is 0.1 (the warm-up).
        assert_eq!(e, 0.1 * 0.5 + (1.0 - 0.1) * p);
        let (half, _, _) = run(&[&[2.0]], 0.5, false);
        assert!(((0.5 - half) * 2.0 - (0.5 - p)).abs() < 1e-7);
        let (_, decayed_m, _) = run(&[&[2.0]], 1.0, true);
        assert_eq!(decayed_m, (1.0 - 0.9) * (2.0 + 1e-4 * 0.5));
    }

    #[test]
    fn its_state_and_evaluation_follow_the_average_switch() {
        assert_eq!(Adam::DEFAULT.state_names(), ["m", "v", "ema"]);
        assert_eq!(Adam::DEFAULT.evaluated_slot(), Some("ema"));
        let plain = Adam {
            ema_decay: None,
            ..Adam::DEFAULT
        };
        assert_eq!(plain.state_names(), ["m", "v"]);
        assert_eq!(plain.evaluated_slot(), None);
        assert_eq!(Adam::DEFAULT.initial_state("m", &[1.0, 2.0]), [0.0, 0.0]);
        assert_eq!(Adam::DEFAULT.initial_state("ema", &[1.0, 2.0]), [1.0, 2.0]);
    }

    #[test]
    fn its_record_reads_back_and_every_value_is_checked() {
        let plain = Adam {
            ema_decay: None,
            ..Adam::DEFAULT
        };
        for adam in [Adam::DEFAULT, plain] {
            crate::check_record(
                &adam,
                &[
                    ("beta1", "1"),
                    ("beta2", "-0.1"),
                    ("epsilon", "0"),
                    ("ema_decay", "on"),
                    ("learning_rate", "inf"),
                ],
            );
        }
    }

    /// The kernel's values: the bias corrections of step `t` folded into the step size and
    /// epsilon, the decay warmed up.
    #[test]
    fn the_device_update_carries_the_corrected_step() {
        let adam = Adam::DEFAULT;
        let update = adam.device_update(0, 0.0, true, 1.0).unwrap();
        assert_eq!(update.kernel, "adam_update");
        // The f32 settings widened, as the host computes them.
        let wide = f64::from;
        let c2 = (1.0 - wide(0.999f32)).sqrt();
        assert_eq!(
            update.hyper[0],
            (wide(0.001f32) * c2 / (1.0 - wide(0.9f32))) as f32
        );
        assert_eq!(update.hyper[3], (wide(1e-8f32) * c2) as f32);
        assert_eq!(update.hyper[4], 1e-4);
        assert_eq!(update.hyper[5], 0.1);
        assert_eq!(
            adam.device_update(0, 0.0, false, 1.0).unwrap().hyper[4],
            0.0
        );
        // Late in a run the corrections vanish.
        let late = adam.device_update(1 << 40, 0.0, true, 1.0).unwrap();
        assert_eq!(late.hyper[0], 0.001);
    }
}
