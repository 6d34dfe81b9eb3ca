//! Hand-written PTX fixtures: warp shuffles, barriers, atomics, faults, parse errors, rounding.
mod common;

use common::*;
use tandem_ptx::{ExecError, Module};

const HEAD: &str = ".version 9.0\n.target sm_75\n.address_size 64\n";

/// A module with one entry `k(.param .u64 out)` and `body`.
fn kernel_src(regs: &str, body: &str) -> String {
    format!(
        "{HEAD}.visible .entry k(\n\t.param .u64 out\n)\n{{\n\t.reg .pred %p<9>;\n\t.reg .b32 %r<40>;\n\t.reg .b64 %rd<20>;\n\t.reg .f32 %f<40>;\n\t.reg .f64 %fd<20>;\n{regs}\n\tld.param.u64 %rd1, [out];\n\tmov.u32 %r1, %tid.x;\n{body}\n\tret;\n}}\n"
    )
}

fn run_src(
    src: &str,
    grid: u32,
    block: u32,
    out_bytes: usize,
) -> (Result<(), ExecError>, Vec<u32>) {
    let m = module(src);
    let k = m.kernel("k").expect("k");
    let mut mem = Mem::new();
    let out = mem.alloc(out_bytes);
    let r = launch(
        &k,
        dim(grid, 1, 1),
        dim(block, 1, 1),
        &Args::new().u64(out),
        &mem,
        2,
    );
    (r, mem.u32s(out))
}

/// The message of a launch that failed as a kernel fault would (anything else panics).
fn failure(r: Result<(), ExecError>) -> String {
    match r {
        Err(ExecError::LaunchFailed(m)) => m,
        other => panic!("expected a failed launch, got {other:?}"),
    }
}

#[test]
fn shfl_all_modes() {
    let body = "
	mul.lo.s32 %r2, %r1, 10;
	shfl.sync.up.b32 %r3|%p1, %r2, 3, 0, -1;
	shfl.sync.down.b32 %r4|%p2, %r2, 5, 31, -1;
	shfl.sync.bfly.b32 %r5, %r2, 6, 31, -1;
	shfl.sync.idx.b32 %r6, %r2, 7, 31, -1;
	shfl.sync.idx.b32 %r7, %r2, 2, 0x181f, -1;
	selp.u32 %r8, 1, 0, %p1;
	selp.u32 %r9, 1, 0, %p2;
	mul.wide.u32 %rd2, %r1, 28;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r3;
	st.global.u32 [%rd3+4], %r4;
	st.global.u32 [%rd3+8], %r5;
	st.global.u32 [%rd3+12], %r6;
	st.global.u32 [%rd3+16], %r7;
	st.global.u32 [%rd3+20], %r8;
	st.global.u32 [%rd3+24], %r9;";
    let (r, out) = run_src(&kernel_src("", body), 1, 64, 64 * 28);
    r.expect("launch");
    for t in 0..64u32 {
        let l = t % 32;
        let w = t - l;
        let v = |lane: u32| (w + lane) * 10;
        let o = &out[t as usize * 7..t as usize * 7 + 7];
        let up = if l >= 3 { v(l - 3) } else { v(l) };
        let down = if l + 5 <= 31 { v(l + 5) } else { v(l) };
        let seg = v((l & 24) | 2);
        assert_eq!(
            o,
            [
                up,
                down,
                v(l ^ 6),
                v(7),
                seg,
                (l >= 3) as u32,
                (l + 5 <= 31) as u32
            ],
            "thread {t}"
        );
    }
}

/// Runs `body` in two warps, with `%r7` holding `%laneid`, then stores `%r3` and `%p2`..`%p4`
/// (as 0/1) of each thread: each warp's own votes, which must agree lane by lane.
fn run_votes(body: &str) -> Vec<u32> {
    let body = format!(
        "\tmov.u32 %r7, %laneid;{body}
	selp.u32 %r4, 1, 0, %p2;
	selp.u32 %r5, 1, 0, %p3;
	selp.u32 %r6, 1, 0, %p4;
	mul.wide.u32 %rd2, %r1, 16;
	add.s64 %rd3, %rd1, %rd2;
	st.global.v4.u32 [%rd3], {{%r3, %r4, %r5, %r6}};"
    );
    let (r, out) = run_src(&kernel_src("", &body), 1, 64, 64 * 16);
    r.expect("launch");
    let (first, second) = out.split_at(32 * 4);
    assert_eq!(first, second, "the second warp's votes");
    out
}

#[test]
fn vote_ballot_any_all() {
    let body = "
	and.b32 %r2, %r1, 1;
	setp.eq.u32 %p1, %r2, 1;
	vote.sync.ballot.b32 %r3, %p1, -1;
	vote.sync.any.pred %p2, %p1, -1;
	vote.sync.all.pred %p3, %p1, -1;
	vote.sync.all.pred %p4, !%p3, -1;
";
    let out = run_votes(body);
    for t in 0..32 {
        assert_eq!(&out[t * 4..t * 4 + 4], [0xaaaa_aaaa, 1, 0, 1]);
    }
}

/// `bar.red` (what `__syncthreads_count/_and/_or` compile to): each thread gets the
/// reduction over the block's live threads (here 64; the last 32 exit first), in nvcc's own
/// spelling with its inner register scope; with a thread count, and a negated predicate.
#[test]
fn barrier_reductions_count_and_and_or_over_the_live_threads() {
    let body = "
	setp.ge.u32 %p8, %r1, 64;
	@%p8 bra $END;
	rem.u32 %r2, %r1, 3;
	setp.eq.u32 %p1, %r2, 0;
	bar.red.popc.u32 %r3, 0, %p1;
	setp.eq.u32 %p2, %r1, 37;
	{
	.reg .pred %p1;
	.reg .pred %p2;
	setp.ne.u32 %p1, %r2, 0;
	bar.red.or.pred %p2, 0, %p1;
	selp.u32 %r4, 1, 0, %p2;
	}
	barrier.red.and.pred %p4, 1, 64, !%p2;
	bar.red.or.pred %p5, 0, !%p1;
	bar.red.and.pred %p6, 0, %p8;
	selp.u32 %r5, 1, 0, %p4;
	selp.u32 %r6, 1, 0, %p5;
	selp.u32 %r7, 1, 0, %p6;
	mul.wide.u32 %rd2, %r1, 32;
	add.s64 %rd3, %rd1, %rd2;
	st.global.v4.u32 [%rd3], {%r3, %r4, %r5, %r6};
	st.global.v4.u32 [%rd3+16], {%r7, %r7, %r7, %r7};
$END:";
    let (r, out) = run_src(&kernel_src("", body), 1, 96, 96 * 32);
    r.expect("launch");
    // 0, 3, ..., 63: 22 multiples of 3; some rest is not 0; thread 37's !p2 is false; the
    // outer %p1 (not the inner one) is false somewhere; p8 is false in every live thread.
    for t in 0..64 {
        assert_eq!(
            &out[t * 8..t * 8 + 8],
            [22, 1, 0, 1, 0, 0, 0, 0],
            "thread {t}"
        );
    }
    assert!(
        out[64 * 8..].iter().all(|&v| v == 0),
        "exited threads store nothing"
    );
}

/// A reduction with a thread count involves only that many threads: each warp reduces over
/// itself at a barrier of its own, neither waiting for the other.
#[test]
fn barrier_reductions_with_a_count_reduce_over_their_group() {
    let body = "
	setp.lt.u32 %p1, %r1, 40;
	shr.u32 %r2, %r1, 5;
	add.u32 %r2, %r2, 1;
	bar.red.popc.u32 %r3, %r2, 32, %p1;
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r3;";
    let (r, out) = run_src(&kernel_src("", body), 1, 64, 64 * 4);
    r.expect("launch");
    assert_eq!(out[..32], [32; 32]);
    assert_eq!(out[32..], [8; 32]);
}

#[test]
fn divergent_barrier_fails_not_hangs() {
    let body = "
	setp.lt.u32 %p1, %r1, 16;
	@%p1 bra $SKIP;
	bar.sync 0;
	bra.uni $END;
$SKIP:
	bar.sync 0;
$END:";
    let (r, _) = run_src(&kernel_src("", body), 1, 64, 4);
    let m = failure(r);
    assert!(m.contains("bar.sync") && m.contains("line"), "{m}");
    // A barrier some threads never reach while they wait for a shuffle: a deadlock.
    let body = "
	setp.lt.u32 %p1, %r1, 16;
	@%p1 bra $BAR;
	shfl.sync.idx.b32 %r3, %r1, 0, 31, -1;
$BAR:
	bar.sync 0;";
    let (r, _) = run_src(&kernel_src("", body), 1, 32, 4);
    assert!(
        matches!(&r, Err(ExecError::LaunchFailed(m)) if m.contains("deadlock")),
        "{r:?}"
    );
    // Threads that exit before a barrier no longer count: the rest pass it.
    let body = "
	setp.lt.u32 %p1, %r1, 16;
	@%p1 exit;
	bar.sync 0;
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], 7;";
    let (r, out) = run_src(&kernel_src("", body), 1, 64, 64 * 4);
    r.expect("launch");
    assert_eq!(
        out,
        (0..64)
            .map(|t| if t < 16 { 0 } else { 7 })
            .collect::<Vec<u32>>()
    );
}

#[test]
fn shuffle_with_an_exited_lane_fails() {
    let body = "
	setp.eq.u32 %p1, %r1, 5;
	@%p1 exit;
	shfl.sync.bfly.b32 %r3, %r1, 1, 31, -1;";
    let (r, _) = run_src(&kernel_src("", body), 1, 32, 4);
    let m = failure(r);
    assert!(m.contains("lane 5"), "{m}");
}

#[test]
fn global_atomics_under_contention_are_exact() {
    let body = "
	atom.global.add.u32 %r2, [%rd1], 1;
	atom.global.add.f32 %f1, [%rd1+4], 0f3F800000;
	red.global.add.u64 [%rd1+8], 3;
	atom.global.max.s32 %r3, [%rd1+16], %r1;
	atom.global.add.f64 %fd1, [%rd1+24], 0d3FE0000000000000;
	atom.global.cas.b32 %r4, [%rd1+32], 0, 9;";
    let (r, out) = run_src(&kernel_src("", body), 64, 128, 40);
    r.expect("launch");
    let n = 64 * 128u64;
    assert_eq!(out[0] as u64, n);
    assert_eq!(f32::from_bits(out[1]), n as f32);
    assert_eq!(out[2] as u64 | (out[3] as u64) << 32, 3 * n);
    assert_eq!(out[4], 127);
    assert_eq!(
        f64::from_bits(out[6] as u64 | (out[7] as u64) << 32),
        n as f64 / 2.0
    );
    assert_eq!(out[8], 9);
}

