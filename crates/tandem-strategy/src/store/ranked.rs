//! The parameters of record of a run that spans several processes: every rank keeps
//! a [`HostStore`] of all the parameters, and the stores exchange what their workers need.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tandem_core::{Optimizer, ParamSpan, Replica, ReplicaError, TrainState};

use super::{AsyncStore, HostStore, ParamStore, SyncStore, UpdateAt};
use crate::asynchronous::Schedule;
use crate::exchange::sum_in_order;
use crate::{AsyncRule, Epochs, Exchange};
use tandem_collectives::{Channel, Collectives, Ranks};
use tandem_tensor::{decode_bf16, encode_bf16};

impl<O: Optimizer + ?Sized> HostStore<'_, O> {
    /// The parameters that shards `shards` hold.
    fn params_of(&self, shards: &Range<usize>) -> Range<usize> {
        let start = |index: usize| match index < self.shards.len() {
            true => self.shards.offset(index),
            false => self.len,
        };
        start(shards.start)..start(shards.end)
    }

    /// The parameters of each synchronous share.
    fn share_params(&self) -> Vec<Range<usize>> {
        self.shares.iter().map(|s| self.params_of(s)).collect()
    }

    /// Copies parameters `range` (whole shards) out of the store.
    fn copy_params(&self, range: &Range<usize>, out: &mut Vec<f32>) {
        out.clear();
        for index in 0..self.shards.len() {
            if range.contains(&self.shards.offset(index)) {
                out.extend_from_slice(self.shards.read(index).params());
            }
        }
    }

    /// Overwrites parameters `range` (whole shards) with `values`.
    fn set_params(&self, range: &Range<usize>, values: &[f32]) {
        for index in 0..self.shards.len() {
            let offset = self.shards.offset(index);
            if range.contains(&offset) {
                let mut shard = self.shards.write(index);
                let at = offset - range.start;
                let params = shard.params_mut();
                params.copy_from_slice(&values[at..at + params.len()]);
            }
        }
    }

    /// Gathers every rank's `owned` part of the optimiser state into every rank's store
    /// (collective, on lane 0): the state stays with its owner while training.
    fn gather_state(&self, ranks: &dyn Collectives, owned: &[Range<usize>]) {
        let me = &owned[ranks.rank()];
        let counts: Vec<usize> = owned.iter().map(|r| r.len()).collect();
        let mut all = vec![0.0; self.len];
        for slot in 0..self.slot_names.len() {
            let mut mine = Vec::with_capacity(me.len());
            for index in 0..self.shards.len() {
                if me.contains(&self.shards.offset(index)) {
                    mine.extend_from_slice(&self.shards.read(index).state[slot]);
                }
            }
            ranks.all_gather(0, &mine, &mut all, &counts);
            for index in 0..self.shards.len() {
                let mut shard = self.shards.write(index);
                let range = shard.range();
                shard.state[slot].copy_from_slice(&all[range]);
            }
        }
    }
}

/// Synchronous training across ranks. Global worker `g` (rank `g / local`, local worker
/// `g % local`) owns share `g` of the parameters, as worker `g` of one process would. A step's
/// update of share `g`:
///
/// 1. on lane `g % local`, every rank sends each of its workers' gradients of the shares of
///    that lane to their owners (all-to-all), so the owner holds every worker's gradients of
///    its share, in global worker order;
/// 2. the owner updates its share with their mean, summed in that order: the arithmetic of
///    one process, bitwise;
/// 3. every rank gathers the updated shares of the lane (all-gather).
///
/// Each rank sends `local + 1` times its part of the parameters per step and receives as
/// much: about `(local + 1) * parameters`, whatever the number of ranks. The optimiser's
/// state stays with the share's owner until [`save_into`](ParamStore::save_into) gathers it.
///
/// With [`Sends`] in `bf16` the gradients travel divided by the run's worker count and rounded
/// (step 1), and the owner sums them in `f32` in global worker order, which is their mean; the
/// updated shares travel in `bf16` where the replicas compute in it (step 3), and the owners'
/// `f32` values are gathered before a save.
pub(crate) struct RankedSyncStore<'o, 'r, O: Optimizer + ?Sized> {
    host: HostStore<'o, O>,
    ranks: &'r dyn Collectives,
    local: usize,
    sends: Sends,
    /// Each global worker's share, as parameters.
    shares: Vec<Range<usize>>,
    /// Per lane: what it exchanges.
    scratch: Vec<Mutex<Scratch>>,
}

