//! [`Helpers`]: other threads that may take over part of one worker's computation.

/// Threads that may run some of a computation's independent tasks: in synchronous training,
/// the workers that have finished their own step and would otherwise wait at the barrier for
/// this one (a worker on a busy core). A task's result must not depend on which thread runs
/// it, so that a run's numbers never depend on timing.
pub trait Helpers: Sync {
    /// Runs `task(i)` once for every `i` in `0..count`, on the calling thread and on any helper
    /// that is free meanwhile, and returns when every task has run.
    fn share(&self, count: usize, task: &(dyn Fn(usize) + Sync));

    /// Whether another thread may ever run one of the tasks: where none can, a computation
    /// may run as one piece instead of tasks (cutting a product into blocks costs time). The
    /// default: `true`.
    fn may_help(&self) -> bool {
        true
    }
}

/// No helpers: every task runs on the calling thread, in order.
#[derive(Debug, Clone, Copy, Default)]
pub struct Alone;

impl Helpers for Alone {
    fn share(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
        (0..count).for_each(task);
    }

    fn may_help(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Runs the tasks itself, and says nothing about helping.
    struct Unsaid;

    impl Helpers for Unsaid {
        fn share(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
            (0..count).for_each(task);
        }
    }

    #[test]
    fn helpers_may_help_unless_they_say_they_never_do() {
        // The strategies' helpers keep the default: without it, a product is never cut into
        // tasks for them.
        assert!(Unsaid.may_help());
        assert!(!Alone.may_help());
    }

    #[test]
    fn alone_runs_every_task_once_in_order_on_the_calling_thread() {
        assert!(!Alone.may_help());
        let ran = Mutex::new(Vec::new());
        let me = std::thread::current().id();
        Alone.share(5, &|i| {
            assert_eq!(std::thread::current().id(), me);
            ran.lock().unwrap().push(i);
        });
        assert_eq!(ran.into_inner().unwrap(), [0, 1, 2, 3, 4]);
    }
}