#[test]
fn every_atomic_operation_returns_the_old_value_and_stores_the_ptx_result() {
    // One thread, so the order is the program's; the old values, then the final words.
    let body = "
	mov.u32 %r20, 61680;
	mov.u32 %r21, 5;
	mov.u32 %r22, 9;
	st.global.v4.u32 [%rd1], {%r1, %r20, %r21, %r22};
	atom.global.inc.u32 %r2, [%rd1], 2;
	atom.global.inc.u32 %r3, [%rd1], 2;
	atom.global.inc.u32 %r4, [%rd1], 2;
	atom.global.dec.u32 %r5, [%rd1], 5;
	atom.global.dec.u32 %r6, [%rd1], 5;
	atom.global.dec.u32 %r7, [%rd1], 3;
	atom.global.and.b32 %r8, [%rd1+4], 65280;
	atom.global.or.b32 %r9, [%rd1+4], 15;
	atom.global.xor.b32 %r10, [%rd1+4], 65535;
	atom.global.min.s32 %r11, [%rd1+8], -3;
	atom.global.max.s32 %r12, [%rd1+8], -7;
	atom.global.max.u32 %r13, [%rd1+8], 1;
	atom.global.min.u32 %r14, [%rd1+8], 7;
	atom.global.cas.b32 %r15, [%rd1+12], 9, 1;
	atom.global.cas.b32 %r16, [%rd1+12], 9, 2;
	atom.global.exch.b32 %r17, [%rd1+12], 4;
	st.global.v4.u32 [%rd1+16], {%r2, %r3, %r4, %r5};
	st.global.v4.u32 [%rd1+32], {%r6, %r7, %r8, %r9};
	st.global.v4.u32 [%rd1+48], {%r10, %r11, %r12, %r13};
	st.global.v4.u32 [%rd1+64], {%r14, %r15, %r16, %r17};";
    let (r, out) = run_src(&kernel_src("", body), 1, 1, 80);
    r.expect("launch");
    let neg = |v: i32| v as u32;
    #[rustfmt::skip]
    let want = [
        // inc wraps to 0 at its bound (0, 1, 2 -> 0); dec from 0, or above its bound, to it.
        3, 0x0ff0, 7, 4,
        0, 1, 2, 0,
        5, 4, 0xf0f0, 0xf000,
        0xf00f, 5, neg(-3), neg(-3),
        // min.u32 sees -3 as 0xfffffffd; the second cas finds 1, not 9.
        neg(-3), 9, 1, 1,
    ];
    assert_eq!(out, want);
}

#[test]
fn shared_bounds_and_alignment() {
    let decl = "\t.shared .align 4 .b8 s[16];";
    let (r, _) = run_src(
        &kernel_src(decl, "\tmov.u32 %r2, s;\n\tst.shared.u32 [%r2+16], %r1;"),
        1,
        1,
        4,
    );
    assert!(
        matches!(&r, Err(ExecError::IllegalAddress(m)) if m.contains("line 17")),
        "{r:?}"
    );
    let (r, _) = run_src(&kernel_src(decl, "\tst.shared.u32 [s+2], %r1;"), 1, 1, 4);
    assert!(
        matches!(&r, Err(ExecError::MisalignedAddress(m)) if m.contains("4-byte store at Shared address 0x2")),
        "{r:?}"
    );
    let (r, _) = run_src(&kernel_src("", "\tst.global.u32 [%rd1+2], %r1;"), 1, 1, 4);
    assert!(
        matches!(&r, Err(ExecError::MisalignedAddress(m)) if m.contains("4-byte store at Global address 0x200000000002")),
        "{r:?}"
    );
    let (r, _) = run_src(&kernel_src(decl, "\tst.shared.u32 [s+12], %r1;\n\tld.shared.u32 %r3, [s+12];\n\tst.global.u32 [%rd1], %r3;"), 1, 1, 4);
    r.expect("in bounds");
    // Global: one past the allocation, and a generic access through cvta.
    let (r, _) = run_src(&kernel_src("", "\tst.global.u32 [%rd1+4], %r1;"), 1, 1, 4);
    assert!(
        matches!(&r, Err(ExecError::IllegalAddress(m)) if m.contains("0x200000000004")),
        "{r:?}"
    );
    let body = "\tmov.u64 %rd2, s;\n\tcvta.shared.u64 %rd3, %rd2;\n\tst.u32 [%rd3+8], 5;\n\tld.shared.u32 %r3, [s+8];\n\tst.global.u32 [%rd1], %r3;";
    let (r, out) = run_src(&kernel_src(decl, body), 1, 1, 4);
    r.expect("generic shared");
    assert_eq!(out, [5]);
    // A generic address just past each window is a global one (and none is allocated there).
    for end in ["0x7FFF010000000000", "0x7FFE010000000000"] {
        let body = format!("\tmov.u64 %rd2, {end};\n\tld.u32 %r3, [%rd2];");
        let (r, _) = run_src(&kernel_src(decl, &body), 1, 1, 4);
        let global = format!("global address {}", end.to_lowercase());
        assert!(
            matches!(&r, Err(ExecError::IllegalAddress(m)) if m.contains(&global)),
            "{r:?}"
        );
    }
}

#[test]
fn local_bounds_and_alignment() {
    let decl = "\t.local .align 8 .b8 frame[16];";
    // Each thread's frame is its own: thread 1's store does not show in thread 0's (the
    // barrier lets every thread store before any loads).
    let body = "\tst.local.u32 [frame+12], %r1;\n\tbar.sync 0;\n\tld.local.u32 %r3, [frame+12];\n\tmul.wide.u32 %rd2, %r1, 4;\n\tadd.s64 %rd3, %rd1, %rd2;\n\tst.global.u32 [%rd3], %r3;";
    let (r, out) = run_src(&kernel_src(decl, body), 1, 2, 8);
    r.expect("in bounds");
    assert_eq!(out, [0, 1]);
    let (r, _) = run_src(
        &kernel_src(decl, "\tst.local.u32 [frame+16], %r1;"),
        1,
        1,
        4,
    );
    assert!(
        matches!(&r, Err(ExecError::IllegalAddress(m)) if m.contains("line 16")),
        "{r:?}"
    );
    let (r, _) = run_src(
        &kernel_src(decl, "\tld.local.u64 %rd2, [frame+4];"),
        1,
        1,
        4,
    );
    assert!(matches!(r, Err(ExecError::MisalignedAddress(_))), "{r:?}");
    // Through a generic address (cvta.local): each thread's own frame, then past its end.
    let body = "\tmov.u64 %rd2, frame;\n\tcvta.local.u64 %rd3, %rd2;\n\tadd.u32 %r2, %r1, 7;\n\tst.u32 [%rd3+8], %r2;\n\tld.local.u32 %r3, [frame+8];\n\tmul.wide.u32 %rd4, %r1, 4;\n\tadd.s64 %rd5, %rd1, %rd4;\n\tst.global.u32 [%rd5], %r3;";
    let (r, out) = run_src(&kernel_src(decl, body), 1, 2, 8);
    r.expect("generic local");
    assert_eq!(out, [7, 8]);
    let body = "\tmov.u64 %rd2, frame;\n\tcvta.local.u64 %rd3, %rd2;\n\tld.u32 %r3, [%rd3+20];";
    let (r, _) = run_src(&kernel_src(decl, body), 1, 1, 4);
    assert!(matches!(r, Err(ExecError::IllegalAddress(_))), "{r:?}");
}

/// The carry flag, the sink `_` and the first declared register are three slots, none of them a
/// special register's; a vector type's size is its element's times its length; `.target` and a
/// declaration may list several names.
#[test]
fn reserved_slots_and_declaration_lists() {
    let src = ".version 9.0
.target sm_80, debug
.address_size 64
.visible .entry k(.param .u64 out)
{
\t.reg .b32 %r<8>;
\t.reg .b64 %rd<4>;
\t.shared .align 16 .v4 .f32 v[2], w[1];
\t.local .align 4 .b8 frame[8];
\tmov.u32 %r0, 7;
\tadd.cc.u32 %r1, -1, 1;
\tmov.b64 %rd0, 6;
\tmov.b64 {%r2, _}, %rd0;
\taddc.u32 %r3, 0, 0;
\tmov.u32 %r4, %total_smem_size;
\tmov.u32 %r5, w;
\tld.param.u64 %rd1, [out];
\tst.global.v4.u32 [%rd1], {%r0, %r3, %r4, %r2};
\tst.global.u32 [%rd1+16], %r5;
\tret;
}
";
    let (r, out) = run_src(src, 1, 1, 20);
    r.expect("launch");
    // v: 2 x 16 bytes, then w at 32: 48 in all.
    assert_eq!(out, [7, 1, 48, 6, 32]);
}

