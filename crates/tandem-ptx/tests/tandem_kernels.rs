//! tandem's own kernels (crates/tandem-kernels/ptx) against plain Rust references.
mod common;

use common::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| lcg(&mut s)).collect()
}

/// op(A) (m x k) . op(B) (k x n), accumulated in increasing k with fused multiply-adds as the
/// kernel does; optional bias + ReLU.
#[allow(clippy::too_many_arguments)]
fn matmul_ref(
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
    a_t: bool,
    b_t: bool,
) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for r in 0..m {
        for col in 0..n {
            let mut acc = 0f32;
            for kk in 0..k {
                let av = if a_t { a[kk * m + r] } else { a[r * k + kk] };
                let bv = if b_t {
                    b[col * k + kk]
                } else {
                    b[kk * n + col]
                };
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
fn run_matmul(
    m: usize,
    n: usize,
    k: usize,
    a_t: bool,
    b_t: bool,
    with_bias: bool,
    threads: usize,
    race_check: bool,
) -> (Vec<f32>, Vec<f32>, u64, f64) {
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
    let l = tandem_ptx::Launch {
        grid,
        block: dim(32, 8, 1),
        dynamic_shared: 0,
        params: &args.0,
        threads,
        race_check,
    };
    let t0 = std::time::Instant::now();
    let stats = tandem_ptx::run_counted(&kern, &l, &mem).expect("launch");
    let secs = t0.elapsed().as_secs_f64();
    let want = matmul_ref(&a, &b, with_bias.then_some(&bias[..]), m, n, k, a_t, b_t);
    (mem.f32s(dc), want, stats.instructions, secs)
}

#[test]
fn matmul_all_transposes_and_bias() {
    for (a_t, b_t, bias) in [
        (false, false, false),
        (true, false, true),
        (false, true, false),
        (true, true, true),
    ] {
        let (got, want, _, _) = run_matmul(37, 45, 70, a_t, b_t, bias, 2, false);
        assert_eq!(got, want, "a_t {a_t} b_t {b_t} bias {bias}");
    }
}

#[test]
fn matmul_speed_100x500x784() {
    let (got, want, n, secs) = run_matmul(100, 500, 784, false, false, false, 1, false);
    assert_eq!(got, want);
    println!(
        "matmul 100x500x784: {n} instructions in {secs:.3} s on 1 thread: {:.1} M instructions/s",
        n as f64 / secs / 1e6
    );
}

/// The same launch under the shared-memory race check: tandem's matmul is race-free (every
/// transpose), and what the check costs.
#[test]
fn matmul_race_checked() {
    for (a_t, b_t) in [(false, false), (true, true)] {
        let (got, want, _, _) = run_matmul(37, 45, 70, a_t, b_t, true, 2, true);
        assert_eq!(got, want);
    }
    let (got, want, n, secs) = run_matmul(100, 500, 784, false, false, false, 1, true);
    assert_eq!(got, want);
    println!(
        "matmul 100x500x784 race-checked: {n} instructions in {secs:.3} s on 1 thread: {:.1} M instructions/s",
        n as f64 / secs / 1e6
    );
}

fn kernel(module: &str, name: &str) -> std::sync::Arc<tandem_ptx::Kernel> {
    let m = common::module(&tandem_ptx(module));
    m.kernel(name).unwrap_or_else(|| panic!("no kernel {name}"))
}

#[test]
fn bias_add_and_relu_backward() {
    let (rows, cols) = (13usize, 37usize);
    let len = rows * cols;
    let x = values(len, 5);
    let bias = values(cols, 6);
    for relu in [0u32, 1] {
        let mut mem = Mem::new();
        let (dx, db) = (mem.upload_f32(&x), mem.upload_f32(&bias));
        let args = Args::new()
            .u64(dx)
            .u64(db)
            .u64(len as u64)
            .u32(cols as u32)
            .u32(relu);
        launch(
            &kernel("elementwise", "bias_add"),
            dim(2, 1, 1),
            dim(64, 1, 1),
            &args,
            &mem,
            2,
        )
        .expect("bias_add");
        let want: Vec<f32> = (0..len)
            .map(|i| {
                let v = x[i] + bias[i % cols];
                if relu == 1 {
                    v.max(0.0)
                } else {
                    v
                }
            })
            .collect();
        assert_eq!(mem.f32s(dx), want);
    }
    let mut act = values(len, 7);
    act[3] = f32::NAN;
    let grad = values(len, 8);
    let mut mem = Mem::new();
    let (dg, da) = (mem.upload_f32(&grad), mem.upload_f32(&act));
    let args = Args::new().u64(dg).u64(da).u64(len as u64);
    launch(
        &kernel("elementwise", "relu_backward"),
        dim(3, 1, 1),
        dim(32, 1, 1),
        &args,
        &mem,
        2,
    )
    .expect("relu_backward");
    let want: Vec<f32> = (0..len)
        .map(|i| if act[i] > 0.0 { grad[i] } else { 0.0 })
        .collect();
    assert_eq!(mem.f32s(dg), want);
}

#[test]
fn gather_rows() {
    let (examples, features, rows) = (9usize, 300usize, 5usize);
    let images: Vec<u8> = (0..examples * features)
        .map(|i| (i * 7 % 256) as u8)
        .collect();
    let ex_labels: Vec<u8> = (0..examples).map(|i| (i % 10) as u8).collect();
    let indices: Vec<u32> = vec![3, 0, 8, 3, 5];
    let mut mem = Mem::new();
    let (di, dl, dx_idx) = (
        mem.upload_u8(&images),
        mem.upload_u8(&ex_labels),
        mem.upload_u32(&indices),
    );
    let (dx, dlab) = (mem.alloc(rows * features * 4), mem.alloc(rows * 4));
    let args = Args::new()
        .u64(di)
        .u64(dl)
        .u64(dx_idx)
        .u32(features as u32)
        .u64(dx)
        .u64(dlab);
    launch(
        &kernel("gather", "gather"),
        dim(rows as u32, features.div_ceil(256) as u32, 1),
        dim(256, 1, 1),
        &args,
        &mem,
        2,
    )
    .expect("gather");
    let mut want = Vec::new();
    for &i in &indices {
        for f in 0..features {
            want.push(images[i as usize * features + f] as f32 / 255.0);
        }
    }
    assert_eq!(mem.f32s(dx), want);
    assert_eq!(
        mem.u32s(dlab),
        indices
            .iter()
            .map(|&i| ex_labels[i as usize] as u32)
            .collect::<Vec<_>>()
    );
}

#[test]
fn column_sum_mean_loss_count_correct() {
    let (rows, cols) = (300usize, 10usize);
    let x = values(rows * cols, 9);
    let mut mem = Mem::new();
    let dx = mem.upload_f32(&x);
    let dout = mem.alloc(cols * 4);
    let args = Args::new()
        .u64(dx)
        .u32(rows as u32)
        .u32(cols as u32)
        .u64(dout);
    launch(
        &kernel("reduce", "column_sum"),
        dim(1, 1, 1),
        dim(256, 1, 1),
        &args,
        &mem,
        1,
    )
    .expect("column_sum");
    let want: Vec<f32> = (0..cols)
        .map(|c| (0..rows).fold(0f32, |s, r| s + x[r * cols + c]))
        .collect();
    assert_eq!(mem.f32s(dout), want);

    // mean_loss: f64 sum of losses over a 256-thread tree, then the label check.
    let losses: Vec<f32> = values(rows, 10).iter().map(|v| v.abs() * 3.0).collect();
    let mut labels: Vec<u32> = (0..rows as u32).map(|r| r % 10).collect();
    labels[77] = 12;
    labels[200] = 10;
    let mut mem = Mem::new();
    let (dlosses, dlabels) = (mem.upload_f32(&losses), mem.upload_u32(&labels));
    let (dloss, dstatus) = (mem.alloc(4), mem.alloc(8));
    let args = Args::new()
        .u64(dlosses)
        .u64(dlabels)
        .u32(rows as u32)
        .u32(10)
        .u64(dloss)
        .u64(dstatus);
    launch(
        &kernel("reduce", "mean_loss"),
        dim(1, 1, 1),
        dim(256, 1, 1),
        &args,
        &mem,
        1,
    )
    .expect("mean_loss");
    let mut part: Vec<f64> = (0..256)
        .map(|t| {
            (t..rows)
                .step_by(256)
                .fold(0.0, |s, i| s + losses[i] as f64)
        })
        .collect();
    let mut s = 128;
    while s > 0 {
        for t in 0..s {
            part[t] += part[t + s];
        }
        s /= 2;
    }
    assert_eq!(mem.f32s(dloss), vec![(part[0] / rows as f64) as f32]);
    assert_eq!(mem.u32s(dstatus), vec![2, 12]);

    let logits = values(rows * 10, 11);
    let labels: Vec<u32> = (0..rows as u32).map(|r| (r * 3) % 10).collect();
    let mut mem = Mem::new();
    let (dz, dl) = (mem.upload_f32(&logits), mem.upload_u32(&labels));
    let dout = mem.alloc(12);
    let args = Args::new()
        .u64(dz)
        .u64(dl)
        .u32(rows as u32)
        .u32(10)
        .u64(dout);
    launch(
        &kernel("reduce", "count_correct"),
        dim(1, 1, 1),
        dim(256, 1, 1),
        &args,
        &mem,
        1,
    )
    .expect("count_correct");
    let hits = (0..rows)
        .filter(|&r| {
            let z = &logits[r * 10..r * 10 + 10];
            let mut best = 0;
            for c in 1..10 {
                if z[c] > z[best] {
                    best = c;
                }
            }
            best as u32 == labels[r]
        })
        .count() as u32;
    assert_eq!(mem.u32s(dout)[0], hits);
    assert_eq!(mem.u32s(dout)[1], 0);
}

#[test]
fn softmax_cross_entropy_rows() {
    let (rows, classes) = (7usize, 10usize);
    let z: Vec<f32> = values(rows * classes, 12).iter().map(|v| v * 5.0).collect();
    let mut labels: Vec<u32> = (0..rows as u32).map(|r| r % 10).collect();
    labels[4] = 11;
    let mut mem = Mem::new();
    let (dz, dl) = (mem.upload_f32(&z), mem.upload_u32(&labels));
    let (dd, dlosses) = (mem.alloc(rows * classes * 4), mem.alloc(rows * 4));
    let args = Args::new()
        .u64(dz)
        .u64(dl)
        .u64(dd)
        .u64(dlosses)
        .u32(rows as u32)
        .u32(classes as u32);
    launch(
        &kernel("softmax_xent", "softmax_cross_entropy"),
        dim(rows.div_ceil(4) as u32, 1, 1),
        dim(128, 1, 1),
        &args,
        &mem,
        2,
    )
    .expect("softmax");
    let d = mem.f32s(dd);
    let losses = mem.f32s(dlosses);
    for r in 0..rows {
        let row: Vec<f64> = z[r * classes..(r + 1) * classes]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let max = row.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        for c in 0..classes {
            let onehot = if c as u32 == labels[r] { 1.0 } else { 0.0 };
            let want = ((row[c] - max).exp() / sum - onehot) / rows as f64;
            let got = d[r * classes + c] as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "row {r} class {c}: {got} vs {want}"
            );
        }
        if (labels[r] as usize) < classes {
            let want = sum.ln() - (row[labels[r] as usize] - max);
            assert!(
                (losses[r] as f64 - want).abs() < 1e-5 * want.abs().max(1.0),
                "loss {r}: {} vs {want}",
                losses[r]
            );
        } else {
            assert!(losses[r].is_nan());
        }
    }
}

#[test]
fn sgd_ema_update_and_mean_gradients() {
    let len = 1000usize;
    for n in [1usize, 3, 6] {
        let p = values(len, 20);
        let e = values(len, 21);
        let grads: Vec<Vec<f32>> = (0..n).map(|j| values(len, 30 + j as u64)).collect();
        let mut mem = Mem::new();
        let (dp, de) = (mem.upload_f32(&p), mem.upload_f32(&e));
        let mut ptrs = [0u64; 16];
        for (j, g) in grads.iter().enumerate() {
            ptrs[j] = mem.upload_f32(g);
        }
        let (lr, wd, dd) = (0.05f32, 0.001f32, 0.9f32);
        let args = Args::new()
            .u64(dp)
            .u64(de)
            .u64s(&ptrs)
            .u32(n as u32)
            .u64(len as u64)
            .f32(lr)
            .f32(wd)
            .f32(dd);
        launch(
            &kernel("update", "sgd_ema_update"),
            dim(2, 1, 1),
            dim(256, 1, 1),
            &args,
            &mem,
            2,
        )
        .expect("sgd");
        let mean = |i: usize| {
            if n == 1 {
                return grads[0][i];
            }
            let mut s = grads[0][i];
            for g in &grads[1..] {
                s += g[i];
            }
            s * (1.0 / n as f32)
        };
        let (mut wp, mut we) = (p.clone(), e.clone());
        for i in 0..len {
            let g = mean(i);
            wp[i] = p[i] - lr * (g + wd * p[i]);
            we[i] = dd * e[i] + (1.0 - dd) * wp[i];
        }
        assert_eq!(mem.f32s(dp), wp, "n {n}");
        assert_eq!(mem.f32s(de), we, "n {n}");

        let out = mem.alloc(len * 4);
        let args = Args::new()
            .u64(out)
            .u64s(&ptrs)
            .u32(n as u32)
            .u64(len as u64);
        launch(
            &kernel("update", "mean_gradients"),
            dim(3, 1, 1),
            dim(256, 1, 1),
            &args,
            &mem,
            2,
        )
        .expect("mean_gradients");
        assert_eq!(
            mem.f32s(out),
            (0..len).map(mean).collect::<Vec<_>>(),
            "n {n}"
        );
    }
}

/// Runs a launch on one host thread, printing interpreted instructions per second.
fn timed(
    what: &str,
    k: &tandem_ptx::Kernel,
    grid: tandem_ptx::Dim3,
    block: tandem_ptx::Dim3,
    args: &Args,
    mem: &Mem,
) {
    let l = tandem_ptx::Launch {
        grid,
        block,
        dynamic_shared: 0,
        params: &args.0,
        threads: 1,
        race_check: false,
    };
    let t0 = std::time::Instant::now();
    let stats = tandem_ptx::run_counted(k, &l, mem).expect(what);
    let secs = t0.elapsed().as_secs_f64();
    let n = stats.instructions;
    println!(
        "{what}: {n} instructions in {secs:.3} s on 1 thread: {:.1} M instructions/s",
        n as f64 / secs / 1e6
    );
}

#[test]
fn sgd_ema_update_speed_400k() {
    let (len, n) = (400_000usize, 2usize);
    let p = values(len, 20);
    let e = values(len, 21);
    let mut mem = Mem::new();
    let (dp, de) = (mem.upload_f32(&p), mem.upload_f32(&e));
    let mut ptrs = [0u64; 16];
    for (j, ptr) in ptrs.iter_mut().enumerate().take(n) {
        *ptr = mem.upload_f32(&values(len, 30 + j as u64));
    }
    let args = Args::new()
        .u64(dp)
        .u64(de)
        .u64s(&ptrs)
        .u32(n as u32)
        .u64(len as u64)
        .f32(0.05)
        .f32(0.001)
        .f32(0.9);
    let grid = dim(len.div_ceil(256).min(4096) as u32, 1, 1);
    timed(
        "sgd_ema_update 400k",
        &kernel("update", "sgd_ema_update"),
        grid,
        dim(256, 1, 1),
        &args,
        &mem,
    );
    let (lr, wd, dd) = (0.05f32, 0.001f32, 0.9f32);
    let g0 = values(len, 30);
    let g1 = values(len, 31);
    let (got_p, got_e) = (mem.f32s(dp), mem.f32s(de));
    for i in (0..len).step_by(997) {
        let g = (g0[i] + g1[i]) * (1.0 / n as f32);
        let wp = p[i] - lr * (g + wd * p[i]);
        assert_eq!(got_p[i], wp, "p[{i}]");
        assert_eq!(got_e[i], dd * e[i] + (1.0 - dd) * wp, "e[{i}]");
    }
}

#[test]
fn softmax_cross_entropy_speed_20000x10() {
    let (rows, classes) = (20_000usize, 10usize);
    let z: Vec<f32> = values(rows * classes, 12).iter().map(|v| v * 5.0).collect();
    let labels: Vec<u32> = (0..rows as u32).map(|r| r % 10).collect();
    let mut mem = Mem::new();
    let (dz, dl) = (mem.upload_f32(&z), mem.upload_u32(&labels));
    let (dd, dlosses) = (mem.alloc(rows * classes * 4), mem.alloc(rows * 4));
    let args = Args::new()
        .u64(dz)
        .u64(dl)
        .u64(dd)
        .u64(dlosses)
        .u32(rows as u32)
        .u32(classes as u32);
    timed(
        "softmax_cross_entropy 20000x10",
        &kernel("softmax_xent", "softmax_cross_entropy"),
        dim(rows.div_ceil(4) as u32, 1, 1),
        dim(128, 1, 1),
        &args,
        &mem,
    );
    let losses = mem.f32s(dlosses);
    for r in (0..rows).step_by(331) {
        let row: Vec<f64> = z[r * classes..(r + 1) * classes]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let max = row.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        let want = sum.ln() - (row[labels[r] as usize] - max);
        assert!(
            (losses[r] as f64 - want).abs() < 1e-5 * want.abs().max(1.0),
            "loss {r}: {} vs {want}",
            losses[r]
        );
    }
}
