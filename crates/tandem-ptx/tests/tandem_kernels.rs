//! tandem's own kernels (crates/tandem-kernels/ptx) against plain Rust references.
mod common;

use common::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| lcg(&mut s)).collect()
}

/// op(A) (m x k) . op(B) (k x n), accumulated in increasing k with fused multiply-adds as the
/// kernel does; optional bias + ReLU.
#[allow(clippy::too_many_arguments)]
fn matmul_ref(a: &[f32], b: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize, a_t: bool, b_t: bool) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for r in 0..m {
        for col in 0..n {
            let mut acc = 0f32;
            for kk in 0..k {
                let av = if a_t { a[kk * m + r] } else { a[r * k + kk] };
                let bv = if b_t { b[col * k + kk] } else { b[kk * n + col] };
                acc = av.mul_add(bv, acc);
            }
            c[r * n + col] = match bias {
                Some(bias) => (acc + bias[col]).max(0.0),
                None => acc,
            };
        }
    }
    c
}

#[allow(clippy::too_many_arguments)]
fn run_matmul(m: usize, n: usize, k: usize, a_t: bool, b_t: bool, with_bias: bool, threads: usize) -> (Vec<f32>, Vec<f32>, u64, f64) {
    let module = module(&tandem_ptx("matmul"));
    let kern = module.kernel("matmul").expect("matmul");
    let a = values(m * k, 1);
    let b = values(k * n, 2);
    let bias = values(n, 3);
    let mut mem = Mem::new();
    let (da, db) = (mem.upload_f32(&a), mem.upload_f32(&b));
    let dc = mem.alloc(m * n * 4);
    let dbias = if with_bias { mem.upload_f32(&bias) } else { 0 };
    let args = Args::new()
        .u64(da)
        .u64(db)
        .u64(dc)
        .u64(dbias)
        .u32(m as u32)
        .u32(n as u32)
        .u32(k as u32)
        .u32(a_t as u32)
        .u32(b_t as u32);
    let grid = dim(n.div_ceil(32) as u32, m.div_ceil(32) as u32, 1);
    let l = tandem_ptx::Launch { grid, block: dim(32, 8, 1), dynamic_shared: 0, params: &args.0, threads };
    let t0 = std::time::Instant::now();
    let stats = tandem_ptx::run_counted(&kern, &l, &mem).expect("launch");
    let secs = t0.elapsed().as_secs_f64();
    let want = matmul_ref(&a, &b, with_bias.then_some(&bias[..]), m, n, k, a_t, b_t);
    (mem.f32s(dc), want, stats.instructions, secs)
}

#[test]
fn matmul_all_transposes_and_bias() {
    for (a_t, b_t, bias) in [(false, false, false), (true, false, true), (false, true, false), (true, true, true)] {
        let (got, want, _, _) = run_matmul(37, 45, 70, a_t, b_t, bias, 2);
        assert_eq!(got, want, "a_t {a_t} b_t {b_t} bias {bias}");
    }
}

#[test]
fn matmul_speed_100x500x784() {
    let (got, want, n, secs) = run_matmul(100, 500, 784, false, false, false, 1);
    assert_eq!(got, want);
    println!("matmul 100x500x784: {n} instructions in {secs:.3} s on 1 thread: {:.1} M instructions/s", n as f64 / secs / 1e6);
}
