//! What an asynchronous run does about stale updates, and the strategy a run trains with.

use std::fmt;
use std::str::FromStr;

use crate::{BatchScaling, Mode};

/// How an asynchronous run treats staleness: how many other updates landed between an update's
/// read of the parameters and its own application. N equally fast workers make every update
/// N - 1 stale; at the full learning rate the N - 1 updates computed from the same old
/// parameters add up to a step about N - 1 times too long, and from 4 workers on tandem's
/// default rate diverges (`plain`: 0.18 test accuracy after 2 epochs on
/// `sim:8`, 0.11 after 100 on `sim:16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncRule {
    /// Every update at the full learning rate: the classic parameter server.
    Plain,
    /// Each update's learning rate divided by its staleness, at least 1 (Zhang, Gupta, Lian and
    /// Liu, "Staleness-aware Async-SGD", IJCAI 2016): on one or two workers it changes nothing.
    Scaled,
}

impl AsyncRule {
    /// The rule asynchronous runs use unless told otherwise: [`AsyncRule::Scaled`], the one
    /// that trains at every worker count measured (README, "Many workers").
    pub const DEFAULT: AsyncRule = AsyncRule::Scaled;

    /// Every rule, as flags list them.
    pub const ALL: [AsyncRule; 2] = [AsyncRule::Plain, AsyncRule::Scaled];

    /// `"plain"` or `"scaled"`, as flags, metadata and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            AsyncRule::Plain => "plain",
            AsyncRule::Scaled => "scaled",
        }
    }

    /// The factor of the learning rate of an update `staleness` updates stale.
    pub fn rate_scale(self, staleness: u64) -> f32 {
        match self {
            AsyncRule::Plain => 1.0,
            AsyncRule::Scaled => 1.0 / staleness.max(1) as f32,
        }
    }
}

impl Default for AsyncRule {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for AsyncRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`AsyncRule`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown asynchronous rule {0:?} (expected plain or scaled)")]
pub struct UnknownRule(pub String);

impl FromStr for AsyncRule {
    type Err = UnknownRule;

    fn from_str(text: &str) -> Result<Self, UnknownRule> {
        Self::ALL
            .into_iter()
            .find(|rule| rule.name() == text.trim())
            .ok_or_else(|| UnknownRule(text.to_owned()))
    }
}

/// How many epochs an asynchronous run trains on one worker before the others join (the
/// remedy the TensorFlow book gives for stale updates: the first epochs, when the parameters
/// move fastest, are where staleness hurts most). The other workers wait; the first
/// [`Warmup::epochs`] passes of a run are then exactly one worker's, never stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Warmup {
    /// [`Warmup::AUTO_EPOCHS`] on runs of [`Warmup::AUTO_FROM_WORKERS`] workers or more, none on
    /// fewer (where updates are hardly stale, and the warm-up would only idle workers).
    Auto,
    /// This many epochs, whatever the number of workers (0: none).
    Epochs(u64),
}

impl Warmup {
    /// The epochs of [`Warmup::Auto`]: measured on `sim:16`, 100 epochs, the scaled rule: 0.9762
    /// test accuracy without a warm-up, 0.9813 with 5 epochs (README, "Many workers").
    pub const AUTO_EPOCHS: u64 = 5;
    /// The fewest workers [`Warmup::Auto`] warms up: where the full rate starts to diverge.
    pub const AUTO_FROM_WORKERS: usize = 4;

    /// The warm-up's length in epochs on a run of `workers` workers.
    pub fn epochs(self, workers: usize) -> u64 {
        match self {
            Warmup::Auto if workers >= Self::AUTO_FROM_WORKERS => Self::AUTO_EPOCHS,
            Warmup::Auto => 0,
            Warmup::Epochs(n) => n,
        }
    }
}

impl fmt::Display for Warmup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warmup::Auto => f.write_str("auto"),
            Warmup::Epochs(n) => write!(f, "{n}"),
        }
    }
}

/// The longest warm-up a run may ask for, in epochs (the longest run's length).
pub const MAX_WARMUP_EPOCHS: u64 = 100_000;

/// A warm-up that is neither `auto` nor a number of epochs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid warm-up {0:?} (expected auto or a number of epochs from 0 to 100000)")]
pub struct InvalidWarmup(pub String);

impl FromStr for Warmup {
    type Err = InvalidWarmup;

    fn from_str(text: &str) -> Result<Self, InvalidWarmup> {
        match text.trim() {
            "auto" => Ok(Warmup::Auto),
            t => t
                .parse::<u64>()
                .ok()
                .filter(|&n| n <= MAX_WARMUP_EPOCHS)
                .map(Warmup::Epochs)
                .ok_or_else(|| InvalidWarmup(text.to_owned())),
        }
    }
}

/// A limit on how stale an asynchronous update may be, and what a worker does at it (a
/// parameter server's usual guards: Ho et al., "More Effective Distributed ML via a Stale
/// Synchronous Parallel Parameter Server", NIPS 2013; TensorFlow's dropping of stale
/// gradients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StalenessBound {
    /// No limit: every worker computes whenever it is free.
    #[default]
    Unbounded,
    /// At most S + 1 workers compute at once (between their read of the parameters and their
    /// update); a worker that would be one more waits before it reads. On equally fast workers
    /// no update is then more than S stale; a worker much faster than the others can still
    /// land several updates during another's one.
    Wait(u64),
    /// An update more than S stale is dropped: its worker reads the parameters again and
    /// computes its batch anew, so that every batch still lands once, at most S stale.
    Drop(u64),
}

