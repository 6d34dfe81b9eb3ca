//! `Launch::profile`: what a launch's threads did, counted from the instructions that ran, on a
//! hand-written kernel whose every count is known from its text.
mod common;

use common::*;
use tandem_ptx::{Launch, Module, Profile};

/// Threads below `n` load four floats from global memory, store one to shared memory and load
/// it back (an `ld.shared` followed by an `fma`, the pair the interpreter fuses), make one more
/// `fma` only when their index is odd (a guarded instruction), and store one float; the others
/// branch straight to the end.
const KERNEL: &str = ".version 9.0
.target sm_75
.address_size 64

.visible .entry k(.param .u64 src, .param .u64 dst, .param .u32 n)
{
	.reg .pred %p<3>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<8>;
	.reg .f32 %f<12>;
	.shared .align 4 .b8 tile[512];
	ld.param.u64 %rd1, [src];
	ld.param.u64 %rd2, [dst];
	ld.param.u32 %r2, [n];
	mov.u32 %r1, %tid.x;
	setp.ge.u32 %p1, %r1, %r2;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd3, %rd1;
	mul.wide.u32 %rd4, %r1, 16;
	add.s64 %rd5, %rd3, %rd4;
	ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd5];
	mov.u32 %r3, tile;
	shl.b32 %r4, %r1, 2;
	add.s32 %r5, %r3, %r4;
	st.shared.f32 [%r5], %f1;
	ld.shared.f32 %f5, [%r5];
	fma.rn.f32 %f6, %f5, %f2, %f3;
	and.b32 %r6, %r1, 1;
	setp.eq.u32 %p2, %r6, 1;
	@%p2 fma.rn.f32 %f6, %f6, %f4, %f4;
	cvta.to.global.u64 %rd6, %rd2;
	mul.wide.u32 %rd7, %r1, 4;
	add.s64 %rd6, %rd6, %rd7;
	st.global.f32 [%rd6], %f6;
DONE:
	ret;
}
";

fn profiled(block: u32, n: u32, threads: usize) -> (u64, Profile, Vec<f32>) {
    let module = Module::parse(KERNEL).expect("parse");
    let k = module.kernel("k").expect("kernel");
    let mut mem = Mem::new();
    let src: Vec<f32> = (0..4 * block).map(|i| i as f32 * 0.25).collect();
    let s = mem.upload_f32(&src);
    let d = mem.alloc(4 * block as usize);
    let args = Args::new().u64(s).u64(d).u32(n);
    let launch = Launch {
        profile: true,
        ..launch_of(dim(2, 1, 1), dim(block, 1, 1), &args, threads)
    };
    let stats = tandem_ptx::run_counted(&k, &launch, &mem).expect("launch");
    let profile = stats
        .profile
        .expect("a profiled launch reports its profile");
    (stats.instructions, profile, mem.f32s(d))
}

#[test]
fn a_profile_counts_what_the_threads_that_ran_did() {
    for threads in [1, 2] {
        let (block, n) = (64u32, 40u64);
        let (instructions, p, out) = profiled(block, n as u32, threads);
        let blocks = 2;
        let odd = n / 2;
        assert_eq!(p.global_bytes_read, blocks * n * 16, "one v4 load each");
        assert_eq!(p.global_bytes_written, blocks * n * 4);
        assert_eq!(p.shared_stores, blocks * n);
        assert_eq!(p.shared_loads, blocks * n, "the fused load counts once");
        assert_eq!(
            p.fmas,
            blocks * (n + odd),
            "the fused fma and the odd threads' guarded one"
        );
        // Every thread runs the 6 instructions to the branch (a conditional branch runs
        // whether taken or not) and `ret`; below n also the 17 from `cvta` to `st.global`, less
        // the guarded `fma` in even threads.
        let ran = blocks * (block as u64 * 7 + n * 16 + odd);
        assert_eq!(p.instructions, ran);
        // The unprofiled count includes the guarded-off instructions: the even threads' fma.
        assert_eq!(instructions, ran + blocks * (n - odd));
        // And the launch computed what the kernel says.
        for (t, &v) in out.iter().enumerate().take(n as usize) {
            let x: Vec<f32> = (0..4).map(|j| (4 * t + j) as f32 * 0.25).collect();
            let mut want = x[0].mul_add(x[1], x[2]);
            if t % 2 == 1 {
                want = want.mul_add(x[3], x[3]);
            }
            assert_eq!(v, want, "thread {t}");
        }
    }
}

#[test]
fn an_unprofiled_launch_reports_no_profile() {
    let module = Module::parse(KERNEL).expect("parse");
    let k = module.kernel("k").expect("kernel");
    let mut mem = Mem::new();
    let s = mem.upload_f32(&[0.0; 4]);
    let d = mem.alloc(4);
    let args = Args::new().u64(s).u64(d).u32(1);
    let launch = launch_of(dim(1, 1, 1), dim(1, 1, 1), &args, 1);
    let stats = tandem_ptx::run_counted(&k, &launch, &mem).expect("launch");
    assert_eq!(stats.profile, None);
    assert!(stats.instructions > 0);
}

