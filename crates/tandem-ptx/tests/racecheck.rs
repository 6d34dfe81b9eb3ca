//! The shared-memory race check (`Launch::race_check`): hand-written PTX with and without the
//! barriers, warp synchronisations and atomics that make shared accesses race-free.
mod common;

use common::*;
use tandem_ptx::ExecError;

const HEAD: &str = ".version 9.0\n.target sm_75\n.address_size 64\n";

/// A module with a 1 KiB `.shared` array `buf` and one entry `k(.param .u64 out)` running
/// `body` (`%r1` = `%tid.x`, `%rd1` = `out`).
fn kernel_src(body: &str) -> String {
    format!(
        "{HEAD}.shared .align 4 .b8 buf[1024];\n.visible .entry k(\n\t.param .u64 out\n)\n{{\n\t.reg .pred %p<9>;\n\t.reg .b32 %r<40>;\n\t.reg .b64 %rd<20>;\n\tld.param.u64 %rd1, [out];\n\tmov.u32 %r1, %tid.x;\n{body}\n\tret;\n}}\n"
    )
}

/// Runs `src`'s `k` over one block of `block` threads, with the check on or off; the result
/// and the first `out_words` words of `out`.
fn run(src: &str, block: u32, out_words: usize, check: bool) -> (Result<(), ExecError>, Vec<u32>) {
    let m = module(src);
    let k = m.kernel("k").expect("k");
    let mut mem = Mem::new();
    let out = mem.alloc(out_words * 4);
    let args = Args::new().u64(out);
    let l = tandem_ptx::Launch {
        race_check: check,
        profile: false,
        ..launch_of(dim(1, 1, 1), dim(block, 1, 1), &args, 1)
    };
    let r = tandem_ptx::run(&k, &l, &mem);
    (r, mem.u32s(out))
}

/// The 1-based line of `src` holding `needle` (which must occur once).
fn line_of(src: &str, needle: &str) -> usize {
    let hits: Vec<usize> = src
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(hits.len(), 1, "`{needle}` in\n{src}");
    hits[0]
}

/// The launch failed with a shared-memory race message naming everything it should: the
/// offset, and each access's kind (`load`, `store`, `atomic`), thread and line.
fn assert_race(
    r: Result<(), ExecError>,
    offset: u32,
    earlier: (&str, &str, usize),
    later: (&str, &str, usize),
) {
    let msg = match r {
        Err(ExecError::LaunchFailed(msg)) => msg,
        other => panic!("expected a race, got {other:?}"),
    };
    for want in [
        "shared-memory race".to_string(),
        "kernel `k`".to_string(),
        "block (0,0,0)".to_string(),
        format!("shared offset {offset:#x}"),
        format!(
            "{} by thread {} at line {}",
            earlier.0, earlier.1, earlier.2
        ),
        format!("{} by thread {} at line {}", later.0, later.1, later.2),
    ] {
        assert!(msg.contains(&want), "`{want}` not in: {msg}");
    }
}

/// A tree reduction of 1..=64 in shared memory over 64 threads (two warps); `loop_barrier`
/// is the `bar.sync` between its steps.
fn reduction(loop_barrier: bool) -> String {
    let bar = if loop_barrier {
        "\tbar.sync 0; // step barrier"
    } else {
        ""
    };
    kernel_src(&format!(
        "
	mov.u32 %r2, buf;
	shl.b32 %r3, %r1, 2;
	add.u32 %r4, %r2, %r3;
	add.u32 %r5, %r1, 1;
	st.shared.u32 [%r4], %r5; // initial store
	bar.sync 0;
	mov.u32 %r6, 32;
LOOP:
	setp.ge.u32 %p1, %r1, %r6;
	@%p1 bra SKIP;
	shl.b32 %r7, %r6, 2;
	add.u32 %r8, %r4, %r7;
	ld.shared.u32 %r9, [%r8]; // partner load
	ld.shared.u32 %r10, [%r4];
	add.u32 %r10, %r10, %r9;
	st.shared.u32 [%r4], %r10; // step store
SKIP:
{bar}
	shr.u32 %r6, %r6, 1;
	setp.ne.u32 %p2, %r6, 0;
	@%p2 bra LOOP;
	setp.ne.u32 %p3, %r1, 0;
	@%p3 bra DONE;
	ld.shared.u32 %r11, [buf];
	st.global.u32 [%rd1], %r11;
DONE:"
    ))
}