/// A module's outer structure: performance directives and `.pragma` after a kernel's
/// parameters, `.loc` and `.file` in a body, `.reg` parameters, an empty initialiser and a
/// negated float one; local and parameter space at their limits (2^32 bytes, and 2^31 - 1
/// with `f`'s 8); and what is refused, each on its line.
#[test]
fn module_structure_accepted_and_refused() {
    let src = format!(
        "{HEAD}.global .u32 empty[2] = {{}};
.global .f64 fneg = -2.5;
.func (.reg .b32 r) f(.reg .b32 a)
{{
\tret;
}}
.func g()
{{
\tret;
}}
.visible .entry k(.param .u64 out) .maxntid 64, 1, 1 .minnctapersm 2 .pragma \"nounroll\";
{{
\t.loc 1 10 3
\t.file 2 \"other.cu\"
\t.reg .b32 %r<1048576>;
\t.local .b8 most[4294967296];
\t.param .b8 half[2147483639];
\tcall.uni g;
\tret;
}}
"
    );
    let m = module(&src);
    let g = m.globals();
    assert_eq!((g[0].size, g[0].initial.as_slice()), (8, &[0u8; 8][..]));
    assert_eq!(g[1].initial, (-2.5f64).to_le_bytes());
    let entry = |header: &str, body: &str| {
        format!("{HEAD}.visible .entry k({header}\n{{\n{body}\n\tret;\n}}\n")
    };
    let f = ".func f()\n{\n\tret;\n}\n";
    // A kernel whose body, on line 10, calls `f(.param .b32 a)`.
    let calling = |body: &str| {
        format!(
            "{HEAD}.func f(.param .b32 a)\n{{\n\tret;\n}}\n\
             .visible .entry k()\n{{\n{body}\n\tret;\n}}\n"
        )
    };
    for (text, line, message) in [
        (
            entry(".foo .u32 x)", ""),
            4,
            "unknown parameter kind `.foo`",
        ),
        (entry(") .bogus 3", ""), 4, "unknown directive `.bogus`"),
        (entry(")", "\t.bogus 3;"), 6, "unknown directive `.bogus`"),
        (
            entry(")", "\t.reg .v2 .f32 %x;"),
            6,
            "vector registers are not supported",
        ),
        (
            entry(")", "\t.reg .v4 .b32 %x;"),
            6,
            "vector registers are not supported",
        ),
        (
            entry(")", "\t.reg .b32 %r<1048577>;"),
            6,
            "too many registers `%r<1048577>`",
        ),
        (format!("{HEAD}{f}{f}"), 8, "`f` declared twice"),
        (
            format!("{HEAD}.func f();\n.visible .entry f()\n{{\n\tret;\n}}\n"),
            5,
            "`f` declared twice",
        ),
        (
            format!("{HEAD}.func f(.param .u32 a);\n{f}"),
            5,
            "`f` declared twice",
        ),
        (
            format!("{HEAD}.func (.param .u32 r) f();\n{f}"),
            5,
            "`f` declared twice",
        ),
        (
            calling("\tcall.uni f, ();"),
            10,
            "call of `f` with the wrong number of parameters",
        ),
        (
            calling("\t.shared .b32 s; call.uni f, (s);"),
            10,
            "call argument `s` is not a .param",
        ),
        (
            calling("\tcall.uni g, ();"),
            10,
            "call of unknown function `g`",
        ),
        (
            calling("\tcall.uni f, (), proto;"),
            10,
            "indirect calls are not supported",
        ),
        (calling("\tcall.uni 3;"), 10, "bad call operands"),
        (
            entry(")", "\t.local .b8 big[4294967297];"),
            1,
            "local or parameter space too large",
        ),
        (
            entry(")", "\t.param .b8 big[2147483648];"),
            1,
            "local or parameter space too large",
        ),
    ] {
        assert_parse_error(&text, line, message);
    }
}

/// Asserts that `text` fails to parse on `line` with exactly `message`.
fn assert_parse_error(text: &str, line: usize, message: &str) {
    let e = Module::parse(text).expect_err(text);
    assert_eq!((e.line, e.message.as_str()), (line, message), "{text:?}");
}

/// Line and block comments are skipped wherever they stand, and the lines inside a block
/// comment still count: the unknown instruction is reported on its own line.
#[test]
fn comments_are_skipped_and_their_lines_counted() {
    let src = format!(
        "{HEAD}// a line comment that ends */ like a block one, a/b
/* a block comment over
   two lines, with ** stars, a/slash and // inside */ .visible .entry k()
{{
\t/**/ .reg .b32 %r<3>; /* one line */
\tfoo.b32 %r1, %r2; // trailing
}}
// the last line, without a newline"
    );
    let e = Module::parse(&src).expect_err("foo is unknown");
    assert_eq!(e.line, 9, "{}", e.message);
    assert!(e.message.contains("`foo.b32`"), "{}", e.message);
    let ok = src.replace("foo.b32 %r1, %r2;", "mov.b32 %r1, %r2;\n\tret;");
    Module::parse(&ok).expect("comments only");
    // A block comment never closed, with its opening line; a lone slash is not a comment.
    for (text, line, message) in [
        (format!("{HEAD}\n/* open\n*"), 5, "unterminated comment"),
        (format!("{HEAD}/*"), 4, "unterminated comment"),
        (
            format!("{HEAD}.visible / .entry k()"),
            4,
            "unexpected character `/`",
        ),
    ] {
        assert_parse_error(&text, line, message);
    }
}

/// Strings: `.pragma` and `.file` take them, an error shows one as written, and one left open
/// at a line's end or the module's is refused on its line.
#[test]
fn strings_are_read_whole_and_must_close_on_their_line() {
    let src = format!(
        "{HEAD}.file 1 \"kernel.cu\"
.pragma \"nounroll\";
.visible .entry k()
{{
\t.pragma \"nounroll\";
\tret;
}}
"
    );
    Module::parse(&src).expect("strings in directives");
    for (text, line, message) in [
        (
            src.replace("entry k()", "entry \"k x\"()"),
            6,
            "expected a name, found \"k x\"",
        ),
        (
            src.replace("\"nounroll\";\n\tret", "\"nounroll;\n\tret"),
            8,
            "unterminated string",
        ),
        (format!("{HEAD}.pragma \"open"), 4, "unterminated string"),
    ] {
        assert_parse_error(&text, line, message);
    }
}

/// Immediates in each spelling PTX allows: hex, binary, octal, decimal with a `U` suffix,
/// decimal floats with and without a signed exponent, and hex floats of either width.
#[test]
fn immediates_in_every_spelling() {
    let body = "
	mov.u32 %r2, 0x1E;
	mov.u32 %r3, 0X1f;
	mov.u32 %r4, 0b101;
	mov.u32 %r5, 017;
	mov.u32 %r6, 42U;
	mov.f32 %f1, 1.5e-3;
	mov.f32 %f2, 2E+2;
	mov.f32 %f3, 0F3F800000;
	cvt.rn.f32.f64 %f4, 0D3FF8000000000000;
	mov.f32 %f5, 0.25;
	mov.f32 %f6, 1e3;
	st.global.v4.u32 [%rd1], {%r2, %r3, %r4, %r5};
	st.global.v4.f32 [%rd1+16], {%f1, %f2, %f3, %f4};
	st.global.v2.f32 [%rd1+32], {%f5, %f6};
	st.global.u32 [%rd1+40], %r6;
	add.s64 %rd4, %rd1, 44;
	ld.global.u32 %r7, [%rd4-4];
	st.global.u32 [%rd1+44], %r7;
	mov.f32 %f7, -1.5;
	st.global.f32 [%rd1+48], %f7;
	mov.pred %p1, 2;
	selp.u32 %r8, 5, 6, %p1;
	st.global.u32 [%rd1+52], %r8;";
    let out = f32_results(body, 14);
    assert_eq!(out[..4], [30, 31, 5, 15]);
    let floats: Vec<f32> = out[4..10].iter().map(|&b| f32::from_bits(b)).collect();
    assert_eq!(floats, [1.5e-3, 200.0, 1.0, 1.5, 0.25, 1000.0]);
    assert_eq!(out[10..12], [42, 42], "an address less an offset");
    assert_eq!(f32::from_bits(out[12]), -1.5);
    assert_eq!(out[13], 5, "a predicate immediate is true when not 0");
}

#[test]
fn unknown_instruction_names_it_and_its_line() {
    let src = format!(
        "{HEAD}.visible .entry k()\n{{\n\t.reg .b32 %r<3>;\n\tfoo.b32 %r1, %r2;\n\tret;\n}}\n"
    );
    let e = Module::parse(&src).expect_err("must fail");
    assert_eq!(e.line, 7);
    assert!(
        e.message.contains("unknown instruction `foo.b32`"),
        "{}",
        e.message
    );
    let src = format!("{HEAD}.visible .entry k()\n{{\n\tadd.q32 %r1, %r2, 1;\n}}\n");
    assert!(Module::parse(&src).is_err());
    let src = format!("{HEAD}.bogus 3\n");
    assert!(Module::parse(&src)
        .expect_err("bogus")
        .message
        .contains("`.bogus`"));
}

#[test]
fn garbage_and_truncated_modules_never_panic() {
    let text = tandem_ptx("softmax_xent");
    let mut cut = 0;
    while cut < text.len() {
        if text.is_char_boundary(cut) {
            let _ = Module::parse(&text[..cut]);
        }
        cut += 37;
    }
    let mut s = 12345u64;
    let alphabet: Vec<char> = "{}()[];:,<>+-|!@=%.$_ abcxyz019\n\"/*".chars().collect();
    for _ in 0..300 {
        let n = (s % 200) as usize;
        let g: String = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                alphabet[(s >> 33) as usize % alphabet.len()]
            })
            .collect();
        let _ = Module::parse(&g);
        let _ = Module::parse(&format!("{HEAD}.visible .entry k()\n{{\n{g}\n}}\n"));
    }
}

fn f32_results(body: &str, n: usize) -> Vec<u32> {
    let (r, out) = run_src(&kernel_src("", body), 1, 1, n * 4);
    r.expect("launch");
    out
}

