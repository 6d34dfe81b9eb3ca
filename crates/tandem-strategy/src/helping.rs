//! The synchronous workers' [`Helpers`]: a board where each worker posts the tasks it shares
//! out, and from which workers waiting at the barrier take them.
//!
//! A worker on a slower core (another machine's load on the same host) would otherwise hold
//! every step back by its lag; with the board, the others finish its last product with it.
//! Every task writes its own part of the owner's buffers and computes it exactly as the owner
//! would, so who runs it never changes the run's numbers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use tandem_core::Helpers;

/// Tasks posted by one worker: the task, how many, the next to hand out, and how many helpers
/// are running one.
struct Posted {
    /// The owner's task, its lifetime erased: see [`WorkerHelpers::share`] for why it is only
    /// called while the owner waits for it.
    task: *const (dyn Fn(usize) + Sync),
    count: usize,
    next: usize,
    running: usize,
}

impl Posted {
    /// The next task nobody has taken yet, now taken.
    fn take(&mut self) -> Option<usize> {
        (self.next < self.count).then(|| {
            self.next += 1;
            self.next - 1
        })
    }
}

// SAFETY: `task` points to a `Sync` closure (callable from any thread) that outlives every call
// made through the board (see `WorkerHelpers::share`).
unsafe impl Send for Posted {}

/// One slot of posted tasks per worker.
pub(crate) struct Board {
    slots: Vec<Mutex<Option<Posted>>>,
    /// Whether every worker has a core of its own: otherwise a worker waiting busy for work
    /// takes the core of one that has work.
    cores_enough: bool,
    /// Whether any worker has posted tasks yet (replicas on a device never do).
    posted: AtomicBool,
}

impl Board {
    /// A board for `workers` workers.
    pub fn new(workers: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Self {
            slots: (0..workers).map(|_| Mutex::new(None)).collect(),
            cores_enough: workers <= cores,
            posted: AtomicBool::new(false),
        }
    }

    /// Whether a worker waiting for the others should wait busy, ready to help: where every
    /// worker has a core and the workers share tasks out.
    pub fn worth_waiting_for(&self) -> bool {
        self.cores_enough && self.posted.load(Ordering::Relaxed)
    }

    /// `worker`'s helpers: the other workers, through this board.
    pub fn helpers(&self, worker: usize) -> WorkerHelpers<'_> {
        WorkerHelpers {
            board: self,
            worker,
        }
    }

    fn slot(&self, worker: usize) -> MutexGuard<'_, Option<Posted>> {
        // A helper that panicked in a task has already been counted out (see `Running`).
        self.slots[worker].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one task that another worker than `worker` posted and nobody has taken; whether
    /// there was one.
    pub fn help(&self, worker: usize) -> bool {
        let others = (worker + 1..self.slots.len()).chain(0..worker);
        for owner in others {
            let taken = self.slot(owner).as_mut().and_then(|posted| {
                let index = posted.take()?;
                posted.running += 1;
                Some((posted.task, index))
            });
            if let Some((task, index)) = taken {
                let _running = Running { board: self, owner };
                // SAFETY: the owner counted this task as running before the slot's lock was
                // released, and does not return from `share` (ending the closure's borrow)
                // until `_running` has counted it out.
                unsafe { (*task)(index) };
                return true;
            }
        }
        false
    }
}

/// A task a helper runs for `owner`: counted out when it ends, even by a panic, so that the
/// owner never waits for it forever.
struct Running<'a> {
    board: &'a Board,
    owner: usize,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(posted) = self.board.slot(self.owner).as_mut() {
            posted.running -= 1;
        }
    }
}

/// One worker's [`Helpers`]: the other workers of its board.
pub(crate) struct WorkerHelpers<'a> {
    board: &'a Board,
    worker: usize,
}

impl Helpers for WorkerHelpers<'_> {
    fn share(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
        // SAFETY (of every call through the erased pointer): `Withdraw` takes the post down,
        // after waiting for the helpers' running tasks, before this function returns or
        // unwinds; helpers call `task` only for tasks counted as running under the slot's lock.
        let erased: *const (dyn Fn(usize) + Sync + '_) = task;
        let erased: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(erased) };
        self.board.posted.store(true, Ordering::Relaxed);
        *self.board.slot(self.worker) = Some(Posted {
            task: erased,
            count,
            next: 0,
            running: 0,
        });
        let _withdraw = Withdraw(self);
        loop {
            let next = self.board.slot(self.worker).as_mut().and_then(Posted::take);
            match next {
                Some(index) => task(index),
                None => break,
            }
        }
    }
}