impl StalenessBound {
    /// The largest S a bound takes.
    pub const MAX: u64 = 1 << 20;
}

impl fmt::Display for StalenessBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StalenessBound::Unbounded => f.write_str("none"),
            StalenessBound::Wait(s) => write!(f, "wait:{s}"),
            StalenessBound::Drop(s) => write!(f, "drop:{s}"),
        }
    }
}

/// A bound that is neither `none` nor `wait:S` / `drop:S`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid staleness bound {0:?} (expected none, wait:S or drop:S, S from 0 to 1048576)")]
pub struct InvalidBound(pub String);

impl FromStr for StalenessBound {
    type Err = InvalidBound;

    fn from_str(text: &str) -> Result<Self, InvalidBound> {
        let invalid = || InvalidBound(text.to_owned());
        let text = text.trim();
        if text == "none" {
            return Ok(StalenessBound::Unbounded);
        }
        let (action, limit) = text.split_once(':').ok_or_else(invalid)?;
        let limit = limit
            .parse::<u64>()
            .ok()
            .filter(|&s| s <= Self::MAX)
            .ok_or_else(invalid)?;
        match action {
            "wait" => Ok(StalenessBound::Wait(limit)),
            "drop" => Ok(StalenessBound::Drop(limit)),
            _ => Err(invalid()),
        }
    }
}

/// How a run trains: its [`Mode`]; in asynchronous mode its [`AsyncRule`], [`Warmup`] and
/// [`StalenessBound`] (a synchronous run has no stale update, and ignores them); in synchronous
/// mode its [`BatchScaling`] (asynchronous steps are one worker's batch, and ignore it). A
/// [`Mode`] alone is that mode with the defaults: [`AsyncRule::DEFAULT`], [`Warmup::Auto`], no
/// bound and [`BatchScaling::Auto`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Strategy {
    /// Sync or async.
    pub mode: Mode,
    /// What asynchronous updates do about staleness.
    pub rule: AsyncRule,
    /// How long an asynchronous run trains on one worker first.
    pub warmup: Warmup,
    /// How stale an asynchronous update may be.
    pub bound: StalenessBound,
    /// How a synchronous run's learning rate follows its global batch.
    pub batch_scaling: BatchScaling,
    /// What a synchronous run across ranks, or between GPU replicas, exchanges its gradients
    /// in.
    pub exchange: crate::Exchange,
}

impl From<Mode> for Strategy {
    fn from(mode: Mode) -> Self {
        Strategy {
            mode,
            rule: AsyncRule::DEFAULT,
            warmup: Warmup::Auto,
            bound: StalenessBound::Unbounded,
            batch_scaling: BatchScaling::Auto,
            exchange: crate::Exchange::F32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for rule in AsyncRule::ALL {
            assert_eq!(rule.name().parse(), Ok(rule));
            assert_eq!(rule.to_string(), rule.name());
        }
        let err = "scaled2".parse::<AsyncRule>().unwrap_err();
        assert!(
            err.to_string().contains("expected plain or scaled"),
            "{err}"
        );
    }

    #[test]
    fn a_warmup_is_auto_or_epochs_and_auto_warms_up_only_many_workers() {
        assert_eq!("auto".parse(), Ok(Warmup::Auto));
        assert_eq!(" 7".parse(), Ok(Warmup::Epochs(7)));
        for bad in ["-1", "x", "", "100001", "1.5"] {
            let err = bad.parse::<Warmup>().unwrap_err();
            assert!(err.to_string().contains("expected auto"), "{bad}: {err}");
        }
        for w in [Warmup::Auto, Warmup::Epochs(0), Warmup::Epochs(12)] {
            assert_eq!(w.to_string().parse(), Ok(w));
        }
        assert_eq!(Warmup::Auto.epochs(3), 0);
        assert_eq!(Warmup::Auto.epochs(4), Warmup::AUTO_EPOCHS);
        assert_eq!(Warmup::Auto.epochs(64), Warmup::AUTO_EPOCHS);
        assert_eq!(Warmup::Epochs(2).epochs(1), 2);
    }

    #[test]
    fn a_bound_is_none_or_an_action_and_a_limit() {
        assert_eq!("none".parse(), Ok(StalenessBound::Unbounded));
        assert_eq!(" wait:3".parse(), Ok(StalenessBound::Wait(3)));
        assert_eq!("drop:0".parse(), Ok(StalenessBound::Drop(0)));
        for bad in [
            "",
            "wait",
            "wait:",
            "drop:-1",
            "skip:2",
            "wait:1048577",
            "drop:1.5",
            "3",
        ] {
            let err = bad.parse::<StalenessBound>().unwrap_err();
            assert!(
                err.to_string().contains("expected none, wait:S"),
                "{bad}: {err}"
            );
        }
        for b in [
            StalenessBound::Unbounded,
            StalenessBound::Wait(7),
            StalenessBound::Drop(StalenessBound::MAX),
        ] {
            assert_eq!(b.to_string().parse(), Ok(b));
        }
    }

    #[test]
    fn scaled_divides_by_the_staleness_and_plain_never() {
        for staleness in [0, 1, 2, 7, 63] {
            assert_eq!(AsyncRule::Plain.rate_scale(staleness), 1.0);
        }
        assert_eq!(AsyncRule::Scaled.rate_scale(0), 1.0);
        assert_eq!(AsyncRule::Scaled.rate_scale(1), 1.0);
        assert_eq!(AsyncRule::Scaled.rate_scale(4), 0.25);
        assert_eq!(AsyncRule::Scaled.rate_scale(63), 1.0 / 63.0);
    }
}