/// What a synchronous run across ranks sends: its gradients, and its updated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sends {
    /// The gradients' type.
    pub gradients: Exchange,
    /// The updated shares' type.
    pub params: Exchange,
}

/// One lane's buffers: the gradients sent and received, this rank's updated share, the
/// parameters gathered; their 16-bit forms; the mean of 16-bit gradients.
#[derive(Default)]
struct Scratch {
    send: Vec<f32>,
    received: Vec<f32>,
    own: Vec<f32>,
    gathered: Vec<f32>,
    send_half: Vec<u16>,
    received_half: Vec<u16>,
    mean: Vec<f32>,
}

impl<'o, 'r, O: Optimizer + ?Sized> RankedSyncStore<'o, 'r, O> {
    /// The store of rank `ranks.rank()`, with `local` workers on every rank. Collective: opens
    /// `local` lanes.
    pub fn new(
        state: &TrainState,
        layout: &[ParamSpan],
        optimizer: &'o O,
        ranks: &'r dyn Collectives,
        local: usize,
        sends: Sends,
    ) -> Self {
        let host = HostStore::with_shares(state, layout, optimizer, local, ranks.ranks() * local);
        let shares = host.share_params();
        ranks.open_lanes(local);
        Self {
            host,
            ranks,
            local,
            sends,
            shares,
            scratch: (0..local).map(|_| Mutex::new(Default::default())).collect(),
        }
    }

    /// The shares of lane `lane`, one per rank, in rank order.
    fn lane_shares(&self, lane: usize) -> impl Iterator<Item = &Range<usize>> + '_ {
        (0..self.ranks.ranks()).map(move |rank| &self.shares[rank * self.local + lane])
    }

    /// The parameters each rank owns: its workers' shares, contiguous.
    fn owned(&self) -> Vec<Range<usize>> {
        (0..self.ranks.ranks())
            .map(|rank| {
                let first = &self.shares[rank * self.local];
                let last = &self.shares[rank * self.local + self.local - 1];
                first.start..last.end
            })
            .collect()
    }
}

impl<R: Replica, O: Optimizer + ?Sized> ParamStore<R> for RankedSyncStore<'_, '_, O> {
    fn load(&self, worker: usize, replica: &mut R) -> Result<(), ReplicaError> {
        self.host.load(worker, replica)
    }

    fn l2_loss(&self, worker: usize, weight_decay: f32) -> Result<f32, ReplicaError> {
        ParamStore::<R>::l2_loss(&self.host, worker, weight_decay)
    }

    /// Collective: every rank saves at the same step.
    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError> {
        let owned = self.owned();
        self.host.gather_state(self.ranks, &owned);
        if self.sends.params != Exchange::F32 {
            // The others' shares arrived rounded: their owners' f32 values, for the record.
            let me = &owned[self.ranks.rank()];
            let counts: Vec<usize> = owned.iter().map(Range::len).collect();
            let (mut mine, mut all) = (Vec::new(), vec![0.0; self.host.len]);
            self.host.copy_params(me, &mut mine);
            self.ranks.all_gather(0, &mine, &mut all, &counts);
            for (rank, range) in owned.iter().enumerate() {
                if rank != self.ranks.rank() {
                    self.host.set_params(range, &all[range.clone()]);
                }
            }
        }
        ParamStore::<R>::save_into(&self.host, state)
    }

    /// Never: a copy needs every rank, and this is asked for when a worker hangs.
    fn consistent_copy(&self, _: &dyn Fn() -> Option<u64>) -> Option<TrainState> {
        None
    }

    fn empty_state(&self, step: u64) -> TrainState {
        ParamStore::<R>::empty_state(&self.host, step)
    }
}

impl<R: Replica, O: Optimizer + ?Sized> SyncStore<R> for RankedSyncStore<'_, '_, O> {
    fn publish(&self, worker: usize, replica: &mut R) -> Result<(), ReplicaError> {
        SyncStore::<R>::publish(&self.host, worker, replica)
    }

