//! The MPI transport of tandem's runs across processes: `MpiRanks`, the
//! [`tandem_collectives::Collectives`] and [`tandem_collectives::Messages`] over the system's
//! MPI library (e.g.
//! Open MPI, through the `mpi` crate), one rank per process started by `mpirun`.
//!
//! The crate is empty without its `mpi` feature, which needs that library and libclang to
//! build: a workspace build needs no MPI.
#![warn(missing_docs)]
#![cfg(feature = "mpi")]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;

use tandem_collectives::{sent_to_others, Channel, Collectives, Messages};

/// A communicator that worker threads share. MPI is initialised with `MPI_THREAD_MULTIPLE`
/// ([`MpiRanks::init`] refuses a library without it), under which any thread may call MPI on
/// any communicator; the one rule left, that collectives on one communicator are not
/// concurrent, is kept by giving each lane its own.
struct Shared(SimpleCommunicator);

// SAFETY: see `Shared`: the handle is only passed to MPI, which allows any thread to use it.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// How long a waiting thread sleeps between looks for its message: short next to a training
/// step (milliseconds), long enough that waiting costs its core nothing.
const IDLE: std::time::Duration = std::time::Duration::from_micros(20);

/// Why MPI cannot carry a run.
#[derive(Debug, thiserror::Error)]
pub enum MpiError {
    /// MPI was initialised already in this process.
    #[error("MPI is already initialised in this process")]
    AlreadyInitialised,
    /// The MPI library cannot be used from several threads at once.
    #[error(
        "the MPI library offers {0:?} threading, and tandem's workers need Multiple \
         (MPI_THREAD_MULTIPLE): use an MPI built with thread support (Open MPI is)"
    )]
    Threading(Threading),
}

/// The ranks of the `mpirun` job this process belongs to (a process started without `mpirun`
/// is rank 0 of 1). Dropping it finalises MPI.
pub struct MpiRanks {
    // Declared before `universe`: communicators are freed before MPI is finalised.
    lanes: RwLock<Vec<std::sync::Arc<Shared>>>,
    requests: Shared,
    replies: Shared,
    beacons: Shared,
    world: Shared,
    /// [`Collectives::sent_bytes`].
    sent: AtomicU64,
    _universe: Universe,
}

impl MpiRanks {
    /// Initialises MPI for multi-threaded use.
    pub fn init() -> Result<Self, MpiError> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or(MpiError::AlreadyInitialised)?;
        if threading < Threading::Multiple {
            return Err(MpiError::Threading(threading));
        }
        let world = universe.world();
        Ok(Self {
            lanes: RwLock::new(Vec::new()),
            requests: Shared(world.duplicate()),
            replies: Shared(world.duplicate()),
            beacons: Shared(world.duplicate()),
            world: Shared(world),
            sent: AtomicU64::new(0),
            _universe: universe,
        })
    }

    fn lane(&self, lane: usize) -> std::sync::Arc<Shared> {
        let lanes = self.lanes.read().unwrap_or_else(|p| p.into_inner());
        match lanes.get(lane) {
            Some(comm) => comm.clone(),
            // A strategy opens its lanes before its workers use them; this would be its bug,
            // and a job that cannot exchange must not wait forever.
            None => self.abort_with(&format!("MPI lane {lane} used before it was opened")),
        }
    }

    fn channel(&self, channel: Channel) -> &SimpleCommunicator {
        match channel {
            Channel::Request => &self.requests.0,
            Channel::Reply => &self.replies.0,
            Channel::Beacon => &self.beacons.0,
        }
    }

    /// Counts `values` of `T` sent to each of `others` ranks.
    fn count<T>(&self, values: usize, others: usize) {
        let bytes = (values * std::mem::size_of::<T>() * others) as u64;
        self.sent.fetch_add(bytes, Ordering::Relaxed);
    }

    fn all_to_all_of<T: Equivalence>(
        &self,
        lane: usize,
        (send, send_counts): (&[T], &[usize]),
        (recv, recv_counts): (&mut [T], &[usize]),
    ) {
        self.count::<T>(sent_to_others(send_counts, self.rank()), 1);
        let comm = self.lane(lane);
        let (sc, sd) = partition(send_counts);
        let (rc, rd) = partition(recv_counts);
        comm.0.all_to_all_varcount_into(
            &Partition::new(send, sc, sd),
            &mut PartitionMut::new(recv, rc, rd),
        );
    }

    fn all_gather_of<T: Equivalence>(
        &self,
        lane: usize,
        mine: &[T],
        all: &mut [T],
        counts: &[usize],
    ) {
        self.count::<T>(mine.len(), self.ranks() - 1);
        let comm = self.lane(lane);
        let (c, d) = partition(counts);
        comm.0
            .all_gather_varcount_into(mine, &mut PartitionMut::new(all, c, d));
    }

    fn abort_with(&self, message: &str) -> ! {
        eprintln!("error: rank {}: {message}", self.rank());
        self.abort(70)
    }
}

