//! Where a run stops between its segments: to checkpoint, to evaluate, at its end.

/// The stops of a run: the trainer trains from one to the next, and at each saves a
/// checkpoint, evaluates, or both, as the plan says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The global step the run ends at; there is always a checkpoint (when the run has a
    /// checkpoint directory) and an evaluation (when it evaluates at all) at the end.
    pub end_step: u64,
    /// A checkpoint every this many steps (0: only at the end and on interruption).
    pub save_every: u64,
    /// An evaluation every this many steps (0: none on a cadence).
    pub evaluate_every: u64,
    /// Further evaluations at these steps (any order; those past the end are ignored).
    pub evaluate_at: Vec<u64>,
}

impl Plan {
    /// A plan that runs to `end_step` without stopping on the way.
    pub fn to(end_step: u64) -> Self {
        Self {
            end_step,
            save_every: 0,
            evaluate_every: 0,
            evaluate_at: Vec::new(),
        }
    }

    /// The first stop after `step`: the next multiple of a cadence, the next listed
    /// evaluation, or the end.
    pub fn next_stop(&self, step: u64) -> u64 {
        let cadences = [self.save_every, self.evaluate_every]
            .into_iter()
            .filter(|&n| n > 0)
            .map(|n| (step / n + 1).saturating_mul(n));
        let listed = self.evaluate_at.iter().copied().filter(|&s| s > step);
        cadences.chain(listed).fold(self.end_step, u64::min)
    }

    /// Whether the run saves a checkpoint on reaching `step` (`stopped`: it stops there early).
    pub fn saves_at(&self, step: u64, stopped: bool) -> bool {
        stopped || step == self.end_step || every(self.save_every, step)
    }

    /// Whether the run evaluates on reaching `step`.
    pub fn evaluates_at(&self, step: u64) -> bool {
        let evaluates = self.evaluate_every > 0 || !self.evaluate_at.is_empty();
        (evaluates && step == self.end_step)
            || every(self.evaluate_every, step)
            || self.evaluate_at.contains(&step)
    }
}

/// Whether `step` is a positive multiple of `n` (never for `n` = 0).
fn every(n: u64, step: u64) -> bool {
    n > 0 && step.is_multiple_of(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stop from `start` to the end.
    fn stops(plan: &Plan, start: u64) -> Vec<u64> {
        let mut step = start;
        let mut stops = Vec::new();
        while step < plan.end_step {
            step = plan.next_stop(step);
            stops.push(step);
        }
        stops
    }

    #[test]
    fn stops_at_every_cadence_and_at_the_end() {
        let plan = Plan {
            end_step: 25,
            save_every: 10,
            evaluate_every: 4,
            evaluate_at: vec![],
        };
        assert_eq!(stops(&plan, 0), [4, 8, 10, 12, 16, 20, 24, 25]);
        // Resumed mid-way: the cadences stay those of step 0.
        assert_eq!(stops(&plan, 13), [16, 20, 24, 25]);
        assert!(plan.saves_at(10, false) && plan.saves_at(25, false) && plan.saves_at(7, true));
        assert!(!plan.saves_at(12, false));
        assert!(plan.evaluates_at(12) && plan.evaluates_at(25) && !plan.evaluates_at(10));
    }

    #[test]
    fn without_cadences_it_runs_to_the_end_and_evaluates_only_where_listed() {
        let plan = Plan::to(1_000);
        assert_eq!(stops(&plan, 0), [1_000]);
        assert!(plan.saves_at(1_000, false) && !plan.saves_at(999, false));
        assert!(!plan.evaluates_at(1_000));
        // No cadence is no multiple of 0 either, step 0 included.
        assert!(!plan.saves_at(0, false) && !plan.evaluates_at(0));
        let listed = Plan {
            evaluate_at: vec![700, 300, 5_000],
            ..Plan::to(1_000)
        };
        assert_eq!(stops(&listed, 0), [300, 700, 1_000]);
        assert!(listed.evaluates_at(300) && listed.evaluates_at(1_000));
        assert!(!listed.evaluates_at(500));
    }

    #[test]
    fn cadences_near_the_largest_step_do_not_overflow() {
        let plan = Plan {
            end_step: u64::MAX,
            save_every: u64::MAX / 2 + 1,
            evaluate_every: 0,
            evaluate_at: vec![],
        };
        assert_eq!(plan.next_stop(u64::MAX / 2 + 1), u64::MAX);
    }
}