    fn update_share(&self, worker: usize, step: u64, epoch: f64) -> Result<(), ReplicaError> {
        let lane = worker;
        let mut scratch = self.scratch[lane].lock().unwrap_or_else(|p| p.into_inner());
        let Scratch {
            send,
            received,
            own,
            gathered,
            send_half,
            received_half,
            mean,
        } = &mut *scratch;
        let mine = self.shares[self.ranks.rank() * self.local + lane].clone();
        let ranks = self.ranks.ranks();

        // 1. Every local worker's gradients of each rank's share on this lane, to that rank.
        send.clear();
        let mut send_counts = Vec::with_capacity(ranks);
        {
            let grads: Vec<_> = self
                .host
                .grads
                .iter()
                .map(|g| g.read().unwrap_or_else(|p| p.into_inner()))
                .collect();
            for share in self.lane_shares(lane) {
                for g in &grads {
                    send.extend_from_slice(&g[share.clone()]);
                }
                send_counts.push(self.local * share.len());
            }
        }
        let recv_counts = vec![self.local * mine.len(); ranks];
        received.resize(recv_counts.iter().sum(), 0.0);
        match self.sends.gradients {
            Exchange::F32 => {
                self.ranks
                    .all_to_all(lane, send, &send_counts, received, &recv_counts);
            }
            Exchange::Bf16 => {
                // Divided before the rounding (PyTorch DDP's compression hooks do the same),
                // so that their sum on arrival is the mean.
                let workers = (ranks * self.local) as f32;
                send.iter_mut().for_each(|g| *g /= workers);
                encode_bf16(send, send_half);
                received_half.resize(received.len(), 0);
                self.ranks.all_to_all_half(
                    lane,
                    send_half,
                    &send_counts,
                    received_half,
                    &recv_counts,
                );
                decode_bf16(received_half, received);
            }
        }

        // 2. The update of this worker's share, the gradients in global worker order.
        if !mine.is_empty() {
            let parts: Vec<&[f32]> = match self.sends.gradients {
                Exchange::F32 => received.chunks(mine.len()).collect(),
                Exchange::Bf16 => {
                    // Their f32 sum in worker order: the mean, one part to average.
                    sum_in_order(received.chunks(mine.len()), mine.len(), mean);
                    vec![&mean[..]]
                }
            };
            for index in self.host.shares[self.ranks.rank() * self.local + lane].clone() {
                self.host.shards.write(index).update(
                    self.host.optimizer,
                    &parts,
                    mine.start,
                    UpdateAt::full(step, epoch),
                );
            }
        }

        // 3. Every rank's updated share of this lane.
        let counts: Vec<usize> = self.lane_shares(lane).map(Range::len).collect();
        self.host.copy_params(&mine, own);
        gathered.resize(counts.iter().sum(), 0.0);
        match self.sends.params {
            Exchange::F32 => self.ranks.all_gather(lane, own, gathered, &counts),
            Exchange::Bf16 => {
                encode_bf16(own, send_half);
                received_half.resize(gathered.len(), 0);
                self.ranks
                    .all_gather_half(lane, send_half, received_half, &counts);
                decode_bf16(received_half, gathered);
            }
        }
        let mut at = 0;
        for (rank, share) in self.lane_shares(lane).enumerate() {
            if rank != self.ranks.rank() {
                self.host.set_params(share, &gathered[at..at + share.len()]);
            }
            at += share.len();
        }
        Ok(())
    }
}

/// What a worker asks a rank's service (the first value of a request's header).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u64)]
enum Request {
    /// Rank 0: the next batch ticket and the updates begun so far (the version read), with
    /// rank 0's part of the parameters. The second header value is 1 when the asking rank
    /// wants the run to stop.
    TicketFetch,
    /// Rank 0: begin an update, applying these gradients of rank 0's part (the payload) at
    /// once; the reply is the update's step.
    PushBegin,
    /// The owner's current parameters.
    Fetch,
    /// Apply these gradients (the payload) to the owner's parameters as update `header[1]`.
    Push,
    /// The sending rank's workers are done.
    Done,
}

impl Request {
    const ALL: [Request; 5] = [
        Request::TicketFetch,
        Request::PushBegin,
        Request::Fetch,
        Request::Push,
        Request::Done,
    ];
}

