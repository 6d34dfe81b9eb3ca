//! The cluster of threads against the definitions of the collectives and messages: every rank
//! of a cluster of three sends values that name it, and each checks what arrives against what
//! the definition says it must be, computed here value by value.

use std::sync::Arc;
use std::thread;

use tandem_collectives::threads::{cluster, ThreadRank};
use tandem_collectives::{
    sent_to_others, Channel, Collectives, Messages, Ranks, SharedTransport, Transport,
};

const RANKS: usize = 3;

/// Runs `body` on every rank of a new cluster of [`RANKS`], each on its own thread, and
/// returns what each returned, in rank order.
fn on_every_rank<T: Send>(body: impl Fn(&ThreadRank) -> T + Sync) -> Vec<T> {
    let ranks = cluster(RANKS);
    thread::scope(|scope| {
        let running: Vec<_> = ranks
            .iter()
            .map(|rank| {
                let body = &body;
                scope.spawn(move || body(rank))
            })
            .collect();
        running
            .into_iter()
            .map(|r| r.join().expect("a rank panicked"))
            .collect()
    })
}

/// The value rank `from` sends to rank `to` at position `i` of what it sends there.
fn value(from: usize, to: usize, i: usize) -> f32 {
    (100 * from + 10 * to + i) as f32 + 0.25
}

/// Rank `q` sends `q + r + 1` values to rank `r`: every pair a different count.
fn count(from: usize, to: usize) -> usize {
    from + to + 1
}

#[test]
fn all_to_all_delivers_each_ranks_part_in_rank_order() {
    let received = on_every_rank(|me| {
        me.open_lanes(2);
        let r = me.rank();
        let send_counts: Vec<usize> = (0..RANKS).map(|to| count(r, to)).collect();
        let send: Vec<f32> = (0..RANKS)
            .flat_map(|to| (0..count(r, to)).map(move |i| value(r, to, i)))
            .collect();
        let recv_counts: Vec<usize> = (0..RANKS).map(|from| count(from, r)).collect();
        let mut recv = vec![0.0; recv_counts.iter().sum()];
        // Lane 1: a lane other than the first carries its own exchange.
        me.all_to_all(1, &send, &send_counts, &mut recv, &recv_counts);
        let halves: Vec<u16> = send.iter().map(|&v| v as u16).collect();
        let mut recv_half = vec![0; recv.len()];
        me.all_to_all_half(0, &halves, &send_counts, &mut recv_half, &recv_counts);
        (
            recv,
            recv_half,
            me.sent_bytes(),
            sent_to_others(&send_counts, r),
        )
    });
    for (r, (recv, recv_half, sent, to_others)) in received.into_iter().enumerate() {
        let want: Vec<f32> = (0..RANKS)
            .flat_map(|from| (0..count(from, r)).map(move |i| value(from, r, i)))
            .collect();
        assert_eq!(recv, want, "rank {r}");
        let want_half: Vec<u16> = want.iter().map(|&v| v as u16).collect();
        assert_eq!(recv_half, want_half, "rank {r}");
        // What it sent the others, once in f32 and once in 16 bits; not what it kept.
        let others: usize = (0..RANKS)
            .filter(|&to| to != r)
            .map(|to| count(r, to))
            .sum();
        assert_eq!(to_others, others);
        assert_eq!(sent, (4 + 2) * others as u64, "rank {r}");
    }
}

#[test]
fn all_gather_concatenates_every_ranks_values_in_rank_order() {
    let gathered = on_every_rank(|me| {
        me.open_lanes(1);
        let r = me.rank();
        let counts: Vec<usize> = (0..RANKS).map(|q| q + 1).collect();
        let mine: Vec<f32> = (0..=r).map(|i| value(r, r, i)).collect();
        let mut all = vec![0.0; counts.iter().sum()];
        me.all_gather(0, &mine, &mut all, &counts);
        let mine_half: Vec<u16> = (0..=r).map(|i| (1000 * r + i) as u16).collect();
        let mut all_half = vec![0; all.len()];
        me.all_gather_half(0, &mine_half, &mut all_half, &counts);
        (all, all_half, me.sent_bytes())
    });
    let want: Vec<f32> = (0..RANKS)
        .flat_map(|q| (0..=q).map(move |i| value(q, q, i)))
        .collect();
    let want_half: Vec<u16> = (0..RANKS)
        .flat_map(|q| (0..=q).map(move |i| (1000 * q + i) as u16))
        .collect();
    for (r, (all, all_half, sent)) in gathered.into_iter().enumerate() {
        assert_eq!(all, want, "rank {r}");
        assert_eq!(all_half, want_half, "rank {r}");
        // Its own r + 1 values, to each of the other ranks, in f32 and in 16 bits.
        assert_eq!(sent, ((4 + 2) * (r + 1) * (RANKS - 1)) as u64, "rank {r}");
    }
}

