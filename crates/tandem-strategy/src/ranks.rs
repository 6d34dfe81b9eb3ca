//! The processes of a run: [`Ranks`], the exchanges the strategies make between them when one
//! run spans several processes (MPI ranks, with the crate's `mpi` feature:
//! `mpi::MpiRanks`).
//!
//! Every rank runs the same program with the same number of local workers; the run's workers
//! are the ranks' local workers in rank order (global worker `rank * local + worker`), so the
//! global batch, the data order and the schedule do not depend on how the workers are spread
//! over processes.

/// Which of the two point-to-point channels a message travels on: requests to a rank's
/// parameter service, or the replies to them (kept apart so that a service polling for
/// requests never takes a reply meant for a worker).
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

/// The collective and point-to-point exchanges between the processes of one run. Collectives
/// run on a *lane*: every rank's call on lane `l` takes part in the same exchange, and
/// different lanes may exchange at the same time from different threads (a worker's lane is
/// its local index). An implementation's failure to communicate ends the whole job: none of
/// these returns an error (MPI's default error handler aborts every rank).
pub trait Ranks: Sync + std::fmt::Debug {
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

    /// Replaces each of `values` by its sum over the ranks.
    fn all_sum(&self, lane: usize, values: &mut [f64]);

    /// Replaces each of `values` by its maximum over the ranks.
    fn all_max(&self, lane: usize, values: &mut [u64]);

    /// Gives every rank rank 0's `bytes` (of any length). Collective, on no lane: no worker may
    /// be exchanging.
    fn broadcast(&self, bytes: &mut Vec<u8>);

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

    /// Ends every rank's process at once with exit status `code`: how a rank that cannot go on
    /// keeps the others from waiting for it forever.
    fn abort(&self, code: i32) -> !;
}