/// The tag of [`Request::Done`]: no worker's lane (lanes are local worker indices).
const DONE_TAG: u16 = i16::MAX as u16;

/// How long a rank's service sleeps when no request waits: short next to a step (ms), long
/// enough that an idle service costs its core nothing.
const POLL: std::time::Duration = std::time::Duration::from_micros(20);

/// A ticket that says the run is over.
const NO_TICKET: u64 = u64::MAX;

/// What a worker of a rank other than 0 got from rank 0 in the round trip that also brought its
/// ticket or its step, kept for the call that uses it.
#[derive(Default)]
struct FromRank0 {
    /// Rank 0's part of the parameters, fetched with the ticket, for the next `load`.
    params: Vec<f32>,
    /// The step of the update being applied, for `begin`.
    step: u64,
    /// The version of the parameters the worker's ticket came with (every rank): its next
    /// update's gradients are computed from them.
    read: u64,
}

/// Asynchronous training across ranks, parameter-server style: the parameters are sharded over
/// the ranks (rank `q` owns `owned[q]`, whole shards of its [`HostStore`]), and each rank runs a
/// service ([`Schedule::serve`]) that answers for its part: the current parameters to a worker
/// that fetches them, and each pushed update applied in step order (one that overtook an
/// earlier step's waits for it), as one worker's updates land. Rank 0's service also hands out
/// the batch tickets and counts the updates begun, for every worker of every rank, so staleness
/// (updates begun between a worker's read and its own) is measured across all of them. Nobody waits for anybody but the owners'
/// answers: per update, a worker of rank `r > 0` makes two round trips to rank 0 (ticket with
/// rank 0's part; rank 0's gradients with the step), one to every other rank (its part), and
/// sends every other rank its gradients.
pub(crate) struct RankedAsyncStore<'o, 'r, O: Optimizer + ?Sized> {
    host: HostStore<'o, O>,
    ranks: &'r dyn Ranks,
    owned: Vec<Range<usize>>,
    end_step: u64,
    /// The schedule's epochs, for the updates rank 0's service begins.
    epochs: Epochs,
    /// Per local worker: what it got from rank 0 (on ranks other than 0) and its read version.
    from_rank0: Vec<Mutex<FromRank0>>,
    /// What updates do about staleness.
    rule: AsyncRule,
    /// Rank 0's counters (unused elsewhere).
    tickets: AtomicU64,
    begun: AtomicU64,
    stop: AtomicBool,
    /// This rank's part's updates, applied in step order.
    in_order: Mutex<InOrder>,
}

/// The updates of a rank's part in step order, as one worker's land (its
/// moving average's decay and its learning rate are the step's): updates arrive from every
/// rank, and one may overtake another.
struct InOrder {
    /// The step the part's next update must be.
    next: u64,
    /// Updates that arrived before their predecessors: step, then gradients and rate scale.
    early: BTreeMap<u64, (Vec<f32>, f32)>,
}

impl<'o, 'r, O: Optimizer + ?Sized> RankedAsyncStore<'o, 'r, O> {
    /// The store of rank `ranks.rank()`, with `local` workers, for a run from `state` to
    /// `end_step` over `epochs`, its updates treating staleness by `rule`.
    pub fn new(
        state: &TrainState,
        layout: &[ParamSpan],
        optimizer: &'o O,
        ranks: &'r dyn Ranks,
        local: usize,
        (end_step, epochs): (u64, Epochs),
        rule: AsyncRule,
    ) -> Self {
        let host = HostStore::with_shares(state, layout, optimizer, 0, ranks.ranks());
        let owned = host.share_params();
        Self {
            host,
            ranks,
            owned,
            end_step,
            epochs,
            from_rank0: (0..local).map(|_| Mutex::default()).collect(),
            rule,
            tickets: AtomicU64::new(state.step),
            begun: AtomicU64::new(state.step),
            stop: AtomicBool::new(false),
            in_order: Mutex::new(InOrder {
                next: state.step,
                early: BTreeMap::new(),
            }),
        }
    }

    fn mine(&self) -> &Range<usize> {
        &self.owned[self.ranks.rank()]
    }