#[test]
fn rounding_fma_division_and_ftz() {
    let one_p12 = 1.0f32 + 2f32.powi(-12); // 0f3F800800
    let body = "
	mov.f32 %f1, 0f3F800800;
	fma.rn.f32 %f2, %f1, %f1, 0fBF800000;
	mul.rn.f32 %f3, %f1, %f1;
	add.rn.f32 %f4, %f3, 0fBF800000;
	add.rm.f32 %f5, 0f3F800000, 0f30800000;
	add.rp.f32 %f6, 0f3F800000, 0f30800000;
	add.rm.f32 %f7, 0fBF800000, 0fB0800000;
	add.rz.f32 %f8, 0fBF800000, 0fB0800000;
	div.rn.f32 %f9, 0f3F800000, 0f40400000;
	div.rz.f32 %f10, 0f3F800000, 0f40400000;
	mul.ftz.f32 %f11, 0f80011C19, 0f3F800000;
	mul.f32 %f12, 0f00011C19, 0f3F800000;
	add.sat.f32 %f13, 0f3F333333, 0f3F333333;
	fma.rm.f32 %f14, %f1, %f1, 0fBF800000;
	sqrt.rp.f32 %f15, 0f40000000;
	sqrt.rn.f32 %f16, 0f40000000;
	st.global.v4.f32 [%rd1], {%f2, %f4, %f5, %f6};
	st.global.v4.f32 [%rd1+16], {%f7, %f8, %f9, %f10};
	st.global.v4.f32 [%rd1+32], {%f11, %f12, %f13, %f14};
	st.global.v2.f32 [%rd1+48], {%f15, %f16};
	add.ftz.f32 %f17, 0f00011C19, 0f00011C19;
	mul.sat.f32 %f18, 0f3FC00000, 0f40000000;
	fma.rn.ftz.f32 %f19, 0f00011C19, 0f3F800000, 0f00000000;
	fma.rn.sat.f32 %f20, 0f3FC00000, 0f40000000, 0f00000000;
	st.global.v4.f32 [%rd1+64], {%f17, %f18, %f19, %f20};";
    let o: Vec<f32> = f32_results(body, 20)
        .into_iter()
        .map(f32::from_bits)
        .collect();
    assert_eq!(o[0], one_p12.mul_add(one_p12, -1.0));
    assert_eq!(o[0], 2f32.powi(-11) + 2f32.powi(-24), "one rounding");
    assert_eq!(o[1], 2f32.powi(-11), "two roundings");
    assert_eq!(o[2], 1.0);
    assert_eq!(o[3], 1.0 + f32::EPSILON);
    assert_eq!(o[4], -(1.0 + f32::EPSILON));
    assert_eq!(o[5], -1.0);
    assert_eq!(o[6], 1.0f32 / 3.0);
    assert_eq!(
        o[7].to_bits(),
        (1.0f32 / 3.0).to_bits() - 1,
        "1/3 rounds up to nearest"
    );
    assert_eq!(o[8].to_bits(), 0x8000_0000, "ftz keeps the sign");
    assert_eq!(o[9].to_bits(), 0x0001_1C19);
    assert_eq!(o[10], 1.0);
    assert_eq!(o[11], 2f32.powi(-11) + 2f32.powi(-24));
    // .ftz and .sat of add, mul and fma: flushed subnormal inputs, 1.5 * 2 clamped to 1.
    assert_eq!(o[16..20], [0.0, 1.0, 0.0, 1.0]);
    let s2 = 2f32.sqrt();
    assert_eq!(o[13], s2);
    // sqrt(2) in f64 lies above or below its f32 rounding; .rp gives the f32 at or above it.
    let want_rp = if (s2 as f64) >= 2f64.sqrt() {
        s2
    } else {
        f32::from_bits(s2.to_bits() + 1)
    };
    assert_eq!(o[12], want_rp);
}

#[test]
fn cvt_modes() {
    let body = "
	cvt.rni.s32.f32 %r2, 0f40200000;
	cvt.rmi.s32.f32 %r3, 0fC0200000;
	cvt.rpi.s32.f32 %r4, 0f40066666;
	cvt.rzi.s32.f32 %r5, 0fC02CCCCD;
	cvt.rzi.s32.f32 %r6, 0f4F32D05E;
	cvt.rzi.u32.f32 %r7, 0fBF800000;
	cvt.rzi.s32.f32 %r8, 0f7FC00000;
	cvt.rn.f32.u32 %f1, 16777217;
	cvt.rp.f32.u32 %f2, 16777217;
	cvt.rz.f32.f64 %f3, 0d3FD5555555555555;
	cvt.rn.f32.f64 %f4, 0d3FD5555555555555;
	cvt.s8.s32 %r9, 300;
	cvt.sat.s8.s32 %r10, 300;
	cvt.u32.s8 %r11, %r9;
	cvt.s32.s8 %r12, 200;
	cvt.rni.f32.f32 %f5, 0f40200000;
	st.global.v4.u32 [%rd1], {%r2, %r3, %r4, %r5};
	st.global.v4.u32 [%rd1+16], {%r6, %r7, %r8, %r9};
	st.global.v4.f32 [%rd1+32], {%f1, %f2, %f3, %f4};
	st.global.v4.u32 [%rd1+48], {%r10, %r11, %r12, %r12};
	st.global.f32 [%rd1+64], %f5;";
    let o = f32_results(body, 17);
    assert_eq!(&o[..4], [2, (-3i32) as u32, 3, (-2i32) as u32]);
    assert_eq!(o[4], i32::MAX as u32, "saturates");
    assert_eq!(o[5], 0);
    assert_eq!(o[6], 0, "NaN converts to 0");
    assert_eq!(o[7], 300 & 0xff);
    assert_eq!(f32::from_bits(o[8]), 16777216.0);
    assert_eq!(f32::from_bits(o[9]), 16777218.0);
    let third = 1.0f64 / 3.0;
    assert_eq!(f32::from_bits(o[11]), third as f32);
    let rz = if (third as f32) as f64 > third {
        f32::from_bits((third as f32).to_bits() - 1)
    } else {
        third as f32
    };
    assert_eq!(f32::from_bits(o[10]), rz);
    assert_eq!(o[12], 127);
    assert_eq!(o[13], 44, "300 truncated to s8 is 44, zero-extended back");
    assert_eq!(o[14], (200u8 as i8) as i32 as u32);
    assert_eq!(f32::from_bits(o[16]), 2.0);
}

#[test]
fn reciprocals_in_every_rounding_and_approximate_square_roots() {
    let body = "
	rcp.rn.f32 %f1, 0f40400000;
	rcp.rz.f32 %f2, 0f40400000;
	rcp.rp.f32 %f3, 0f40400000;
	rcp.rm.f32 %f4, 0fC0400000;
	rcp.rz.f32 %f5, 0fC0400000;
	rcp.approx.f32 %f6, 0f40400000;
	sqrt.approx.f32 %f7, 0f40000000;
	rsqrt.approx.f32 %f8, 0f40000000;
	st.global.v4.f32 [%rd1], {%f1, %f2, %f3, %f4};
	st.global.v4.f32 [%rd1+16], {%f5, %f6, %f7, %f8};
	rsqrt.approx.f64 %fd1, 0d4000000000000000;
	rsqrt.approx.f64 %fd2, 0d4008000000000000;
	rcp.approx.ftz.f64 %fd3, 0d4008000000000000;
	st.global.v2.f64 [%rd1+32], {%fd1, %fd2};
	st.global.f64 [%rd1+48], %fd3;";
    let o = f32_results(body, 14);
    let third = 1.0f32 / 3.0; // rounded up: 1/3 to nearest lies above it
    let below = f32::from_bits(third.to_bits() - 1);
    let f: Vec<f32> = o[..8].iter().map(|&b| f32::from_bits(b)).collect();
    assert_eq!(f[..6], [third, below, third, -third, -below, third]);
    assert_eq!(f[6], 2f32.sqrt());
    assert!((f[7] * f[7] * 2.0 - 1.0).abs() < 2f32.powi(-21), "{}", f[7]);
    let d: Vec<f64> = o[8..]
        .chunks(2)
        .map(|c| f64::from_bits(c[0] as u64 | (c[1] as u64) << 32))
        .collect();
    for (r, x) in [(d[0], 2.0), (d[1], 3.0)] {
        assert!((r * r * x - 1.0).abs() < 2f64.powi(-48), "rsqrt({x}) = {r}");
    }
    assert_eq!(d[2], 1.0 / 3.0);
}

#[test]
fn wide_integers_to_16_bit_floats_round_from_their_exact_value() {
    // 2^63 - 1 is 2^63 in f64: only what that rounding lost (-1) sends it below 2^63 toward zero.
    let body = "
	mov.u64 %rd2, 9223372036854775807;
	cvt.rz.bf16.u64 %rs1, %rd2;
	cvt.rn.bf16.u64 %rs2, %rd2;
	mov.b32 %r2, {%rs1, %rs2};
	st.global.u32 [%rd1], %r2;";
    let (r, out) = run_src(&kernel_src("\t.reg .b16 %rs<4>;", body), 1, 1, 4);
    r.expect("launch");
    let bf16 = |x: f32| x.to_bits() >> 16; // exact for these values
    let below = bf16(2f32.powi(63) - 2f32.powi(55));
    assert_eq!(out[0], below | bf16(2f32.powi(63)) << 16);
}

#[test]
fn saturating_conversions_to_16_bit_floats_clamp_to_0_1_and_zero_nan() {
    let body = "
	cvt.rn.sat.f16.f32 %rs1, 0f3F000000;
	cvt.rn.sat.f16.f32 %rs2, 0f40000000;
	cvt.rn.sat.f16.f32 %rs3, 0fBF800000;
	cvt.rn.sat.f16.f32 %rs4, 0f7FC00000;
	mov.b32 %r2, {%rs1, %rs2};
	mov.b32 %r3, {%rs3, %rs4};
	st.global.v2.u32 [%rd1], {%r2, %r3};";
    let (r, out) = run_src(&kernel_src("\t.reg .b16 %rs<8>;", body), 1, 1, 8);
    r.expect("launch");
    let f16 = |x: f32| u32::from(half::f16::from_f32(x).to_bits());
    assert_eq!(out, [f16(0.5) | f16(1.0) << 16, 0]);
}

#[test]
fn conversions_to_integers_saturate_at_the_types_ends() {
    let body = "
	cvt.rzi.s32.f32 %r2, 0f501502F9;
	cvt.rzi.s32.f32 %r3, 0fD01502F9;
	cvt.rzi.u32.f32 %r4, 0f501502F9;
	cvt.sat.s8.s32 %r5, 1000;
	cvt.sat.s8.s32 %r6, -1000;
	cvt.sat.u8.s32 %r7, 1000;
	cvt.rni.s64.f64 %rd2, 0d4415AF1D78B58C40;
	st.global.v4.u32 [%rd1], {%r2, %r3, %r4, %r5};
	st.global.v2.u32 [%rd1+16], {%r6, %r7};
	st.global.u64 [%rd1+24], %rd2;";
    // 0f501502F9 is 1e10; 0d4415AF1D78B58C40 is 1e20.
    let (r, out) = run_src(&kernel_src("", body), 1, 1, 32);
    r.expect("launch");
    assert_eq!(out[..3], [i32::MAX as u32, i32::MIN as u32, u32::MAX]);
    // The 8-bit results' own bits (what a wider register holds above them is not asked here).
    let low = |i: usize| out[i] as u8;
    assert_eq!(
        [low(3), low(4), low(5)],
        [i8::MAX as u8, i8::MIN as u8, u8::MAX]
    );
    assert_eq!(u64::from(out[6]) | u64::from(out[7]) << 32, i64::MAX as u64);
}

