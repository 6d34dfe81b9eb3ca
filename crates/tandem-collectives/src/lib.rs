//! The exchanges between the processes of one run. A transport implements [`Collectives`]
//! (all-to-all, all-gather, all-reduce, broadcast: all that synchronous data parallelism needs)
//! and, where it can carry them, [`Messages`] (point-to-point messages: an asynchronous run's
//! parameter service, and the signs of life by which rank 0 names a rank that stopped). A
//! transport with both is a [`Ranks`]; a run takes either as a [`Transport`].
//!
//! Implementations: [`threads::cluster`] (ranks as threads of this process, for tests) here,
//! and MPI in `tandem-mpi`. Another (NCCL, say) may implement the collectives only.
//!
//! Every rank runs the same program with the same number of local workers; the run's workers
//! are the ranks' local workers in rank order (global worker `rank * local + worker`), so the
//! global batch, the data order and the schedule do not depend on how the workers are spread
//! over processes.
#![warn(missing_docs)]

pub mod threads;

use std::sync::Arc;

/// The collective exchanges between the processes of one run. Collectives run on a *lane*:
/// every rank's call on lane `l` takes part in the same exchange, and different lanes may
/// exchange at the same time from different threads (a worker's lane is its local index). An
/// implementation's failure to communicate ends the whole job: none of these returns an error
/// (MPI's default error handler aborts every rank).
pub trait Collectives: Sync + std::fmt::Debug {
    /// This process's rank, `0..ranks()`.
    fn rank(&self) -> usize;

    /// The number of processes in the run.
    fn ranks(&self) -> usize;

    /// Makes lanes `0..lanes` usable. Collective: every rank calls it with the same count,
    /// from one thread, before any worker exchanges on those lanes.
    fn open_lanes(&self, lanes: usize);

    /// Sends `send_counts[q]` consecutive values of `send` to rank `q`, for every `q` in rank
    /// order, and receives `recv_counts[q]` from each into `recv`, in rank order.
    fn all_to_all(
        &self,
        lane: usize,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    );

    /// Gives every rank every rank's `mine`, concatenated in rank order into `all`
    /// (`counts[q]` values from rank `q`).
    fn all_gather(&self, lane: usize, mine: &[f32], all: &mut [f32], counts: &[usize]);

    /// [`all_to_all`](Self::all_to_all) of 16-bit values (the bit patterns of `bf16` or
    /// `f16`, which travel unchanged): half the bytes of `f32`.
    fn all_to_all_half(
        &self,
        lane: usize,
        send: &[u16],
        send_counts: &[usize],
        recv: &mut [u16],
        recv_counts: &[usize],
    );

    /// [`all_gather`](Self::all_gather) of 16-bit values.
    fn all_gather_half(&self, lane: usize, mine: &[u16], all: &mut [u16], counts: &[usize]);

    /// The bytes of this rank's own values that its collectives so far addressed to other
    /// ranks: all-to-all, what it sends to the others; all-gather, its part once for each other
    /// rank; all-sum and all-max, its values once for each other rank; broadcast, rank 0's
    /// bytes once for each other rank. (An MPI library may route them otherwise, through a
    /// ring or a tree; this is the payload, what a compression of it halves.)
    fn sent_bytes(&self) -> u64;

    /// Replaces each of `values` by its sum over the ranks.
    fn all_sum(&self, lane: usize, values: &mut [f64]);

    /// Replaces each of `values` by its maximum over the ranks.
    fn all_max(&self, lane: usize, values: &mut [u64]);

    /// Gives every rank rank 0's `bytes` (of any length). Collective, on no lane: no worker may
    /// be exchanging.
    fn broadcast(&self, bytes: &mut Vec<u8>);

    /// Ends every rank's process at once with exit status `code`: how a rank that cannot go on
    /// keeps the others from waiting for it forever.
    fn abort(&self, code: i32) -> !;
}

/// The values an all-to-all with `send_counts` (per rank, in rank order) sends from rank `rank`
/// to the other ranks: what [`Collectives::sent_bytes`] counts of it, in values.
pub fn sent_to_others(send_counts: &[usize], rank: usize) -> usize {
    let total: usize = send_counts.iter().sum();
    total - send_counts.get(rank).copied().unwrap_or(0)
}

/// Which of the point-to-point channels a message travels on: requests to a rank's parameter
/// service, the replies to them (kept apart so that a service polling for requests never takes
/// a reply meant for a worker), and signs of life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// To a rank's service.
    Request,
    /// From a service back to the worker that asked.
    Reply,
    /// Signs of life: every rank but 0 tells rank 0, about once a second while it trains, how
    /// far it has got, so that rank 0 can name a rank that stopped.
    Beacon,
}

/// Point-to-point messages between the processes of one run (of the ranks its
/// [`Collectives`] number). Like the collectives, a failure to communicate ends the job.
pub trait Messages: Sync + std::fmt::Debug {
    /// Sends `header` and then `payload` to rank `to` on `channel` with `tag`. Messages from
    /// one thread to one rank with one tag arrive in the order sent.
    fn send(&self, channel: Channel, to: usize, tag: u16, header: &[u64], payload: &[f32]);

    /// The source and tag of a message waiting on `channel` to be received, if any (never
    /// blocks).
    fn poll(&self, channel: Channel) -> Option<(usize, u16)>;

    /// Receives the next message from `from` on `channel` with `tag` (waiting for it): its
    /// header into `header` (as many values as were sent) and its payload into `payload`.
    fn receive(
        &self,
        channel: Channel,
        from: usize,
        tag: u16,
        header: &mut Vec<u64>,
        payload: &mut Vec<f32>,
    );
}

/// A transport with both collectives and messages: what every mode of training needs.
pub trait Ranks: Collectives + Messages {}

impl<T: Collectives + Messages + ?Sized> Ranks for T {}

/// What a run across processes exchanges over.
#[derive(Debug, Clone, Copy)]
pub enum Transport<'a> {
    /// Collectives only: synchronous runs.
    Collectives(&'a dyn Collectives),
    /// Collectives and messages: both modes.
    Ranks(&'a dyn Ranks),
}

impl<'a> Transport<'a> {
    /// The transport's collectives.
    pub fn collectives(self) -> &'a dyn Collectives {
        match self {
            Self::Collectives(collectives) => collectives,
            Self::Ranks(ranks) => ranks,
        }
    }

    /// Its messages too, when it carries them.
    pub fn ranks(self) -> Option<&'a dyn Ranks> {
        match self {
            Self::Collectives(_) => None,
            Self::Ranks(ranks) => Some(ranks),
        }
    }
}

/// A run's transport held for the run's life (by a run driver, say), shared with whoever else
/// holds it. It dereferences to its [`Collectives`].
#[derive(Debug, Clone)]
pub enum SharedTransport {
    /// Collectives only: synchronous runs.
    Collectives(Arc<dyn Collectives>),
    /// Collectives and messages: both modes.
    Ranks(Arc<dyn Ranks>),
}

impl SharedTransport {
    /// The transport, borrowed (as a run takes it).
    pub fn transport(&self) -> Transport<'_> {
        match self {
            Self::Collectives(collectives) => Transport::Collectives(&**collectives),
            Self::Ranks(ranks) => Transport::Ranks(&**ranks),
        }
    }
}

impl std::ops::Deref for SharedTransport {
    type Target = dyn Collectives;

    fn deref(&self) -> &Self::Target {
        match self {
            Self::Collectives(collectives) => &**collectives,
            Self::Ranks(ranks) => &**ranks,
        }
    }
}