    fn kept_from_rank0(&self, lane: usize) -> std::sync::MutexGuard<'_, FromRank0> {
        self.from_rank0[lane]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Rank 0: the next ticket and the updates begun (or [`NO_TICKET`]).
    fn next_ticket(&self, stop: bool) -> [u64; 2] {
        if stop {
            self.stop.store(true, Ordering::Relaxed);
        }
        if self.stop.load(Ordering::Relaxed) {
            return [NO_TICKET, 0];
        }
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        if ticket >= self.end_step {
            return [NO_TICKET, 0];
        }
        [ticket, self.begun.load(Ordering::Acquire)]
    }

    /// Applies update `step` with `grads` (of this rank's part) to this rank's part, its
    /// learning rate scaled by `rate_scale`, once every earlier step's is applied: an update
    /// that arrives early waits, copied, for those (every step reaches every rank).
    fn update_mine(&self, grads: &[f32], step: u64, rate_scale: f32) {
        let mut order = self.in_order.lock().unwrap_or_else(|p| p.into_inner());
        if step != order.next {
            order.early.insert(step, (grads.to_vec(), rate_scale));
            return;
        }
        self.apply_mine(grads, step, rate_scale);
        order.next += 1;
        let order = &mut *order;
        while let Some((grads, rate_scale)) = order.early.remove(&order.next) {
            self.apply_mine(&grads, order.next, rate_scale);
            order.next += 1;
        }
    }

    /// Applies update `step` to this rank's part.
    fn apply_mine(&self, grads: &[f32], step: u64, rate_scale: f32) {
        let mine = self.mine();
        let at = UpdateAt {
            step,
            epoch: self.epochs.epoch_at(step),
            rate_scale,
        };
        for index in self.host.shares[self.ranks.rank()].clone() {
            self.host
                .shards
                .write(index)
                .update(self.host.optimizer, &[grads], mine.start, at);
        }
    }

    /// Answers requests until every rank's workers are done ([`Schedule::done`]).
    fn serve_requests(&self) {
        prefer_prompt_wakeups();
        let (mut header, mut payload, mut params) = (Vec::new(), Vec::new(), Vec::new());
        let mut done = 0;
        while done < self.ranks.ranks() {
            let Some((from, tag)) = self.ranks.poll(Channel::Request) else {
                std::thread::sleep(POLL);
                continue;
            };
            self.ranks
                .receive(Channel::Request, from, tag, &mut header, &mut payload);
            let request = header
                .first()
                .and_then(|&kind| Request::ALL.get(kind as usize).copied());
            let reply = |header: &[u64], payload: &[f32]| {
                self.ranks.send(Channel::Reply, from, tag, header, payload)
            };
            let whole = payload.len() == self.mine().len();
            match request {
                Some(Request::TicketFetch) => {
                    let ticket = self.next_ticket(header.get(1) == Some(&1));
                    params.clear();
                    if ticket[0] != NO_TICKET {
                        self.host.copy_params(self.mine(), &mut params);
                    }
                    reply(&ticket, &params);
                }
                Some(Request::PushBegin) if header.len() == 2 && whole => {
                    let step = self.begun.fetch_add(1, Ordering::AcqRel);
                    let scale = self.rule.rate_scale(step.saturating_sub(header[1]));
                    self.update_mine(&payload, step, scale);
                    reply(&[step], &[]);
                }
                Some(Request::Fetch) => {
                    self.host.copy_params(self.mine(), &mut params);
                    reply(&[], &params);
                }
                Some(Request::Push) if header.len() == 3 && whole => {
                    let scale = f32::from_bits(header[2] as u32);
                    self.update_mine(&payload, header[1], scale);
                }
                Some(Request::Done) => done += 1,
                // Only tandem's own ranks send here; anything else is a version mismatch
                // between the ranks' binaries, and guessing would corrupt the run.
                _ => {
                    eprintln!(
                        "error: rank {}: a malformed request from rank {from} (header {header:?}, \
                         {} values): are all ranks running the same tandem?",
                        self.ranks.rank(),
                        payload.len()
                    );
                    self.ranks.abort(70)
                }
            }
        }
    }
}