#[test]
fn reduction_with_barriers_is_race_free() {
    let (r, out) = run(&reduction(true), 64, 1, true);
    r.expect("no race");
    assert_eq!(out[0], 64 * 65 / 2);
}

#[test]
fn reduction_without_step_barrier_races() {
    let src = reduction(false);
    let (r, _) = run(&src, 64, 1, true);
    // Thread 0 runs every step alone, reading buf[1] last; thread 1's first step store races.
    assert_race(
        r,
        4,
        ("load", "(0,0,0)", line_of(&src, "partner load")),
        ("store", "(1,0,0)", line_of(&src, "step store")),
    );
}

#[test]
fn check_off_runs_a_racy_kernel() {
    let (r, _) = run(&reduction(false), 64, 1, false);
    r.expect("the check is off by default");
}

#[test]
fn same_thread_store_then_load_is_race_free() {
    let src = kernel_src(
        "
	mov.u32 %r2, buf;
	shl.b32 %r3, %r1, 2;
	add.u32 %r4, %r2, %r3;
	mul.lo.u32 %r5, %r1, 3;
	st.shared.u32 [%r4], %r5;
	ld.shared.u32 %r6, [%r4];
	st.shared.u8 [%r4+1], %r5;
	ld.shared.u16 %r7, [%r4];
	add.u32 %r6, %r6, %r7;
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r6;",
    );
    let (r, out) = run(&src, 64, 64, true);
    r.expect("no race");
    for (t, &v) in out.iter().enumerate() {
        let x = 3 * t as u32;
        assert_eq!(v, x + (x & 0xff | (x & 0xff) << 8), "thread {t}");
    }
}

/// Lanes 0 and 1 swap values through shared memory, with `sync` between the store and the
/// load; `generic` uses generic addresses (`cvta.shared`).
fn exchange(sync: &str, generic: bool) -> String {
    let (st, ld) = if generic {
        (
            "cvta.shared.u64 %rd4, %rd5;\n\tst.u32 [%rd4], %r5; // exchange store",
            "cvta.shared.u64 %rd6, %rd7;\n\tld.u32 %r6, [%rd6]; // exchange load",
        )
    } else {
        (
            "st.shared.u32 [%r4], %r5; // exchange store",
            "ld.shared.u32 %r6, [%r8]; // exchange load",
        )
    };
    kernel_src(&format!(
        "
	mov.u32 %r2, buf;
	shl.b32 %r3, %r1, 2;
	add.u32 %r4, %r2, %r3;
	xor.b32 %r9, %r1, 1;
	shl.b32 %r10, %r9, 2;
	add.u32 %r8, %r2, %r10;
	cvt.u64.u32 %rd5, %r4;
	cvt.u64.u32 %rd7, %r8;
	add.u32 %r5, %r1, 10;
	{st}
	{sync}
	{ld}
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r6;"
    ))
}

#[test]
fn warp_exchange_with_warp_sync_is_race_free() {
    for sync in [
        "bar.warp.sync -1;",
        "bar.warp.sync 3;",
        "shfl.sync.idx.b32 %r20|%p5, %r1, 0, 31, 3;",
        "vote.sync.ballot.b32 %r20, %p5, 3;",
    ] {
        for (generic, check) in [(false, true), (true, true), (false, false)] {
            // With the check off too: `bar.warp.sync` makes lane 0 wait for lane 1's store.
            let (r, out) = run(&exchange(sync, generic), 2, 2, check);
            r.unwrap_or_else(|e| panic!("{sync} generic {generic}: {e}"));
            assert_eq!(out, [11, 10], "{sync} generic {generic} check {check}");
        }
    }
}