#[test]
fn packed_16_bit_pairs_compute_lane_by_lane() {
    // Each register holds two values, the first named in its high half.
    let body = "
	mov.b32 %r2, 0x3C004000;
	mov.b32 %r3, 0x40003800;
	add.rn.f16x2 %r4, %r2, %r3;
	mul.rn.f16x2 %r5, %r2, %r3;
	mov.b32 %r6, 0x3F804040;
	mov.b32 %r7, 0x40003F00;
	sub.rn.bf16x2 %r8, %r6, %r7;
	cvt.rn.f16x2.f32 %r9, 0f40400000, 0f3F000000;
	cvt.rn.bf16x2.f32 %r10, 0fC0800000, 0f3E800000;
	st.global.v4.u32 [%rd1], {%r4, %r5, %r8, %r9};
	st.global.u32 [%rd1+16], %r10;";
    let (r, out) = run_src(&kernel_src("", body), 1, 1, 20);
    r.expect("launch");
    let f16 = |hi: f32, lo: f32| {
        u32::from(half::f16::from_f32(hi).to_bits()) << 16
            | u32::from(half::f16::from_f32(lo).to_bits())
    };
    let bf16 = |hi: f32, lo: f32| {
        u32::from(half::bf16::from_f32(hi).to_bits()) << 16
            | u32::from(half::bf16::from_f32(lo).to_bits())
    };
    // (1, 2) + (2, 0.5), (1, 2) * (2, 0.5); bf16 (1, 3) - (2, 0.5); then conversions.
    let want = [
        f16(3.0, 2.5),
        f16(2.0, 1.0),
        bf16(-1.0, 2.5),
        f16(3.0, 0.5),
        bf16(-4.0, 0.25),
    ];
    assert_eq!(out, want);
}

#[test]
fn f64_arithmetic_and_directed_rounding() {
    let body = "
	div.rn.f64 %fd1, 0d3FF0000000000000, 0d4008000000000000;
	sqrt.rn.f64 %fd2, 0d4000000000000000;
	fma.rn.f64 %fd3, %fd1, 0d4008000000000000, 0dBFF0000000000000;
	add.rm.f64 %fd4, 0d3FF0000000000000, 0d3C90000000000000;
	add.rp.f64 %fd5, 0d3FF0000000000000, 0d3C90000000000000;
	mul.rz.f64 %fd6, %fd1, 0d4008000000000000;
	div.rp.f64 %fd7, 0d3FF0000000000000, 0d4008000000000000;
	cvt.rn.f64.s32 %fd8, -7;
	st.global.v2.f64 [%rd1], {%fd1, %fd2};
	st.global.v2.f64 [%rd1+16], {%fd3, %fd4};
	st.global.v2.f64 [%rd1+32], {%fd5, %fd6};
	st.global.v2.f64 [%rd1+48], {%fd7, %fd8};";
    let o = f32_results(body, 16);
    let d: Vec<f64> = o
        .chunks(2)
        .map(|c| f64::from_bits(c[0] as u64 | (c[1] as u64) << 32))
        .collect();
    let third = 1.0f64 / 3.0;
    assert_eq!(d[0], third);
    assert_eq!(d[1], 2f64.sqrt());
    assert_eq!(d[2], third.mul_add(3.0, -1.0));
    assert_ne!(d[2], 0.0, "fma keeps the residual");
    assert_eq!(d[3], 1.0);
    assert_eq!(d[4], 1.0 + f64::EPSILON);
    // third * 3 is exactly 1 - 2^-54: rounds to 1.0 to nearest, toward zero to 1 - 2^-53.
    assert_eq!(d[5], 1.0 - f64::EPSILON / 2.0);
    assert_eq!(
        d[6],
        f64::from_bits(third.to_bits() + 1),
        "1/3 to nearest lies below it"
    );
    assert_eq!(d[7], -7.0);
}

#[test]
fn func_calls_pass_params_and_return_values() {
    // With a barrier between a thread's parameter store and its call, every thread stores its
    // parameter before any calls: each must still find its own.
    for barrier in ["", "\n\tbar.sync 0;"] {
        let (r, out) = run_src(&minus_for_each_thread(barrier), 1, 8, 32);
        r.expect("launch");
        assert_eq!(
            out,
            (0..8).map(|t| 2 * t).collect::<Vec<u32>>(),
            "{barrier}"
        );
    }
}

#[test]
fn a_store_to_a_kernel_parameter_is_refused() {
    let (r, _) = run_src(&kernel_src("", "\tst.param.u64 [out], %rd1;"), 1, 1, 4);
    assert!(
        matches!(&r, Err(ExecError::IllegalAddress(m)) if m.contains("store to kernel parameter")),
        "{r:?}"
    );
}

/// A kernel whose every thread calls `minus(3 * %tid.x, %tid.x)` through two parameters
/// (`barrier` follows their stores) and gives the result to `put(&out[%tid.x], result)`, a
/// function that returns nothing (its first parameter is the first of its parameter space).
fn minus_for_each_thread(barrier: &str) -> String {
    format!(
        "{HEAD}.func (.param .b32 func_retval0) minus(
	.param .b32 minus_param_0,
	.param .b32 minus_param_1
)
{{
	.reg .b32 %r<4>;
	ld.param.b32 %r1, [minus_param_0];
	ld.param.b32 %r2, [minus_param_1];
	sub.s32 %r3, %r1, %r2;
	st.param.b32 [func_retval0], %r3;
	ret;
}}
.func put(
	.param .b64 put_param_0,
	.param .b32 put_param_1
)
{{
	.reg .b32 %r<2>;
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [put_param_0];
	ld.param.b32 %r1, [put_param_1];
	st.global.u32 [%rd1], %r1;
	ret;
}}
.visible .entry k(
	.param .u64 out
)
{{
	.reg .b32 %r<5>;
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	mul.lo.u32 %r4, %r1, 3;
	{{
	.param .b32 param0;
	st.param.b32 [param0], %r4;
	.param .b32 param1;
	st.param.b32 [param1], %r1;{barrier}
	.param .b32 retval0;
	call.uni (retval0),
	minus,
	(
	param0,
	param1
	);
	ld.param.b32 %r2, [retval0];
	}}
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	{{
	.param .b64 param0;
	st.param.b64 [param0], %rd3;
	.param .b32 param1;
	st.param.b32 [param1], %r2;
	call.uni
	put,
	(
	param0,
	param1
	);
	}}
	ret;
}}
"
    )
}

#[test]
fn integer_ops_against_rust() {
    let body = "
	mov.u32 %r2, -100;
	shr.s32 %r3, %r2, 40;
	shr.u32 %r4, %r2, 40;
	shl.b32 %r5, %r2, 32;
	mul.hi.s32 %r6, %r2, 0x7fffffff;
	div.s32 %r7, %r2, 7;
	rem.s32 %r8, %r2, 7;
	popc.b32 %r9, %r2;
	clz.b32 %r10, 1;
	brev.b32 %r11, 1;
	bfe.s32 %r12, 0xf0, 4, 4;
	bfi.b32 %r13, 5, 0, 8, 4;
	add.sat.s32 %r14, 0x7fffffff, 1;
	min.u32 %r15, %r2, 5;
	min.s32 %r16, %r2, 5;
	prmt.b32 %r17, 0x33221100, 0x77665544, 0x4321;
	st.global.v4.u32 [%rd1], {%r3, %r4, %r5, %r6};
	st.global.v4.u32 [%rd1+16], {%r7, %r8, %r9, %r10};
	st.global.v4.u32 [%rd1+32], {%r11, %r12, %r13, %r14};
	st.global.v4.u32 [%rd1+48], {%r15, %r16, %r17, %r17};";
    let o = f32_results(body, 16);
    let x = -100i32;
    assert_eq!(o[0], (-1i32) as u32);
    assert_eq!(o[1], 0);
    assert_eq!(o[2], 0);
    assert_eq!(o[3], ((x as i64 * 0x7fff_ffff) >> 32) as i32 as u32);
    assert_eq!(o[4], (x / 7) as u32);
    assert_eq!(o[5], (x % 7) as u32);
    assert_eq!(o[6], x.count_ones());
    assert_eq!(o[7], 31);
    assert_eq!(o[8], 0x8000_0000);
    assert_eq!(o[9], (-1i32) as u32, "0xf sign-extended from 4 bits");
    assert_eq!(o[10], 5 << 8);
    assert_eq!(o[11], i32::MAX as u32);
    assert_eq!(o[12], 5);
    assert_eq!(o[13], x as u32);
    assert_eq!(o[14], 0x4433_2211);
}

#[test]
fn fused_shared_load_and_fma() {
    let decl = "\t.shared .align 4 .b8 s[16];";
    // ld.shared.f32 then fma.rn.f32 (run as one super-instruction), and a branch into the fma.
    let body = "\tmov.f32 %f1, 0f40000000;\n\tst.shared.f32 [s+8], %f1;\n\tmov.f32 %f2, 0f3F800000;\n\tld.shared.f32 %f3, [s+8];\n\tfma.rn.f32 %f2, %f3, %f3, %f2;\n\tsetp.lt.f32 %p1, %f2, 0f41000000;\n\t@%p1 bra L1;\n\tbra L2;\nL1:\n\tld.shared.f32 %f3, [s+8];\nL3:\n\tfma.rn.f32 %f2, %f3, %f3, %f2;\n\tsetp.lt.f32 %p2, %f2, 0f41400000;\n\t@%p2 bra L3;\nL2:\n\tst.global.f32 [%rd1], %f2;";
    let (r, out) = run_src(&kernel_src(decl, body), 1, 1, 4);
    r.expect("fused pair");
    // 1 + 4 = 5, then + 4 = 9 (the pair), then + 4 = 13 (the fma alone, via L3).
    assert_eq!(f32::from_bits(out[0]), 13.0);
    // A guard on either instruction of the pair is kept: with %p3 false, a guarded load leaves
    // %f3 at 3 (the fma gives 1 + 9 = 10), a guarded fma leaves %f2 at 1.
    for (load, fma, expected) in [("@%p3 ", "", 10.0), ("", "@%p3 ", 1.0)] {
        let body = format!(
            "\tmov.f32 %f1, 0f40000000;\n\tst.shared.f32 [s+8], %f1;\n\tmov.f32 %f2, 0f3F800000;\n\tmov.f32 %f3, 0f40400000;\n\tsetp.ne.u32 %p3, %r1, %r1;\n\t{load}ld.shared.f32 %f3, [s+8];\n\t{fma}fma.rn.f32 %f2, %f3, %f3, %f2;\n\tst.global.f32 [%rd1], %f2;"
        );
        let (r, out) = run_src(&kernel_src(decl, &body), 1, 1, 4);
        r.expect("guarded pair");
        assert_eq!(f32::from_bits(out[0]), expected, "{load}ld, {fma}fma");
    }
    // Out of bounds and misaligned loads of a pair fail naming the load's line (16).
    let pair_at = |off: u32| {
        let body = format!("\tld.shared.f32 %f3, [s+{off}];\n\tfma.rn.f32 %f2, %f3, %f3, %f2;");
        run_src(&kernel_src(decl, &body), 1, 1, 4).0
    };
    let r = pair_at(16);
    assert!(
        matches!(&r, Err(ExecError::IllegalAddress(m)) if m.contains("line 16")),
        "{r:?}"
    );
    let r = pair_at(2);
    assert!(
        matches!(&r, Err(ExecError::MisalignedAddress(m)) if m.contains("line 16")),
        "{r:?}"
    );
}