/// The instructions every thread of one warp runs once, straight through: global loads and
/// stores of several widths and vector shapes, vector shared accesses (not the fused pair),
/// local and parameter accesses (counted as neither), f32 `fma` in a directed rounding and with
/// `.ftz` (not the fused fast path), an f64 `fma` (not an f32 multiply-add) and one
/// `mma.sync.m16n8k16` of f16 ones.
const EVERY_KIND: &str = "	ld.param.u64 %rd1, [src];
	ld.param.u64 %rd2, [dst];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd3, %r1, 8;
	add.s64 %rd4, %rd1, %rd3;
	ld.global.v2.u16 {%h1, %h2}, [%rd4];
	ld.global.f32 %f1, [%rd4+4];
	mov.u32 %r2, tile;
	shl.b32 %r3, %r1, 3;
	add.s32 %r4, %r2, %r3;
	st.shared.v2.f32 [%r4], {%f1, %f1};
	ld.shared.v2.f32 {%f2, %f3}, [%r4];
	st.local.f32 [loc], %f2;
	ld.local.f32 %f4, [loc];
	fma.rz.f32 %f5, %f2, %f3, %f4;
	fma.rn.ftz.f32 %f6, %f5, %f3, %f4;
	cvt.f64.f32 %fd1, %f6;
	fma.rn.f64 %fd2, %fd1, %fd1, %fd1;
	mov.b32 %r5, 0x3c003c00;
	mov.f32 %f7, 0f00000000;
	mov.f32 %f8, 0f00000000;
	mov.f32 %f9, 0f00000000;
	mov.f32 %f10, 0f00000000;
	mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f7, %f8, %f9, %f10}, {%r5, %r5, %r5, %r5}, {%r5, %r5}, {%f7, %f8, %f9, %f10};
	mul.wide.u32 %rd5, %r1, 24;
	add.s64 %rd6, %rd2, %rd5;
	st.global.u16 [%rd6], %h2;
	st.global.v2.f32 [%rd6+8], {%f7, %f10};
	st.global.f64 [%rd6+16], %fd2;
	ret;";

#[test]
fn a_profile_counts_each_kind_of_access_and_multiply_add_as_defined() {
    let src = format!(
        ".version 9.0\n.target sm_80\n.address_size 64\n\n.visible .entry k(.param .u64 src, .param .u64 dst)\n{{\n\t.reg .b16 %h<3>;\n\t.reg .b32 %r<6>;\n\t.reg .b64 %rd<7>;\n\t.reg .f32 %f<11>;\n\t.reg .f64 %fd<3>;\n\t.shared .align 8 .b8 tile[256];\n\t.local .align 4 .b8 loc[4];\n{EVERY_KIND}\n}}\n"
    );
    let module = Module::parse(&src).expect("parse");
    let k = module.kernel("k").expect("kernel");
    let mut mem = Mem::new();
    let lanes = 32u64;
    let input: Vec<u32> = (0..lanes as u32)
        .flat_map(|t| [t | (t + 1) << 16, (t as f32 * 0.5).to_bits()])
        .collect();
    let s = mem.upload_u32(&input);
    let d = mem.alloc(24 * lanes as usize);
    let args = Args::new().u64(s).u64(d);
    let launch = Launch {
        profile: true,
        ..launch_of(dim(1, 1, 1), dim(lanes as u32, 1, 1), &args, 1)
    };
    let stats = tandem_ptx::run_counted(&k, &launch, &mem).expect("launch");
    let p = stats
        .profile
        .expect("a profiled launch reports its profile");
    let per_lane = EVERY_KIND.lines().count() as u64;
    assert_eq!(p.instructions, lanes * per_lane);
    assert_eq!(stats.instructions, lanes * per_lane, "nothing guarded off");
    assert_eq!(
        p.global_bytes_read,
        lanes * (2 * 2 + 4),
        "a u16 pair, an f32"
    );
    assert_eq!(
        p.global_bytes_written,
        lanes * (2 + 2 * 4 + 8),
        "u16, f32 pair, f64"
    );
    assert_eq!(p.shared_loads, lanes, "one vector load each");
    assert_eq!(p.shared_stores, lanes, "one vector store each");
    assert_eq!(
        p.fmas,
        lanes * (2 + 16 * 8 * 16 / 32),
        "two f32 fma and the mma's share"
    );
    // And the threads computed what the text says: the second u16, the mma's sums of sixteen
    // ones, and the f64 fma of the f32 result.
    let out = mem.u32s(d);
    let f64s = mem.f64s(d);
    for t in 0..lanes as usize {
        assert_eq!(out[t * 6] & 0xffff, t as u32 + 1, "lane {t}: u16");
        assert_eq!(out[t * 6 + 2], 16f32.to_bits(), "lane {t}: mma");
        assert_eq!(out[t * 6 + 3], 16f32.to_bits(), "lane {t}: mma");
        let x = t as f32 * 0.5;
        let f5 = x * x + x; // exact for these x: no rounding mode can change it
        let f6 = f5.mul_add(x, x) as f64;
        assert_eq!(f64s[t * 3 + 2], f6.mul_add(f6, f6), "lane {t}: f64 fma");
    }
}

/// Two launches' profiles add field by field (what a driver sums over a kernel's launches).
#[test]
fn profiles_add_field_by_field() {
    let profile = |n: u64| Profile {
        instructions: n,
        global_bytes_read: 2 * n,
        global_bytes_written: 3 * n,
        shared_loads: 4 * n,
        shared_stores: 5 * n,
        fmas: 6 * n,
    };
    let mut sum = profile(1);
    sum += profile(10);
    assert_eq!(sum, profile(11));
}