/// `(counts, displacements)` as MPI takes them.
fn partition(counts: &[usize]) -> (Vec<i32>, Vec<i32>) {
    let counts: Vec<i32> = counts.iter().map(|&c| count(c)).collect();
    let displs = counts
        .iter()
        .scan(0i32, |at, &c| {
            let here = *at;
            *at += c;
            Some(here)
        })
        .collect();
    (counts, displs)
}

/// A count as MPI's `int`: a model's parameters are far below 2^31.
fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl Collectives for MpiRanks {
    fn rank(&self) -> usize {
        self.world.0.rank() as usize
    }

    fn ranks(&self) -> usize {
        self.world.0.size() as usize
    }

    fn open_lanes(&self, lanes: usize) {
        let mut open = self.lanes.write().unwrap_or_else(|p| p.into_inner());
        while open.len() < lanes {
            open.push(std::sync::Arc::new(Shared(self.world.0.duplicate())));
        }
    }

    fn all_to_all(
        &self,
        lane: usize,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) {
        self.all_to_all_of(lane, (send, send_counts), (recv, recv_counts));
    }

    fn all_gather(&self, lane: usize, mine: &[f32], all: &mut [f32], counts: &[usize]) {
        self.all_gather_of(lane, mine, all, counts);
    }

    fn all_to_all_half(
        &self,
        lane: usize,
        send: &[u16],
        send_counts: &[usize],
        recv: &mut [u16],
        recv_counts: &[usize],
    ) {
        self.all_to_all_of(lane, (send, send_counts), (recv, recv_counts));
    }

    fn all_gather_half(&self, lane: usize, mine: &[u16], all: &mut [u16], counts: &[usize]) {
        self.all_gather_of(lane, mine, all, counts);
    }

    fn sent_bytes(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn all_sum(&self, lane: usize, values: &mut [f64]) {
        self.count::<f64>(values.len(), self.ranks() - 1);
        let send = values.to_vec();
        self.lane(lane)
            .0
            .all_reduce_into(&send[..], values, SystemOperation::sum());
    }

    fn all_max(&self, lane: usize, values: &mut [u64]) {
        self.count::<u64>(values.len(), self.ranks() - 1);
        let send = values.to_vec();
        self.lane(lane)
            .0
            .all_reduce_into(&send[..], values, SystemOperation::max());
    }

    fn broadcast(&self, bytes: &mut Vec<u8>) {
        let root = self.world.0.process_at_rank(0);
        let mut len = [bytes.len() as u64];
        root.broadcast_into(&mut len[..]);
        bytes.resize(len[0] as usize, 0);
        root.broadcast_into(&mut bytes[..]);
        if self.rank() == 0 {
            self.count::<u8>(bytes.len(), self.ranks() - 1);
        }
    }

    fn abort(&self, code: i32) -> ! {
        self.world.0.abort(code)
    }
}

impl Messages for MpiRanks {
    fn send(&self, channel: Channel, to: usize, tag: u16, header: &[u64], payload: &[f32]) {
        let target = self.channel(channel).process_at_rank(to as i32);
        target.send_with_tag(header, i32::from(tag));
        target.send_with_tag(payload, i32::from(tag));
    }

    fn poll(&self, channel: Channel) -> Option<(usize, u16)> {
        let status = self.channel(channel).any_process().immediate_probe()?;
        Some((status.source_rank() as usize, status.tag() as u16))
    }

    fn receive(
        &self,
        channel: Channel,
        from: usize,
        tag: u16,
        header: &mut Vec<u64>,
        payload: &mut Vec<f32>,
    ) {
        let source = self.channel(channel).process_at_rank(from as i32);
        // Waits asleep rather than in MPI's spinning receive: a rank's service and workers
        // share cores with the computing workers, and a spinning wait would take the core that
        // the answer has to be computed on.
        while source.immediate_probe_with_tag(i32::from(tag)).is_none() {
            std::thread::sleep(IDLE);
        }
        *header = source.receive_vec_with_tag::<u64>(i32::from(tag)).0;
        *payload = source.receive_vec_with_tag::<f32>(i32::from(tag)).0;
    }
}

impl std::fmt::Debug for MpiRanks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiRanks(rank {} of {})", self.rank(), self.ranks())
    }
}