#[test]
fn shared_vector_accesses_and_their_faults() {
    let decl = "\t.shared .align 8 .b8 s[16];";
    let body = "\tadd.u32 %r4, %r1, 7;\n\tst.shared.v2.u32 [s+8], {%r4, %r1};\n\tld.shared.v2.u32 {%r5, %r6}, [s+8];\n\tst.global.v2.u32 [%rd1], {%r6, %r5};";
    let (r, out) = run_src(&kernel_src(decl, body), 1, 1, 8);
    r.expect("in bounds");
    assert_eq!(out, [0, 7]);
    for access in [
        "ld.shared.v2.u32 {%r5, %r6}, [s+16];",
        "st.shared.v2.u32 [s+16], {%r1, %r1};",
    ] {
        let (r, _) = run_src(&kernel_src(decl, &format!("\t{access}")), 1, 1, 8);
        assert!(
            matches!(&r, Err(ExecError::IllegalAddress(m)) if m.contains("line 16")),
            "{access}: {r:?}"
        );
    }
    let (r, _) = run_src(
        &kernel_src(decl, "\tld.shared.v2.u32 {%r5, %r6}, [s+4];"),
        1,
        1,
        8,
    );
    assert!(matches!(r, Err(ExecError::MisalignedAddress(_))), "{r:?}");
}

/// A register read before it is written holds 0 in every block, whatever an earlier block on
/// the same host thread left in it: the entry's own registers and a callee's, in a module whose
/// other entry declares registers after them.
#[test]
fn every_block_starts_from_zeroed_registers() {
    let src = format!(
        "{HEAD}.func (.param .b32 func_retval0) stale()\n{{\n\t.reg .b32 %s<3>;\n\tmov.u32 %s2, %s1;\n\tmov.u32 %s1, 55;\n\tst.param.b32 [func_retval0], %s2;\n\tret;\n}}\n\
.visible .entry k(\n\t.param .u64 out\n)\n{{\n\t.reg .b32 %r<8>;\n\t.reg .b64 %rd<4>;\n\tld.param.u64 %rd1, [out];\n\tmov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %r6;\n\tmov.u32 %r6, 77;\n\t{{\n\t.param .b32 retval0;\n\tcall.uni (retval0), stale, ();\n\tld.param.b32 %r3, [retval0];\n\t}}\n\tadd.u32 %r4, %r2, %r3;\n\tmul.wide.u32 %rd2, %r1, 4;\n\tadd.s64 %rd3, %rd1, %rd2;\n\tst.global.u32 [%rd3], %r4;\n\tret;\n}}\n\
.visible .entry other()\n{{\n\t.reg .b32 %q<50>;\n\tmov.u32 %q1, 1;\n\tret;\n}}\n"
    );
    let m = module(&src);
    let k = m.kernel("k").expect("k");
    let mut mem = Mem::new();
    let out = mem.alloc(4 * 8);
    // One host thread: the eight blocks run one after another on the same register file.
    launch(
        &k,
        dim(8, 1, 1),
        dim(1, 1, 1),
        &Args::new().u64(out),
        &mem,
        1,
    )
    .expect("launch");
    assert_eq!(mem.u32s(out), [0; 8]);
}

/// Every special register, read by every thread of a 3-D grid of 3-D blocks whose last warp is
/// partial, with static and dynamic shared memory, against the values the PTX ISA defines
/// (computed here from each thread's coordinates); `%warpid`/`%nwarpid`/`%smid`/`%nsmid` as the
/// stand-in defines them (one SM running the block's warps in order).
#[test]
fn special_registers_describe_each_thread() {
    let per_axis = |name: &str| ["x", "y", "z"].map(|axis| format!("%{name}.{axis}"));
    let mut names: Vec<String> = ["tid", "ntid", "ctaid", "nctaid"]
        .iter()
        .flat_map(|name| per_axis(name))
        .collect();
    let named = ["laneid", "warpid", "nwarpid", "smid", "nsmid", "gridid"];
    names.extend(named.map(|name| format!("%{name}")));
    names.extend(["eq", "lt", "le", "gt", "ge"].map(|m| format!("%lanemask_{m}")));
    names.extend(["dynamic", "total"].map(|size| format!("%{size}_smem_size")));
    names.push("activemask".into());
    let (grid, block) = ([2u32, 3, 2], [7u32, 5, 2]);
    let per_block = (block[0] * block[1] * block[2]) as usize;
    let blocks = (grid[0] * grid[1] * grid[2]) as usize;
    let mut body = String::from(
        "\tmov.u32 %r2, s;\n\
         \tmov.u32 %r3, %ctaid.z;\n\tmov.u32 %r4, %nctaid.y;\n\tmov.u32 %r5, %ctaid.y;\n\
         \tmad.lo.u32 %r6, %r3, %r4, %r5;\n\tmov.u32 %r4, %nctaid.x;\n\tmov.u32 %r5, %ctaid.x;\n\
         \tmad.lo.u32 %r7, %r6, %r4, %r5;\n\
         \tmov.u32 %r3, %tid.z;\n\tmov.u32 %r4, %ntid.y;\n\tmov.u32 %r5, %tid.y;\n\
         \tmad.lo.u32 %r6, %r3, %r4, %r5;\n\tmov.u32 %r4, %ntid.x;\n\
         \tmad.lo.u32 %r8, %r6, %r4, %r1;\n",
    );
    body += &format!("\tmad.lo.u32 %r9, %r7, {per_block}, %r8;\n");
    body += &format!("\tmul.wide.u32 %rd2, %r9, {};\n", 4 * names.len());
    body += "\tadd.s64 %rd3, %rd1, %rd2;\n";
    for (i, name) in names.iter().enumerate() {
        if name == "activemask" {
            body += "\tactivemask.b32 %r20;\n";
        } else {
            body += &format!("\tmov.u32 %r20, {name};\n");
        }
        body += &format!("\tst.global.u32 [%rd3+{}], %r20;\n", 4 * i);
    }
    let src = kernel_src("\t.shared .align 4 .b8 s[16];", &body);
    let m = module(&src);
    let k = m.kernel("k").expect("k");
    for dynamic in [0usize, 12] {
        let mut mem = Mem::new();
        let out = mem.alloc(4 * names.len() * per_block * blocks);
        let args = Args::new().u64(out);
        let launch = tandem_ptx::Launch {
            dynamic_shared: dynamic,
            ..launch_of(
                dim(grid[0], grid[1], grid[2]),
                dim(block[0], block[1], block[2]),
                &args,
                2,
            )
        };
        tandem_ptx::run(&k, &launch, &mem).expect("launch");
        let out = mem.u32s(out);
        let (warps, last_warp) = (per_block.div_ceil(32), per_block % 32);
        for b in 0..blocks {
            let ctaid = [
                b as u32 % grid[0],
                b as u32 / grid[0] % grid[1],
                b as u32 / (grid[0] * grid[1]),
            ];
            for t in 0..per_block {
                let tid = [
                    t as u32 % block[0],
                    t as u32 / block[0] % block[1],
                    t as u32 / (block[0] * block[1]),
                ];
                let lane = t as u32 % 32;
                let lanes_below: u32 = (0..lane).map(|l| 1 << l).sum();
                let lanes_above: u32 = (lane + 1..32).map(|l| 1 << l).sum();
                let lanes_in_warp = if t / 32 == warps - 1 { last_warp } else { 32 };
                let want = [
                    tid[0],
                    tid[1],
                    tid[2],
                    block[0],
                    block[1],
                    block[2],
                    ctaid[0],
                    ctaid[1],
                    ctaid[2],
                    grid[0],
                    grid[1],
                    grid[2],
                    lane,
                    (t / 32) as u32,
                    warps as u32,
                    0,
                    1,
                    0,
                    1 << lane,
                    lanes_below,
                    lanes_below | 1 << lane,
                    lanes_above,
                    lanes_above | 1 << lane,
                    dynamic as u32,
                    16 + dynamic as u32,
                    (0..lanes_in_warp as u32).map(|l| 1u32 << l).sum(),
                ];
                let at = (b * per_block + t) * names.len();
                for (i, name) in names.iter().enumerate() {
                    assert_eq!(
                        out[at + i],
                        want[i],
                        "{name} in block {ctaid:?}, thread {tid:?}, dynamic shared {dynamic}"
                    );
                }
            }
        }
    }
}

/// Fences, prefetches, `nanosleep` and `pmevent` change nothing a thread computes, `ldu` loads
/// like `ld`, `trap` fails the launch naming itself, and `brx.idx` (an indirect branch the
/// stand-in does not model) is refused when the module is parsed, naming it.
#[test]
fn fences_and_hints_do_nothing_ldu_loads_and_trap_fails() {
    let body = "
	membar.gl;
	membar.cta;
	fence.sc.gpu;
	fence.acq_rel.sys;
	fence.proxy.alias;
	prefetch.global.L2 [%rd1];
	prefetchu.L1 [%rd1];
	nanosleep.u32 100;
	pmevent 1;
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r1;
	membar.sys;
	ldu.global.u32 %r2, [%rd1+4];
	add.u32 %r3, %r2, %r1;
	st.global.u32 [%rd3+128], %r3;";
    let (r, out) = run_src(&kernel_src("", body), 1, 32, 64 * 4);
    r.expect("launch");
    // Thread 1's store of 1 at word 1 may or may not precede another thread's `ldu` of it (no
    // barrier), so the second half is checked against the value the load could see.
    assert_eq!(&out[..32], (0..32).collect::<Vec<u32>>());
    for (t, &v) in out[32..].iter().enumerate() {
        assert!(v == t as u32 + 1 || v == t as u32, "thread {t}: {v}");
    }
    let body = "
	setp.eq.u32 %p1, %r1, 3;
	@%p1 trap;";
    let (r, _) = run_src(&kernel_src("", body), 1, 32, 4);
    let m = failure(r);
    assert!(m.contains("trap"), "{m}");
    let src = kernel_src("", "\tbrx.idx %r1, $T;\n$T:");
    let e = Module::parse(&src).expect_err("brx is not modelled");
    assert!(e.message.contains("brx.idx"), "{}", e.message);
}