#[test]
fn warp_exchange_without_warp_sync_races() {
    for generic in [false, true] {
        let src = exchange("", generic);
        let (r, _) = run(&src, 2, 2, true);
        // Lane 0 stores buf[0] and loads buf[1] before lane 1 runs; lane 1's store races.
        assert_race(
            r,
            4,
            ("load", "(0,0,0)", line_of(&src, "exchange load")),
            ("store", "(1,0,0)", line_of(&src, "exchange store")),
        );
    }
}

#[test]
fn warp_sync_orders_only_its_own_warp() {
    // Threads 0 and 32 (different warps) exchange, each syncing only its own warp.
    let src = kernel_src(
        "
	mov.u32 %r2, buf;
	and.b32 %r3, %r1, 32;
	shr.u32 %r3, %r3, 3;
	add.u32 %r4, %r2, %r3;
	xor.b32 %r9, %r3, 4;
	add.u32 %r8, %r2, %r9;
	setp.ne.u32 %p1, %r1, 0;
	setp.ne.u32 %p2, %r1, 32;
	and.pred %p3, %p1, %p2;
	@!%p3 st.shared.u32 [%r4], %r1; // lane 0 store
	bar.warp.sync -1;
	@!%p3 ld.shared.u32 %r6, [%r8]; // lane 0 load",
    );
    let (r, _) = run(&src, 64, 1, true);
    // Both stores happen before either warp is released; thread 0 then loads thread 32's word.
    assert_race(
        r,
        4,
        ("store", "(32,0,0)", line_of(&src, "lane 0 store")),
        ("load", "(0,0,0)", line_of(&src, "lane 0 load")),
    );
}

fn atomics(plain_first: bool) -> String {
    let first = if plain_first {
        "\t@%p1 bra ATOM;\n\tst.shared.u32 [buf], 0; // plain store\nATOM:"
    } else {
        ""
    };
    kernel_src(&format!(
        "
	setp.ne.u32 %p1, %r1, 0;
{first}
	atom.shared.add.u32 %r5, [buf], 1; // atomic add
	red.shared.add.u32 [buf+4], 2;
	atom.shared.max.u32 %r6, [buf+8], %r1;
	bar.sync 0;
	@%p1 bra DONE;
	ld.shared.v2.u32 {{%r7, %r8}}, [buf];
	ld.shared.u32 %r9, [buf+8];
	st.global.v2.u32 [%rd1], {{%r7, %r8}};
	st.global.u32 [%rd1+8], %r9;
DONE:"
    ))
}

#[test]
fn atomics_from_every_thread_are_race_free() {
    let (r, out) = run(&atomics(false), 64, 3, true);
    r.expect("atomics never race with atomics");
    assert_eq!(out, [64, 128, 63]);
}

#[test]
fn atomic_after_plain_store_races() {
    let src = atomics(true);
    let (r, _) = run(&src, 64, 3, true);
    assert_race(
        r,
        0,
        ("store", "(0,0,0)", line_of(&src, "plain store")),
        ("atomic", "(1,0,0)", line_of(&src, "atomic add")),
    );
}

/// Threads 35 and 40 (lanes 3 and 8 of the second warp) synchronise with `sync` over a
/// membermask of their two lanes, which only they hold in a register (so a mask read from any
/// other thread's registers would exclude them), then 35 stores a word that 40 loads, with a
/// second `sync` between them or none.
fn second_warp_pair(sync: &str, second_sync: bool) -> String {
    let second = if second_sync { sync } else { "" };
    kernel_src(&format!(
        "
	setp.eq.u32 %p1, %r1, 35;
	setp.eq.u32 %p2, %r1, 40;
	or.pred %p3, %p1, %p2;
	@!%p3 bra DONE;
	mov.u32 %r21, 264;
	{sync}
	@%p1 st.shared.u32 [buf+1020], %r1; // pair store
	{second}
	@%p2 ld.shared.u32 %r6, [buf+1020]; // pair load
	@%p2 st.global.u32 [%rd1], %r6;
DONE:"
    ))
}