#[test]
fn all_sum_and_all_max_reduce_over_every_rank() {
    let reduced = on_every_rank(|me| {
        me.open_lanes(1);
        let r = me.rank() as f64;
        let mut sums = [r, 0.5 * r, -1.0, 1e300 * r];
        me.all_sum(0, &mut sums);
        // Maxima above 2^53 and in the high half: the values are exact, not f64's nearest.
        let big = (1u64 << 60) + 1;
        let mut maxima = [
            me.rank() as u64,
            big - me.rank() as u64,
            7,
            u64::MAX * u64::from(me.rank() == 1),
        ];
        me.all_max(0, &mut maxima);
        (sums, maxima, me.sent_bytes())
    });
    for (sums, maxima, sent) in reduced {
        assert_eq!(sums, [3.0, 1.5, -3.0, 3e300]);
        assert_eq!(maxima, [2, (1u64 << 60) + 1, 7, u64::MAX]);
        assert_eq!(sent, 2 * 8 * 4 * (RANKS as u64 - 1));
    }
}

#[test]
fn broadcast_gives_every_rank_rank_0s_bytes() {
    let bytes = on_every_rank(|me| {
        let mut bytes = match me.rank() {
            0 => (0..=255u8).rev().collect(),
            r => vec![r as u8; 3],
        };
        me.broadcast(&mut bytes);
        (bytes, me.sent_bytes())
    });
    for (r, (got, sent)) in bytes.into_iter().enumerate() {
        assert_eq!(got, (0..=255u8).rev().collect::<Vec<_>>(), "rank {r}");
        // Only rank 0 sends: its 256 bytes to each other rank.
        let want = if r == 0 { 256 * (RANKS as u64 - 1) } else { 0 };
        assert_eq!(sent, want, "rank {r}");
    }
}

#[test]
fn messages_arrive_by_source_tag_and_channel_in_the_order_sent() {
    let ranks = cluster(2);
    let (zero, one) = (&ranks[0], &ranks[1]);
    assert_eq!((zero.rank(), one.rank(), one.ranks()), (0, 1, 2));
    assert_eq!(one.poll(Channel::Request), None);
    one.send(Channel::Request, 0, 5, &[1, 2], &[0.5]);
    one.send(Channel::Request, 0, 6, &[3], &[]);
    one.send(Channel::Request, 0, 5, &[4], &[1.5, 2.5]);
    one.send(Channel::Beacon, 0, 5, &[9], &[]);
    // Nothing crossed over to another rank or channel.
    assert_eq!(one.poll(Channel::Request), None);
    assert_eq!(zero.poll(Channel::Reply), None);
    assert_eq!(zero.poll(Channel::Request), Some((1, 5)));
    let (mut header, mut payload) = (Vec::new(), Vec::new());
    // A later tag first: the earlier messages of other tags wait.
    zero.receive(Channel::Request, 1, 6, &mut header, &mut payload);
    assert_eq!(
        (header.as_slice(), payload.as_slice()),
        (&[3u64][..], &[][..])
    );
    zero.receive(Channel::Request, 1, 5, &mut header, &mut payload);
    assert_eq!(
        (header.as_slice(), payload.as_slice()),
        (&[1u64, 2][..], &[0.5f32][..])
    );
    zero.receive(Channel::Request, 1, 5, &mut header, &mut payload);
    assert_eq!(
        (header.as_slice(), payload.as_slice()),
        (&[4u64][..], &[1.5f32, 2.5][..])
    );
    assert_eq!(zero.poll(Channel::Request), None);
    assert_eq!(zero.poll(Channel::Beacon), Some((1, 5)));
    // A receive waits for a message still to come.
    thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let (mut header, mut payload) = (Vec::new(), Vec::new());
            one.receive(Channel::Reply, 0, 2, &mut header, &mut payload);
            (header, payload)
        });
        zero.send(Channel::Reply, 1, 2, &[8], &[-1.0]);
        assert_eq!(waiting.join().unwrap(), (vec![8], vec![-1.0]));
    });
}

#[test]
fn a_transport_lends_its_collectives_and_its_messages_where_it_has_them() {
    let ranks: Vec<Arc<ThreadRank>> = cluster(2).into_iter().map(Arc::new).collect();
    let one: Arc<dyn Ranks> = ranks[1].clone();
    let with_messages = SharedTransport::Ranks(one.clone());
    let collectives_only = SharedTransport::Collectives(ranks[1].clone());
    for shared in [&with_messages, &collectives_only] {
        assert_eq!((shared.rank(), shared.ranks()), (1, 2));
        assert_eq!(shared.transport().collectives().rank(), 1);
    }
    assert!(matches!(with_messages.transport(), Transport::Ranks(_)));
    assert_eq!(with_messages.transport().ranks().map(|r| r.rank()), Some(1));
    assert!(collectives_only.transport().ranks().is_none());
    assert_eq!(
        Transport::Collectives(&*one).collectives().ranks(),
        2,
        "a transport of collectives only"
    );
}

#[test]
fn sent_to_others_leaves_out_what_a_rank_keeps() {
    assert_eq!(sent_to_others(&[3, 5, 7], 1), 10);
    assert_eq!(sent_to_others(&[3, 5, 7], 0), 12);
    // A rank past the counts keeps nothing.
    assert_eq!(sent_to_others(&[3, 5], 4), 8);
    assert_eq!(format!("{:?}", cluster(3)[2]), "ThreadRank(2 of 3)");
}