/// Votes over half-warp membermasks, each half on its own path: ballots of a predicate and of
/// its negation, `uni` over mixed, all-true and all-false predicates, `any` and `all`.
#[test]
fn votes_over_partial_membermasks() {
    let body = "
	and.b32 %r2, %r7, 3;
	setp.eq.u32 %p1, %r2, 0;
	setp.lt.u32 %p5, %r7, 16;
	@%p5 bra $LOW;
	vote.sync.ballot.b32 %r3, !%p1, 0xffff0000;
	vote.sync.uni.pred %p2, %p1, 0xffff0000;
	setp.ge.u32 %p6, %r7, 8;
	vote.sync.uni.pred %p3, %p6, 0xffff0000;
	vote.sync.any.pred %p4, !%p6, 0xffff0000;
	bra.uni $DONE;
$LOW:
	vote.sync.ballot.b32 %r3, %p1, 0xffff;
	vote.sync.uni.pred %p2, %p1, 0xffff;
	setp.lt.u32 %p6, %r7, 16;
	vote.sync.uni.pred %p3, !%p6, 0xffff;
	vote.sync.all.pred %p4, %p6, 0xffff;
$DONE:
";
    let out = run_votes(body);
    let multiples_of_4 =
        |lanes: std::ops::Range<u32>| -> u32 { lanes.filter(|l| l % 4 == 0).map(|l| 1 << l).sum() };
    for t in 0..32 {
        let want = if t < 16 {
            // ballot(p1), uni(mixed), uni(all false), all(all true)
            [multiples_of_4(0..16), 0, 1, 1]
        } else {
            // ballot(!p1), uni(mixed), uni(all true), any(all false)
            [0xffff_0000 & !multiples_of_4(16..32), 0, 1, 0]
        };
        assert_eq!(&out[t * 4..t * 4 + 4], want, "lane {t}");
    }
}

/// A warp-synchronous instruction whose membermask leaves out the lane executing it, or names
/// a lane a partial warp does not have, fails the launch saying which; so does `bar.warp.sync`
/// with a mask that leaves out its own lane.
#[test]
fn membermasks_that_cannot_be_met_fail_naming_the_lane() {
    let cases = [
        // (block, body, what the message must say)
        (
            32,
            "\tshfl.sync.idx.b32 %r3, %r1, 0, 31, 1;",
            "lane 1 executes a warp-synchronous instruction with membermask 0x00000001",
        ),
        (
            40,
            "\tvote.sync.ballot.b32 %r3, %p1, -1;",
            "lane 8 of membermask 0xffffffff does not exist (partial warp)",
        ),
        (
            32,
            "\tbar.warp.sync 1;",
            "lane 1 executes bar.warp.sync with membermask 0x00000001",
        ),
    ];
    for (block, body, says) in cases {
        let (r, _) = run_src(&kernel_src("", body), 1, block, 4);
        let m = failure(r);
        assert!(m.contains(says), "{body}: {m}");
    }
}

/// Named barriers with thread counts: the first 64 threads meet at barrier 1 (count 64) while
/// the last 32 meet at barrier 2 (count 32); each group then reads what its partner in the group
/// wrote to shared memory before the barrier. Then again with the barrier and the count in
/// registers, each group's own, at one `bar.sync` both groups execute.
#[test]
fn named_barriers_with_counts_release_their_own_group() {
    let body = "
	mov.u32 %r2, s;
	shl.b32 %r3, %r1, 2;
	add.s32 %r4, %r2, %r3;
	add.u32 %r5, %r1, 1000;
	st.shared.u32 [%r4], %r5;
	setp.lt.u32 %p1, %r1, 64;
	@%p1 bra $FIRST;
	bar.sync 2, 32;
	xor.b32 %r6, %r1, 31;
	bra.uni $READ;
$FIRST:
	bar.sync 1, 64;
	xor.b32 %r6, %r1, 63;
$READ:
	shl.b32 %r7, %r6, 2;
	add.s32 %r8, %r2, %r7;
	ld.shared.u32 %r9, [%r8];
	add.u32 %r5, %r1, 2000;
	st.shared.u32 [%r4+384], %r5;
	selp.u32 %r10, 3, 4, %p1;
	selp.u32 %r11, 64, 32, %p1;
	bar.sync %r10, %r11;
	ld.shared.u32 %r12, [%r8+384];
	mul.wide.u32 %rd2, %r1, 8;
	add.s64 %rd3, %rd1, %rd2;
	st.global.v2.u32 [%rd3], {%r9, %r12};";
    let (r, out) = run_src(
        &kernel_src("\t.shared .align 4 .b8 s[768];", body),
        1,
        96,
        96 * 8,
    );
    r.expect("launch");
    for t in 0..96 {
        let partner = if t < 64 { t ^ 63 } else { t ^ 31 };
        assert_eq!(
            out[2 * t..2 * t + 2],
            [partner as u32 + 1000, partner as u32 + 2000],
            "thread {t}"
        );
    }
}

/// `run` refuses a launch the hardware would refuse, naming the kernel and what is wrong: a zero
/// grid or block dimension, more than 1024 threads a block (however the dimensions make them),
/// and parameter bytes that are not the kernel's; 1024 threads and the right bytes run.
#[test]
fn launches_the_hardware_would_refuse_are_invalid_values() {
    let m = module(&kernel_src("", ""));
    let k = m.kernel("k").expect("k");
    let mem = Mem::new();
    let right = Args::new().u64(0);
    let refused = |grid, block, args: &Args| match launch(&k, grid, block, args, &mem, 1) {
        Err(ExecError::InvalidValue(m)) if m.contains("kernel `k`") => m,
        other => panic!("grid {grid:?} block {block:?}: {other:?}"),
    };
    for (grid, block) in [
        (dim(0, 1, 1), dim(1, 1, 1)),
        (dim(1, 1, 0), dim(1, 1, 1)),
        (dim(1, 1, 1), dim(1, 0, 1)),
    ] {
        let m = refused(grid, block, &right);
        assert!(m.contains("a zero grid or block dimension"), "{m}");
    }
    for (block, threads) in [(dim(32, 16, 3), 1536), (dim(1025, 1, 1), 1025)] {
        let m = refused(dim(1, 1, 1), block, &right);
        assert!(
            m.contains(&format!("{threads} threads per block (at most 1024)")),
            "{m}"
        );
    }
    let m = refused(dim(1, 1, 1), dim(1, 1, 1), &Args::new().u32(0));
    assert!(
        m.contains("4 bytes of parameters, the kernel takes 8"),
        "{m}"
    );
    // The kernel stores nothing (its body is empty), so a null output address is never used.
    launch(&k, dim(2, 1, 1), dim(32, 32, 1), &right, &mem, 2).expect("1024 threads");
}

/// `%clock64` counts up within a thread: each read is later than the one before it.
#[test]
fn the_clock_counts_up() {
    let body = "
	mov.u64 %rd4, %clock64;
	mov.u64 %rd5, %clock64;
	mov.u32 %r2, %clock;
	setp.gt.u64 %p1, %rd5, %rd4;
	cvt.u64.u32 %rd6, %r2;
	setp.gt.u64 %p2, %rd6, %rd5;
	and.pred %p3, %p1, %p2;
	selp.u32 %r3, 1, 0, %p3;
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r3;";
    let (r, out) = run_src(&kernel_src("", body), 2, 64, 64 * 4);
    r.expect("launch");
    assert_eq!(out, [1; 64]);
}

