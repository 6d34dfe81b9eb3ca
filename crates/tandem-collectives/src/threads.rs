//! [`Ranks`](crate::Ranks) between threads of this process: a cluster of `n` ranks, each a thread, that
//! exchange through shared memory exactly what MPI ranks would send each other. The strategies
//! cannot tell it from MPI, so a run across ranks is tested without an MPI library
//! (`tandem-strategy`'s tests run on it, and `tandem-train` opens its trainer on it;
//! `mnist-train`'s `tests/mpi.rs` runs the real transport under `mpirun`). Values travel as
//! f64, which carries every f32 and every byte exactly.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex, PoisonError};

use crate::{sent_to_others, Channel, Collectives, Messages};

/// A message on its way: source, tag, header, payload.
type Message = (usize, u16, Vec<u64>, Vec<f32>);

/// What every rank's collective on one lane posts: its send buffer and per-rank counts.
type Posted = Option<(Vec<f64>, Vec<usize>)>;

/// One collective exchange place per lane: every rank posts, all wait, every rank reads, all
/// wait again before the next exchange on the lane reuses it.
struct Lane {
    posted: Mutex<Vec<Posted>>,
    barrier: Barrier,
}

struct Shared {
    ranks: usize,
    lanes: Mutex<Vec<Arc<Lane>>>,
    /// Per rank, per channel: the messages waiting for it, in arrival order.
    inboxes: Vec<[(Mutex<VecDeque<Message>>, Condvar); 3]>,
}

/// One rank of a cluster of threads ([`cluster`]).
pub struct ThreadRank {
    rank: usize,
    shared: Arc<Shared>,
    /// [`Collectives::sent_bytes`].
    sent: AtomicU64,
}

impl std::fmt::Debug for ThreadRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadRank({} of {})", self.rank, self.shared.ranks)
    }
}

/// The `n` ranks of a new cluster, to be handed one to each thread. Every rank must take part
/// in every collective, as under MPI; a rank that does not leaves the others waiting.
pub fn cluster(n: usize) -> Vec<ThreadRank> {
    let shared = Arc::new(Shared {
        ranks: n,
        lanes: Mutex::new(Vec::new()),
        inboxes: (0..n)
            .map(|_| std::array::from_fn(|_| (Mutex::new(VecDeque::new()), Condvar::new())))
            .collect(),
    });
    (0..n)
        .map(|rank| ThreadRank {
            rank,
            shared: shared.clone(),
            sent: AtomicU64::new(0),
        })
        .collect()
}

fn channel_index(channel: Channel) -> usize {
    match channel {
        Channel::Request => 0,
        Channel::Reply => 1,
        Channel::Beacon => 2,
    }
}

impl ThreadRank {
    fn lane(&self, lane: usize) -> Arc<Lane> {
        self.shared
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[lane]
            .clone()
    }

    /// Posts `values` with `counts` on `lane` and returns what every rank posted, in rank order.
    fn exchange(
        &self,
        lane: usize,
        values: Vec<f64>,
        counts: Vec<usize>,
    ) -> Vec<(Vec<f64>, Vec<usize>)> {
        let lane = self.lane(lane);
        lane.posted.lock().unwrap_or_else(PoisonError::into_inner)[self.rank] =
            Some((values, counts));
        lane.barrier.wait();
        let all = lane
            .posted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|p| p.clone().expect("every rank posted"))
            .collect();
        lane.barrier.wait();
        all
    }
}

/// A value type the collectives carry, through f64 (which holds each exactly).
trait Carried: Copy {
    const BYTES: u64;
    fn wide(self) -> f64;
    fn narrow(wide: f64) -> Self;
}

impl Carried for f32 {
    const BYTES: u64 = 4;
    fn wide(self) -> f64 {
        f64::from(self)
    }
    fn narrow(wide: f64) -> Self {
        wide as f32
    }
}

impl Carried for u16 {
    const BYTES: u64 = 2;
    fn wide(self) -> f64 {
        f64::from(self)
    }
    fn narrow(wide: f64) -> Self {
        wide as u16
    }
}

fn wide<T: Carried>(values: &[T]) -> Vec<f64> {
    values.iter().map(|&v| v.wide()).collect()
}

impl ThreadRank {
    /// Counts `values` of `bytes` each sent to each of `others` ranks.
    fn count(&self, values: usize, bytes: u64, others: usize) {
        let sent = values as u64 * bytes * others as u64;
        self.sent.fetch_add(sent, Ordering::Relaxed);
    }

