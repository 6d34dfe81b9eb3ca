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