/// Asks the scheduler to run this thread as soon as it wakes, ahead of computing threads: a
/// time slice of 0.1 ms instead of the default few (EEVDF's custom slice, Linux 6.12 and later:
/// `sched_setattr` with `sched_runtime`, which any user may set). A rank's service sleeps until
/// a request comes and answers in well under that; with the default slice it waited for a
/// computing worker's slice to end (2 ranks on 2 busy cores: about 1.5 ms per fetch, and 16%
/// fewer examples/sec). Elsewhere it does nothing: the request is advice.
#[cfg(target_os = "linux")]
fn prefer_prompt_wakeups() {
    /// `struct sched_attr` (`SCHED_ATTR_SIZE_VER1`), as `sched_setattr(2)` takes it.
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
        util_min: u32,
        util_max: u32,
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: 0,
        priority: 0,
        runtime: 100_000,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: `attr` is a valid `sched_attr` of the size it states, read by the kernel only
    // during the call; pid 0 is this thread. A kernel that refuses it leaves the thread as it
    // was, which is fine.
    unsafe {
        libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0);
    }
}

#[cfg(not(target_os = "linux"))]
fn prefer_prompt_wakeups() {}

impl<O: Optimizer + ?Sized> Schedule for RankedAsyncStore<'_, '_, O> {
    fn ticket(&self, lane: usize, stop: bool) -> Option<(u64, u64)> {
        let [ticket, version] = match self.ranks.rank() {
            0 => self.next_ticket(stop),
            _ => {
                let request = [Request::TicketFetch as u64, u64::from(stop)];
                self.ranks
                    .send(Channel::Request, 0, lane as u16, &request, &[]);
                let mut reply = Vec::new();
                let mut kept = self.kept_from_rank0(lane);
                self.ranks
                    .receive(Channel::Reply, 0, lane as u16, &mut reply, &mut kept.params);
                match reply[..] {
                    [ticket, version] => [ticket, version],
                    _ => [NO_TICKET, 0],
                }
            }
        };
        self.kept_from_rank0(lane).read = version;
        (ticket != NO_TICKET).then_some((ticket, version))
    }

    /// On ranks other than 0 the step came back from rank 0 with its part of the update
    /// (`apply`), just before this call.
    fn begin(&self, lane: usize) -> u64 {
        match self.ranks.rank() {
            0 => self.begun.fetch_add(1, Ordering::AcqRel),
            _ => self.kept_from_rank0(lane).step,
        }
    }

    /// Never asked: [`crate::train_across`] refuses a staleness bound across ranks, since a
    /// rank's update begins at rank 0's service, inside [`AsyncStore::apply`].
    fn claim(&self, lane: usize, _: u64, _: u64) -> Result<u64, u64> {
        debug_assert!(false, "a staleness bound across ranks");
        Ok(self.begin(lane))
    }

    fn complete(&self) {}

    fn version(&self) -> Option<u64> {
        None
    }

    fn serve(&self) {
        self.serve_requests()
    }

    fn done(&self) {
        for rank in 0..self.ranks.ranks() {
            self.ranks.send(
                Channel::Request,
                rank,
                DONE_TAG,
                &[Request::Done as u64],
                &[],
            );
        }
    }

    fn finish(&self) -> (u64, bool) {
        // Rank 0 knows; the others give 0 to the maximum.
        let mut ours = match self.ranks.rank() {
            0 => [
                self.begun.load(Ordering::Acquire),
                u64::from(self.stop.load(Ordering::Relaxed)),
            ],
            _ => [0, 0],
        };
        self.ranks.all_max(0, &mut ours);
        (ours[0], ours[1] == 1)
    }
}