/// Of several failing blocks run by several host threads, the launch reports the lowest one's
/// error, as a sequential run would: block 1 fails at once while block 0 fails only after a
/// long loop, so block 1's error is almost always recorded first and must give way.
#[test]
fn a_launch_reports_the_lowest_failing_block() {
    let body = "
	mov.u32 %r2, %ctaid.x;
	setp.ne.u32 %p1, %r2, 0;
	@%p1 bra $FAIL;
	mov.u32 %r3, 0;
$LOOP:
	add.u32 %r3, %r3, 1;
	setp.lt.u32 %p2, %r3, 200000;
	@%p2 bra $LOOP;
$FAIL:
	ld.global.u32 %r4, [8];";
    for _ in 0..3 {
        let m = module(&kernel_src("", body));
        let k = m.kernel("k").expect("k");
        let mem = Mem::new();
        let r = launch(&k, dim(2, 1, 1), dim(1, 1, 1), &Args::new().u64(0), &mem, 2);
        match r {
            Err(ExecError::IllegalAddress(m)) => assert!(m.contains("block (0,0,0)"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

/// Each warp's shuffle involves its own lanes only: with the middle warp of three exited, the
/// first and last still exchange among themselves.
#[test]
fn warps_shuffle_on_their_own_beside_an_exited_warp() {
    let body = "
	shr.u32 %r2, %r1, 5;
	setp.eq.u32 %p1, %r2, 1;
	@%p1 exit;
	shfl.sync.bfly.b32 %r3, %r1, 1, 31, -1;
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r3;";
    let (r, out) = run_src(&kernel_src("", body), 1, 96, 96 * 4);
    r.expect("launch");
    for (t, &v) in out.iter().enumerate() {
        let want = if t / 32 == 1 { 0 } else { t as u32 ^ 1 };
        assert_eq!(v, want, "thread {t}");
    }
}

/// Lanes of one membermask at two different warp-synchronous instructions (undefined in CUDA:
/// every lane of the mask must execute the same one) are never released together: the launch
/// fails rather than mix them. Two shuffles, and a `bar.warp.sync` beside a shuffle, in the first
/// warp of two, the second having exited (its lanes are no part of the first's masks).
#[test]
fn lanes_at_different_warp_synchronous_instructions_fail_the_launch() {
    for (high, low) in [
        (
            "shfl.sync.bfly.b32 %r3, %r1, 1, 31, -1;",
            "shfl.sync.bfly.b32 %r3, %r1, 2, 31, -1;",
        ),
        (
            "bar.warp.sync -1;",
            "shfl.sync.bfly.b32 %r3, %r1, 2, 31, -1;",
        ),
    ] {
        let body = format!(
            "
	setp.ge.u32 %p2, %r1, 32;
	@%p2 exit;
	setp.lt.u32 %p1, %r1, 16;
	@%p1 bra $LOW;
	{high}
	bra.uni $DONE;
$LOW:
	{low}
$DONE:"
        );
        let src = kernel_src("", &body);
        let (r, _) = run_src(&src, 1, 64, 4);
        // Thread 0 waits at `low`; the report names a thread waiting elsewhere, and the warp
        // that exited.
        let high_line = src.lines().position(|l| l.contains(high)).expect("high") + 1;
        let says = [
            "deadlock".to_string(),
            format!("thread 16 waits at line {high_line}"),
            "32 exited".to_string(),
        ];
        assert!(
            matches!(&r, Err(ExecError::LaunchFailed(m)) if says.iter().all(|s| m.contains(s))),
            "{high} beside {low}: {r:?}"
        );
    }
}

/// `shfl.bfly` past its clamp lane keeps the lane's own value with a false predicate (the PTX
/// ISA's `j <= maxLane`), and a shuffle that reads a lane outside its membermask fails naming it.
#[test]
fn shuffles_clamp_and_refuse_lanes_outside_the_mask() {
    let body = "
	mul.lo.u32 %r2, %r1, 10;
	shfl.sync.bfly.b32 %r3|%p1, %r2, 17, 15, -1;
	selp.u32 %r4, 1, 0, %p1;
	mul.wide.u32 %rd2, %r1, 8;
	add.s64 %rd3, %rd1, %rd2;
	st.global.v2.u32 [%rd3], {%r3, %r4};";
    let (r, out) = run_src(&kernel_src("", body), 1, 32, 32 * 8);
    r.expect("launch");
    for l in 0..32u32 {
        let in_range = l ^ 17 <= 15;
        let from = if in_range { l ^ 17 } else { l };
        assert_eq!(
            out[l as usize * 2..l as usize * 2 + 2],
            [from * 10, in_range as u32],
            "lane {l}"
        );
    }
    // Lane 5 stays out of the mask (and of the shuffle); the others read it.
    let body = "
	setp.eq.u32 %p1, %r1, 5;
	@%p1 bra $DONE;
	shfl.sync.idx.b32 %r3, %r1, 5, 31, 0xffffffdf;
$DONE:";
    let (r, _) = run_src(&kernel_src("", body), 1, 32, 4);
    let m = failure(r);
    assert!(
        m.contains("reads lane 5, outside membermask 0xffffffdf"),
        "{m}"
    );
}

/// `mma.sync.m16n8k16` against the product written from the PTX ISA's fragment layouts: each
/// lane's A, B and C elements come from small integers (so every sum is exact in any order),
/// in f16 and bf16, and each lane's D must be its elements of A * B + C; two warps, each with
/// the same fragments.
#[test]
fn mma_computes_a_times_b_plus_c_in_the_isas_fragment_layout() {
    let a_of = |i: usize, k: usize| ((i + 2 * k) % 5) as f32 - 2.0;
    let b_of = |k: usize, j: usize| ((3 * k + j) % 7) as f32 - 3.0;
    let c_of = |i: usize, j: usize| (i * 8 + j) as f32;
    for (name, bits) in [
        (
            "f16",
            (|x: f32| half::f16::from_f32(x).to_bits()) as fn(f32) -> u16,
        ),
        ("bf16", |x: f32| half::bf16::from_f32(x).to_bits()),
    ] {
        let pair = |lo: f32, hi: f32| bits(lo) as u32 | (bits(hi) as u32) << 16;
        // Per lane (48 bytes): 4 A registers, 2 B registers, 4 C values as the ISA places
        // them, 2 words of padding.
        let mut input = Vec::new();
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for r in 0..4 {
                let (row, col) = (g + 8 * (r % 2), 2 * t + 8 * (r / 2));
                input.push(pair(a_of(row, col), a_of(row, col + 1)));
            }
            for r in 0..2 {
                let row = 2 * t + 8 * r;
                input.push(pair(b_of(row, g), b_of(row + 1, g)));
            }
            for i in 0..4 {
                input.push(c_of(g + 8 * (i / 2), 2 * t + i % 2).to_bits());
            }
            input.extend([0, 0]);
        }
        let src = format!(
            ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 src, .param .u64 dst)\n{{\n\t.reg .b32 %r<12>;\n\t.reg .b64 %rd<8>;\n\t.reg .f32 %f<8>;\n\
	ld.param.u64 %rd1, [src];\n\tld.param.u64 %rd2, [dst];\n\tmov.u32 %r1, %tid.x;\n\
	mul.wide.u32 %rd3, %r1, 48;\n\tadd.s64 %rd4, %rd1, %rd3;\n\
	ld.global.v4.u32 {{%r2, %r3, %r4, %r5}}, [%rd4];\n\tld.global.v2.u32 {{%r6, %r7}}, [%rd4+16];\n\
	ld.global.v2.f32 {{%f0, %f1}}, [%rd4+24];\n\tld.global.v2.f32 {{%f2, %f3}}, [%rd4+32];\n\
	mma.sync.aligned.m16n8k16.row.col.f32.{name}.{name}.f32 {{%f4, %f5, %f6, %f7}}, {{%r2, %r3, %r4, %r5}}, {{%r6, %r7}}, {{%f0, %f1, %f2, %f3}};\n\
	mul.wide.u32 %rd5, %r1, 16;\n\tadd.s64 %rd6, %rd2, %rd5;\n\
	st.global.v4.f32 [%rd6], {{%f4, %f5, %f6, %f7}};\n\tret;\n}}\n"
        );
        let m = module(&src);
        let k = m.kernel("k").expect("k");
        let mut mem = Mem::new();
        let s = mem.upload_u32(&input.repeat(2));
        let d = mem.alloc(64 * 16);
        launch(
            &k,
            dim(1, 1, 1),
            dim(64, 1, 1),
            &Args::new().u64(s).u64(d),
            &mem,
            1,
        )
        .expect("launch");
        let out = mem.f32s(d);
        for thread in 0..64 {
            let (g, t) = (thread % 32 / 4, thread % 4);
            for i in 0..4 {
                let (row, col) = (g + 8 * (i / 2), 2 * t + i % 2);
                let want =
                    (0..16).map(|k| a_of(row, k) * b_of(k, col)).sum::<f32>() + c_of(row, col);
                assert_eq!(
                    out[thread * 4 + i],
                    want,
                    "{name}: thread {thread}, D[{row}][{col}]"
                );
            }
        }
    }
}

/// A recursive call is refused naming the function, even one whose recursion would end after
/// two levels (the stand-in keeps no call stack in device memory).
#[test]
fn a_recursive_call_is_refused_even_when_bounded() {
    let src = format!(
        "{HEAD}.func (.param .b32 out) down(.param .b32 n)\n{{\n\t.reg .pred %q<2>;\n\t.reg .b32 %s<4>;\n\
	ld.param.b32 %s1, [n];\n\tsetp.eq.u32 %q1, %s1, 0;\n\t@%q1 bra $BASE;\n\tsub.u32 %s2, %s1, 1;\n\
	{{\n\t.param .b32 a0;\n\tst.param.b32 [a0], %s2;\n\t.param .b32 r0;\n\tcall.uni (r0), down, (a0);\n\tld.param.b32 %s3, [r0];\n\t}}\n\
	add.u32 %s1, %s3, 1;\n$BASE:\n\tst.param.b32 [out], %s1;\n\tret;\n}}\n\
.visible .entry k(\n\t.param .u64 out\n)\n{{\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<3>;\n\tld.param.u64 %rd1, [out];\n\
	{{\n\t.param .b32 a0;\n\tst.param.b32 [a0], 2;\n\t.param .b32 r0;\n\tcall.uni (r0), down, (a0);\n\tld.param.b32 %r1, [r0];\n\t}}\n\
	st.global.u32 [%rd1], %r1;\n\tret;\n}}\n"
    );
    let m = failure(run_src(&src, 1, 1, 4).0);
    assert!(
        m.contains("recursive call of `down` is not supported"),
        "{m}"
    );
}

/// 32-bit `cvta` between the shared window and generic addresses: to generic and back gives
/// the shared address again, and the generic address loads what the shared one stored.
#[test]
fn thirty_two_bit_cvta_round_trips_a_shared_address() {
    let body = "
	mov.u32 %r2, s;
	add.u32 %r2, %r2, 4;
	st.shared.u32 [%r2], 77;
	cvta.shared.u32 %r3, %r2;
	cvta.to.shared.u32 %r4, %r3;
	ld.shared.u32 %r5, [%r4];
	cvt.u64.u32 %rd2, %r3;
	st.global.v2.u32 [%rd1], {%r4, %r5};
	st.global.u64 [%rd1+8], %rd2;";
    let (r, out) = run_src(&kernel_src("\t.shared .align 4 .b8 s[16];", body), 1, 1, 16);
    r.expect("launch");
    assert_eq!(out[..2], [4, 77], "the shared address and what it holds");
    let generic = u64::from(out[2]) | u64::from(out[3]) << 32;
    assert_eq!(
        generic,
        (tandem_ptx::GENERIC_SHARED_BASE + 4) & 0xffff_ffff,
        "the generic address, in 32 bits"
    );
}

/// A kernel's interface as a driver reads it: its name, each parameter's offset, size and
/// alignment in the packed buffer, the buffer's size, and its static shared memory (its own
/// and the module's it uses, not the module's it does not). A `.func`, defined or only
/// declared, is no kernel.
#[test]
fn a_kernels_interface_is_what_a_driver_needs() {
    let src = format!(
        "{HEAD}.shared .align 8 .b8 table[24];
.shared .align 4 .b8 unused[1000];
.func declared();
.func helper()
{{
	ret;
}}
.visible .entry k(.param .u8 a, .param .u64 b, .param .align 8 .b8 c[12], .param .u16 d)
{{
	.reg .b64 %rd<2>;
	.shared .align 4 .b8 own[40];
	mov.u64 %rd1, table;
	mov.u64 %rd1, own;
	ret;
}}
"
    );
    let module = Module::parse(&src).unwrap();
    assert_eq!(module.kernel_names(), ["k"]);
    assert!(module.kernel("helper").is_none() && module.kernel("declared").is_none());
    let k = module.kernel("k").unwrap();
    assert_eq!(k.name(), "k");
    let layout: Vec<_> = k
        .params()
        .iter()
        .map(|p| (p.offset, p.size, p.align))
        .collect();
    assert_eq!(layout, [(0, 1, 1), (8, 8, 8), (16, 12, 8), (28, 2, 2)]);
    assert_eq!(k.param_bytes(), 30);
    assert_eq!(k.static_shared_bytes(), 64);
}