/// The warp-synchronous instructions that order shared accesses, over the mask in `%r21`.
const PAIR_SYNCS: [&str; 3] = [
    "bar.warp.sync %r21;",
    "shfl.sync.idx.b32 %r20|%p5, %r1, 3, 31, %r21;",
    "vote.sync.ballot.b32 %r20, %p5, %r21;",
];

#[test]
fn warp_sync_of_some_lanes_orders_them_in_a_later_warp() {
    // Each thread's knowledge is of the lanes of its own warp: lane 3's store is ordered
    // before lane 8's load by the sync of those two lanes alone (lane 1, thread 33, took part
    // in none).
    for sync in PAIR_SYNCS {
        let (r, out) = run(&second_warp_pair(sync, true), 64, 1, true);
        r.unwrap_or_else(|e| panic!("{sync}: {e}"));
        assert_eq!(out[0], 35, "{sync}");
    }
}

#[test]
fn a_store_after_the_last_warp_sync_races_with_the_partners_load() {
    // A store made after a synchronisation is not ordered by it: the check must record the
    // storing thread's clock as it is then, not as some other lane's. The word is shared
    // memory's last.
    for sync in PAIR_SYNCS {
        let src = second_warp_pair(sync, false);
        let (r, _) = run(&src, 64, 1, true);
        assert_race(
            r,
            1020,
            ("store", "(35,0,0)", line_of(&src, "pair store")),
            ("load", "(40,0,0)", line_of(&src, "pair load")),
        );
    }
}

#[test]
fn a_threads_repeated_loads_do_not_hide_another_threads() {
    // Thread 0 loads a word, thread 1 loads it twice and synchronises with thread 2, which then
    // stores it: thread 1's loads are ordered before the store, thread 0's is not. The check
    // keeps the last two readers that are distinct threads, not thread 1 twice.
    let src = kernel_src(
        "
	setp.eq.u32 %p1, %r1, 0;
	setp.eq.u32 %p2, %r1, 2;
	@%p2 bra SYNC;
	ld.shared.u32 %r6, [buf]; // first load
	@%p1 bra DONE;
	ld.shared.u32 %r7, [buf];
SYNC:
	bar.warp.sync 6;
	@%p2 st.shared.u32 [buf], %r1; // ordered store
DONE:",
    );
    let (r, _) = run(&src, 3, 1, true);
    assert_race(
        r,
        0,
        ("load", "(0,0,0)", line_of(&src, "first load")),
        ("store", "(2,0,0)", line_of(&src, "ordered store")),
    );
}

#[test]
fn a_shared_access_past_the_end_is_an_error_with_the_check_on() {
    // The check ignores what lies outside shared memory; the access itself is refused.
    let src = kernel_src("\tst.shared.u32 [buf+1024], %r1;");
    for check in [false, true] {
        let (r, _) = run(&src, 1, 1, check);
        match r {
            Err(ExecError::IllegalAddress(msg)) => {
                assert!(
                    msg.contains("shared address 0x400 (4 bytes) outside"),
                    "{msg}"
                )
            }
            other => panic!("check {check}: expected a refused access, got {other:?}"),
        }
    }
}

#[test]
fn vector_shared_accesses_are_checked_too() {
    // Thread 0 stores two words with one vector store; thread 1 loads the second with one
    // vector load of its own, with no barrier between them.
    let src = kernel_src(
        "
	setp.ne.u32 %p1, %r1, 0;
	@%p1 bra LOAD;
	st.shared.v2.u32 [buf], {%r1, %r1}; // vector store
	bra.uni DONE;
LOAD:
	ld.shared.v2.u32 {%r6, %r7}, [buf]; // vector load
DONE:",
    );
    let (r, _) = run(&src, 2, 1, true);
    assert_race(
        r,
        0,
        ("store", "(0,0,0)", line_of(&src, "vector store")),
        ("load", "(1,0,0)", line_of(&src, "vector load")),
    );
}