    fn all_to_all_of<T: Carried>(
        &self,
        lane: usize,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) {
        self.count(sent_to_others(send_counts, self.rank), T::BYTES, 1);
        let all = self.exchange(lane, wide(send), send_counts.to_vec());
        let mut at = 0;
        for (from, (values, counts)) in all.iter().enumerate() {
            let start: usize = counts[..self.rank].iter().sum();
            let n = counts[self.rank];
            assert_eq!(
                n, recv_counts[from],
                "rank {from} sends what rank {} expects",
                self.rank
            );
            for (dst, &v) in recv[at..at + n].iter_mut().zip(&values[start..start + n]) {
                *dst = T::narrow(v);
            }
            at += n;
        }
    }

    fn all_gather_of<T: Carried>(&self, lane: usize, mine: &[T], all: &mut [T], counts: &[usize]) {
        self.count(mine.len(), T::BYTES, self.shared.ranks - 1);
        let posted = self.exchange(lane, wide(mine), Vec::new());
        let mut at = 0;
        for (from, (values, _)) in posted.iter().enumerate() {
            assert_eq!(values.len(), counts[from]);
            for (dst, &v) in all[at..at + values.len()].iter_mut().zip(values) {
                *dst = T::narrow(v);
            }
            at += values.len();
        }
    }
}

impl Collectives for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.shared.ranks
    }

    fn open_lanes(&self, lanes: usize) {
        let mut open = self
            .shared
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while open.len() < lanes {
            open.push(Arc::new(Lane {
                posted: Mutex::new(vec![None; self.shared.ranks]),
                barrier: Barrier::new(self.shared.ranks),
            }));
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
        self.all_to_all_of(lane, send, send_counts, recv, recv_counts);
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
        self.all_to_all_of(lane, send, send_counts, recv, recv_counts);
    }

    fn all_gather_half(&self, lane: usize, mine: &[u16], all: &mut [u16], counts: &[usize]) {
        self.all_gather_of(lane, mine, all, counts);
    }

    fn sent_bytes(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn all_sum(&self, lane: usize, values: &mut [f64]) {
        self.count(values.len(), 8, self.shared.ranks - 1);
        let posted = self.exchange(lane, values.to_vec(), Vec::new());
        for (i, v) in values.iter_mut().enumerate() {
            *v = posted.iter().map(|(p, _)| p[i]).sum();
        }
    }

    fn all_max(&self, lane: usize, values: &mut [u64]) {
        self.count(values.len(), 8, self.shared.ranks - 1);
        // u64 values through f64 would round: carried as their two 32-bit halves.
        let halves: Vec<f64> = values
            .iter()
            .flat_map(|&v| [(v >> 32) as f64, (v & 0xFFFF_FFFF) as f64])
            .collect();
        let posted = self.exchange(lane, halves, Vec::new());
        for (i, v) in values.iter_mut().enumerate() {
            *v = posted
                .iter()
                .map(|(p, _)| ((p[2 * i] as u64) << 32) | p[2 * i + 1] as u64)
                .max()
                .unwrap_or(0);
        }
    }

    fn broadcast(&self, bytes: &mut Vec<u8>) {
        if self.rank == 0 {
            self.count(bytes.len(), 1, self.shared.ranks - 1);
        }
        self.open_lanes(1);
        let posted = self.exchange(0, bytes.iter().map(|&b| f64::from(b)).collect(), Vec::new());
        *bytes = posted[0].0.iter().map(|&b| b as u8).collect();
    }

    fn abort(&self, code: i32) -> ! {
        panic!("rank {} aborted the cluster with status {code}", self.rank)
    }
}

impl Messages for ThreadRank {
    fn send(&self, channel: Channel, to: usize, tag: u16, header: &[u64], payload: &[f32]) {
        let (inbox, arrived) = &self.shared.inboxes[to][channel_index(channel)];
        inbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back((self.rank, tag, header.to_vec(), payload.to_vec()));
        arrived.notify_all();
    }

    fn poll(&self, channel: Channel) -> Option<(usize, u16)> {
        let (inbox, _) = &self.shared.inboxes[self.rank][channel_index(channel)];
        inbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .front()
            .map(|(from, tag, ..)| (*from, *tag))
    }

    fn receive(
        &self,
        channel: Channel,
        from: usize,
        tag: u16,
        header: &mut Vec<u64>,
        payload: &mut Vec<f32>,
    ) {
        let (inbox, arrived) = &self.shared.inboxes[self.rank][channel_index(channel)];
        let mut waiting = inbox.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(at) = waiting.iter().position(|m| m.0 == from && m.1 == tag) {
                let (_, _, h, p) = waiting.remove(at).expect("found above");
                (*header, *payload) = (h, p);
                return;
            }
            waiting = arrived
                .wait(waiting)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}