impl<R: Replica, O: Optimizer + ?Sized> ParamStore<R> for RankedAsyncStore<'_, '_, O> {
    fn load(&self, worker: usize, replica: &mut R) -> Result<(), ReplicaError> {
        let lane = worker as u16;
        let me = self.ranks.rank();
        let (mut header, mut payload) = (Vec::new(), Vec::new());
        // Rank 0's part came with the ticket.
        let fetched_with_ticket = |rank: usize| rank == 0 && me != 0;
        let others = || (0..self.ranks.ranks()).filter(move |&r| r != me);
        let mut short = None;
        replica.set_params(&mut |dst| {
            // Ask every owner first, so that they answer while this rank copies its own part.
            for rank in others().filter(|&r| !fetched_with_ticket(r)) {
                self.ranks
                    .send(Channel::Request, rank, lane, &[Request::Fetch as u64], &[]);
            }
            for index in self.host.shares[me].clone() {
                let shard = self.host.shards.read(index);
                dst[shard.range()].copy_from_slice(shard.params());
            }
            for rank in others() {
                let part = &self.owned[rank];
                let mut kept = self.kept_from_rank0(worker);
                if fetched_with_ticket(rank) {
                    std::mem::swap(&mut kept.params, &mut payload);
                } else {
                    self.ranks
                        .receive(Channel::Reply, rank, lane, &mut header, &mut payload);
                }
                if payload.len() != part.len() {
                    short = Some((rank, payload.len(), part.len()));
                    continue;
                }
                dst[part.clone()].copy_from_slice(&payload);
                // Kept for the L2 term of the reported loss.
                self.host.set_params(part, &payload);
            }
        })?;
        match short {
            Some((rank, sent, part)) => Err(format!(
                "rank {rank} sent {sent} parameters for its part of {part}: are all ranks \
                 running the same model?"
            )
            .into()),
            None => Ok(()),
        }
    }

    /// The L2 term of this rank's part now and the others' as its workers last fetched them.
    fn l2_loss(&self, worker: usize, weight_decay: f32) -> Result<f32, ReplicaError> {
        ParamStore::<R>::l2_loss(&self.host, worker, weight_decay)
    }

    /// Collective: every rank saves when the run ends.
    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError> {
        let counts: Vec<usize> = self.owned.iter().map(Range::len).collect();
        let mut mine = Vec::new();
        self.host.copy_params(self.mine(), &mut mine);
        let mut all = vec![0.0; self.host.len];
        self.ranks.all_gather(0, &mine, &mut all, &counts);
        for (rank, part) in self.owned.iter().enumerate() {
            if rank != self.ranks.rank() {
                self.host.set_params(part, &all[part.clone()]);
            }
        }
        self.host.gather_state(self.ranks, &self.owned);
        let order = self.in_order.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(step) = order.early.keys().next() {
            return Err(format!(
                "rank {}: update {step} arrived, but update {} never did",
                self.ranks.rank(),
                order.next
            )
            .into());
        }
        ParamStore::<R>::save_into(&self.host, state)
    }

    /// Never: a copy needs every rank, and this is asked for when a worker hangs.
    fn consistent_copy(&self, _: &dyn Fn() -> Option<u64>) -> Option<TrainState> {
        None
    }

    fn empty_state(&self, step: u64) -> TrainState {
        ParamStore::<R>::empty_state(&self.host, step)
    }
}

impl<R: Replica, O: Optimizer + ?Sized> AsyncStore<R> for RankedAsyncStore<'_, '_, O> {
    fn apply(
        &self,
        (worker, _): (usize, usize),
        replica: &mut R,
        begin: &mut dyn FnMut() -> UpdateAt,
    ) -> Result<bool, ReplicaError> {
        let lane = worker as u16;
        let me = self.ranks.rank();
        replica.read_gradients(&mut |g| {
            if me != 0 {
                // Rank 0 begins the update with its part, and says which step it is.
                // With the version its gradients were computed from: its staleness.
                let request = [Request::PushBegin as u64, self.kept_from_rank0(worker).read];
                self.ranks.send(
                    Channel::Request,
                    0,
                    lane,
                    &request,
                    &g[self.owned[0].clone()],
                );
                let (mut reply, mut none) = (Vec::new(), Vec::new());
                self.ranks
                    .receive(Channel::Reply, 0, lane, &mut reply, &mut none);
                self.kept_from_rank0(worker).step = reply.first().copied().unwrap_or(self.end_step);
            }
            let UpdateAt {
                step, rate_scale, ..
            } = begin();
            let header = [Request::Push as u64, step, u64::from(rate_scale.to_bits())];
            for rank in (1..self.ranks.ranks()).filter(|&r| r != me) {
                self.ranks.send(
                    Channel::Request,
                    rank,
                    lane,
                    &header,
                    &g[self.owned[rank].clone()],
                );
            }
            self.update_mine(&g[self.mine().clone()], step, rate_scale);
        })?;
        // The other ranks' parts come with the next ticket.
        Ok(false)
    }
}