/// Takes a worker's post down once no helper runs one of its tasks.
struct Withdraw<'a, 'b>(&'a WorkerHelpers<'b>);

impl Drop for Withdraw<'_, '_> {
    fn drop(&mut self) {
        let WorkerHelpers { board, worker } = self.0;
        loop {
            let mut slot = board.slot(*worker);
            if slot.as_ref().is_none_or(|posted| posted.running == 0) {
                *slot = None;
                return;
            }
            drop(slot);
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Worker 1 shares slow tasks while worker 0 helps: every task runs once, some on the
    /// helper, and all have finished when `share` returns.
    #[test]
    fn shared_tasks_run_once_each_some_on_the_helper_all_before_share_returns() {
        const TASKS: usize = 16;
        let board = Board::new(2);
        let runs: Vec<AtomicUsize> = (0..TASKS).map(|_| AtomicUsize::new(0)).collect();
        let finished: Vec<AtomicBool> = (0..TASKS).map(|_| AtomicBool::new(false)).collect();
        let helped = AtomicUsize::new(0);
        let owner_done = AtomicBool::new(false);
        let owner = std::thread::current().id();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !owner_done.load(Ordering::Acquire) {
                    board.help(0);
                }
            });
            board.helpers(1).share(TASKS, &|i| {
                runs[i].fetch_add(1, Ordering::Relaxed);
                if std::thread::current().id() != owner {
                    helped.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
                finished[i].store(true, Ordering::Release);
            });
            assert!(finished.iter().all(|f| f.load(Ordering::Acquire)));
            owner_done.store(true, Ordering::Release);
        });
        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        assert!(
            helped.load(Ordering::Relaxed) > 0,
            "the helper never helped"
        );
        assert!(board.slot(1).is_none(), "the post was left up");
        assert!(!board.help(0), "nothing left to help with");
    }

    /// Waiting busy pays only where the workers share tasks out and none takes another's core.
    #[test]
    fn workers_wait_busy_only_once_tasks_are_shared_and_each_has_a_core() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        for (workers, cores_enough) in [(1, true), (cores, true), (cores + 1, false)] {
            let board = Board::new(workers);
            assert!(
                !board.worth_waiting_for(),
                "{workers} workers: nothing shared yet"
            );
            board.helpers(0).share(1, &|_| {});
            assert_eq!(board.worth_waiting_for(), cores_enough, "{workers} workers");
        }
    }

    /// A worker helps the others, never itself (its own tasks it runs in `share`).
    #[test]
    fn a_worker_never_takes_its_own_tasks_as_help() {
        let board = Board::new(3);
        let helped = AtomicUsize::new(0);
        let runs: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        board.helpers(0).share(3, &|i| {
            runs[i].fetch_add(1, Ordering::Relaxed);
            if i == 0 {
                helped.fetch_add(usize::from(board.help(0)), Ordering::Relaxed);
            }
        });
        assert_eq!(helped.load(Ordering::Relaxed), 0, "worker 0 helped itself");
        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
    }

    /// A task that panics on the helper's thread is counted out, so the owner returns.
    #[test]
    fn a_helper_that_panics_in_a_task_does_not_hang_the_owner() {
        let board = Board::new(2);
        let helper_started = AtomicBool::new(false);
        let owner = std::thread::current().id();
        std::thread::scope(|scope| {
            let helper = scope.spawn(|| while !board.help(0) {});
            board.helpers(1).share(2, &|i| {
                if std::thread::current().id() != owner {
                    helper_started.store(true, Ordering::Release);
                    panic!("task {i} fails on the helper");
                }
                // The owner's first task lasts until the helper has taken the second.
                while !helper_started.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
            });
            assert!(helper.join().is_err(), "the helper's task panicked");
        });
        assert!(board.slot(1).is_none(), "the post was left up");
    }
}
