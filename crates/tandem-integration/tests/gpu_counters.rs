//! What a GPU training step costs the host, from the driver stand-in's counters
//! (`TANDEM_EMU_STATS`): with the parameters of record on the device, a step of `cuda:0x2`
//! (sync and async) and of `cuda:0,1` (sync) moves only the batch's indices and, at the next
//! boundary, its loss over the host bus, never waits for the device, and launches each
//! replica's step as one CUDA graph with the store's update inside it (nothing else is
//! launched; async replicas on one GPU share its order, each update first in its worker's next
//! step). SGD and
//! Adam alike: the optimiser's state stays on the device with the parameters; bf16 and f16
//! replicas alike, their f32 master weights on the device beside them, each update writing
//! the rounded copy they read (f16 also reads its overflow flags, 256 bytes, as each pass
//! ends: the one wait of its steps). (Needs `--features cuda` and the stand-in: its counters are the evidence; on
//! NVIDIA's driver, or without a device, the test says `SKIPPED` and returns, or fails under
//! `TANDEM_REQUIRE_GPU=1` when there is no device; on the stand-in, a run that leaves no
//! statistics fails.)
//!
//! The same runs report what each step's graph holds and what each kernel did (issue 30's
//! census), and the census runs repeat it at the reference's batch of 100 on `cuda:0` and
//! `cuda:0x2`, sync and async: kernel nodes a replica-step (bounded), no memset nodes, the
//! products' shared loads a multiply-add, bytes over the host bus a step (under 1 KB).
//!
//! The counters are process-wide and written at exit, so the test runs two trainings in child
//! processes (this test binary again), one longer than the other, both past the first epoch;
//! what they have in common (opening the replicas, uploading the data and the parameters,
//! saving at the end) cancels out of the difference, which is what the extra steps cost.
#![cfg(feature = "cuda")]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

use rand::SeedableRng;
use tandem_core::{DType, Optimizer, TrainState};
use tandem_kernels::{CudaBackend, KernelError};
use tandem_mnist::Mnist;
use tandem_model::{Mlp, MlpReplica, Network};
use tandem_optim::Chosen;
use tandem_pool::{Device, WorkerPool};
use tandem_strategy::{train, Batches, Exchange, Mode, NoObserver, Observer, Strategy};
use tandem_tensor::ExampleSet;

/// The overflow flags an f16 pass leaves, one a block of `kernels/narrow.cu`'s `unscale`.
const UNSCALE_FLAGS: f64 = 64.0;
/// How large and how long a pair of runs is: examples per worker and step, the training set
/// (the first examples of MNIST's), the two runs' lengths, both past the first epoch, and
/// whether the pool is the trainer's ([`tandem_strategy::sync::replicas_for`]: a sync run's
/// replicas of one GPU computed as one) or a replica a worker (as across processes).
#[derive(Debug, Clone, Copy)]
struct Scale {
    batch: usize,
    examples: usize,
    short: u64,
    long: u64,
    trainers_pool: bool,
}

/// Small batches, because the stand-in interprets every kernel: four steps of `cuda:0x2` sync
/// an epoch, a replica a worker (what a run across processes, or exchanging bf16, has).
const SMALL: Scale = Scale {
    batch: 8,
    examples: 64,
    short: 8,
    long: 20,
    trainers_pool: false,
};

/// Issue 30's census: the reference's batch of 100, an epoch of one step of `cuda:0x2` sync
/// (two of `cuda:0`), with the trainer's pool (sync `cuda:0x2`: one replica of both workers'
/// shards); a replica captures its graph by its third step (its first has no update before it,
/// its second is the first with one), so both async `cuda:0x2` replicas can by the seventh.
const CENSUS: Scale = Scale {
    batch: 100,
    examples: 200,
    short: 7,
    long: 10,
    trainers_pool: true,
};

/// The runs measured: a mode, its replicas' GPUs, the optimiser, the precision, the exchange
/// between the replicas and the scale.
type Run = (Mode, &'static [usize], &'static str, DType, Exchange, Scale);

const RUNS: [Run; 14] = [
    (Mode::Sync, &[0, 0], "sgd", DType::F32, Exchange::F32, SMALL),
    (
        Mode::Async,
        &[0, 0],
        "sgd",
        DType::F32,
        Exchange::F32,
        SMALL,
    ),
    (Mode::Sync, &[0, 1], "sgd", DType::F32, Exchange::F32, SMALL),
    (
        Mode::Sync,
        &[0, 0],
        "adam",
        DType::F32,
        Exchange::F32,
        SMALL,
    ),
    (
        Mode::Async,
        &[0, 0],
        "adam",
        DType::F32,
        Exchange::F32,
        SMALL,
    ),
    (
        Mode::Sync,
        &[0, 0],
        "sgd",
        DType::BF16,
        Exchange::F32,
        SMALL,
    ),
    (
        Mode::Async,
        &[0, 0],
        "sgd",
        DType::BF16,
        Exchange::F32,
        SMALL,
    ),
    (
        Mode::Sync,
        &[0, 1],
        "sgd",
        DType::BF16,
        Exchange::Bf16,
        SMALL,
    ),
    (Mode::Sync, &[0, 0], "sgd", DType::F16, Exchange::F32, SMALL),
    (
        Mode::Async,
        &[0, 0],
        "sgd",
        DType::F16,
        Exchange::F32,
        SMALL,
    ),
    (Mode::Sync, &[0], "sgd", DType::F32, Exchange::F32, CENSUS),
    (Mode::Async, &[0], "sgd", DType::F32, Exchange::F32, CENSUS),
    (
        Mode::Sync,
        &[0, 0],
        "sgd",
        DType::F32,
        Exchange::F32,
        CENSUS,
    ),
    (
        Mode::Async,
        &[0, 0],
        "sgd",
        DType::F32,
        Exchange::F32,
        CENSUS,
    ),
];

/// The optimiser `name` at its defaults.
fn optimizer(name: &str) -> Chosen {
    Chosen::configure(name, &[]).expect("a registered optimiser")
}

/// Logs every step (its loss with the L2 term, which the store computes).
struct EveryStep;

impl Observer for EveryStep {
    fn log_every(&self) -> u64 {
        1
    }
}

/// The strategy of `RUNS[run]`.
fn strategy(run: usize) -> Strategy {
    let (mode, _, _, _, exchange, _) = RUNS[run];
    Strategy {
        exchange,
        ..Strategy::from(mode)
    }
}

/// The devices of the pool of `RUNS[run]`, a replica each, and the workers each replica
/// computes.
fn pool_of(run: usize) -> (Vec<Device>, usize) {
    let (_, gpus, _, _, _, scale) = RUNS[run];
    let devices: Vec<Device> = gpus
        .iter()
        .map(|&ordinal| Device::Cuda { ordinal })
        .collect();
    match scale.trainers_pool {
        true => tandem_strategy::sync::replicas_for(&strategy(run), &devices),
        false => (devices, 1),
    }
}

/// The child's side: trains `steps` steps of `RUNS[run]`, logging every step where `logged`.
fn train_in_child(run: usize, steps: u64, logged: bool) {
    let (_, _, name, dtype, _, scale) = RUNS[run];
    let mnist = Mnist::load(&tandem_testkit::mnist_dir()).expect("the repository's MNIST copy");
    let all = mnist.train.into_examples().expect("consistent split");
    let features = all.features();
    let examples = ExampleSet::new(
        features,
        all.values()[..scale.examples * features].to_vec(),
        all.labels()[..scale.examples].to_vec(),
    )
    .expect("a prefix of a valid set");
    let (devices, shards) = pool_of(run);
    let batch = scale.batch * shards;
    let mut pool = WorkerPool::new(devices, |device| {
        let Device::Cuda { ordinal } = *device else {
            unreachable!("only GPUs here")
        };
        let backend = CudaBackend::with_dtype(ordinal, dtype)?;
        // f16 at a loss scale that no pass here overflows (one that did would add a pass).
        let replica = MlpReplica::new(Mlp::mnist(), backend, &examples, batch)?;
        Ok::<_, KernelError>(replica.with_initial_loss_scale(1024.0))
    })
    .expect("two GPU replicas");
    let optimizer = optimizer(name);
    let params = Mlp::mnist().init(0.1, &mut rand_chacha::ChaCha8Rng::seed_from_u64(2));
    let mut state = TrainState::new(params, &optimizer);
    let batches = Batches {
        batch_size: batch,
        seed: 3,
    };
    let observer: &dyn Observer = match logged {
        true => &EveryStep,
        false => &NoObserver,
    };
    let report = train(
        strategy(run),
        &mut pool,
        &mut state,
        &optimizer,
        &batches,
        steps,
        observer,
    )
    .expect("training on the stand-in");
    assert_eq!(report.steps, steps, "failures: {:?}", report.failures);
}

/// A stand-in statistics file: its totals, with its kernels' counters under `kernels`.
fn totals(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("the stand-in wrote its statistics");
    let stats: serde_json::Value = serde_json::from_str(&text).expect("statistics JSON");
    let mut totals = stats["totals"].clone();
    totals["kernels"] = stats["kernels"].clone();
    totals
}

/// How many times a pair of runs is tried before the test gives up on their being comparable.
const TRIES: usize = 8;

/// Runs the child for `steps` steps of `RUNS[run]` (logging every step where `logged`); the
/// stand-in's statistics, `None` when this is not the stand-in (none written).
fn run_once(run: usize, (steps, logged): (u64, bool), dir: &Path) -> Option<serde_json::Value> {
    let stats = dir.join(format!("{run}-{steps}-{logged}.json"));
    let status = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("TANDEM_TEST_RUN", run.to_string())
        .env("TANDEM_TEST_STEPS", steps.to_string())
        .env("TANDEM_TEST_LOGGED", logged.to_string())
        .env("TANDEM_EMU_STATS", &stats)
        // Its harness's lines ("1 passed") would be counted as tests by `.ci/cuda.sh`, more or
        // fewer with the retries; a failure still shows, on stderr and in the status.
        .stdout(Stdio::null())
        .status()
        .expect("running the child");
    assert!(status.success(), "run {run} of {steps} steps failed");
    if stats.exists() {
        return Some(totals(&stats));
    }
    assert!(
        !on_the_stand_in(),
        "the driver stand-in wrote no statistics ({}): its counters are these tests' evidence",
        stats.display()
    );
    None
}

/// Whether the CUDA driver this process loaded is tandem's stand-in, by the name it gives its
/// first device (a test that found no statistics file must not pass on it).
fn on_the_stand_in() -> bool {
    use std::ffi::{c_char, c_int, c_uint, CStr};
    extern "C" {
        fn cuInit(flags: c_uint) -> c_uint;
        fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> c_uint;
    }
    let mut name = [0 as c_char; 256];
    // SAFETY: the driver API's C signatures; the buffer holds the 256 bytes it is told of, and
    // the driver ends the name with a NUL within them.
    unsafe {
        cuInit(0) == 0
            && cuDeviceGetName(name.as_mut_ptr(), 256, 0) == 0
            && CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .contains("tandem-cuda-emu")
    }
}

/// A run's first statistics ([`run_once`]), run once for every test that asks: the other tests
/// read the census's unlogged runs (the L2 term's test those on `cuda:0`, the bf16 test async
/// `cuda:0x2` in f32 and bf16).
fn first_run(run: usize, spec: (u64, bool), dir: &Path) -> Option<serde_json::Value> {
    type Runs = BTreeMap<(usize, u64, bool), Arc<OnceLock<Option<serde_json::Value>>>>;
    static FIRST: Mutex<Runs> = Mutex::new(BTreeMap::new());
    let cell = {
        let mut first = FIRST.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(first.entry((run, spec.0, spec.1)).or_default())
    };
    cell.get_or_init(|| run_once(run, spec, dir)).clone()
}

/// The totals of a short and a long run of `RUNS[run]` whose difference is only steady steps
/// (`None` when this is not the stand-in). A replica runs its first steps kernel by kernel (its
/// first; a step with its store's work around it the first time, before it is captured as a
/// graph); async workers take tickets as they come, and on the stand-in one replica can take
/// most of them, so another may still be in those first steps in the longer run, or capture
/// its graph there (growing its buffer of step inputs, a wait and an allocation). A pair
/// counts when both runs launched as many kernels outside graphs and made as many allocations
/// (every step then costs the same whichever replica made it, so those steps cancel out of the
/// difference); otherwise both are run again, and any short run pairs with any long one (where
/// a replica either captures early or waits out the run behind the other's queued steps, each
/// run is one of a few kinds). A step that launches kernels outside its graph or allocates
/// every time fails here.
fn runs(run: usize, dir: &Path) -> Option<(serde_json::Value, serde_json::Value)> {
    let steady = |short: &serde_json::Value, long: &serde_json::Value| {
        ["kernel_launches", "allocations"]
            .iter()
            .all(|key| short[key] == long[key])
    };
    let (mut shorts, mut longs) = (Vec::new(), Vec::new());
    for tried in 0..TRIES {
        let Scale { short, long, .. } = RUNS[run].5;
        // The first try's runs may be another test's; a retry's are fresh.
        let run_now = if tried == 0 { first_run } else { run_once };
        shorts.push(run_now(run, (short, false), dir)?);
        longs.push(run_now(run, (long, false), dir)?);
        for short in &shorts {
            if let Some(long) = longs.iter().find(|long| steady(short, long)) {
                return Some((short.clone(), long.clone()));
            }
        }
    }
    panic!("run {run}: no short and long runs whose extra steps are all steady in {TRIES} tries");
}

/// Not a test of its own: the child process's training (`TANDEM_TEST_STEPS` steps of run
/// `TANDEM_TEST_RUN`), which [`run_once`] runs (with `--ignored`).
#[test]
#[ignore = "the child process of run_once"]
fn child() {
    let variable = |name| std::env::var(name).expect("run by run_once, which sets it");
    train_in_child(
        variable("TANDEM_TEST_RUN").parse().expect("a run"),
        variable("TANDEM_TEST_STEPS").parse().expect("a step count"),
        variable("TANDEM_TEST_LOGGED") == "true",
    );
}

/// A log line's L2 term costs the host bus the sums of squares of the regularised spans (8
/// bytes each, two spans here), not the parameters: the census's `cuda:0` runs (sync and
/// async) logging every step against the same runs unlogged, each a short and a long run's
/// difference (what opening and saving cost cancels out). (Each log also waits for the
/// device, and sync applies there the update the record does not hold yet: kernels beside the
/// graph, which the next step then skips.)
#[test]
fn a_logged_l2_term_reads_its_sums_not_the_parameters() {
    if tandem_testkit::or_skip(CudaBackend::new(0), KernelError::is_no_device).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let decayed = Mlp::mnist()
        .layout()
        .iter()
        .filter(|s| s.weight_decay)
        .count();
    for (run, spec) in RUNS.iter().enumerate() {
        let (mode, gpus, _, dtype, _, scale) = *spec;
        if gpus != [0] || dtype != DType::F32 || scale.batch != CENSUS.batch {
            continue;
        }
        let per_step = |logged| {
            let read = |steps| {
                let stats = first_run(run, (steps, logged), dir.path())?;
                stats["bytes_dtoh"].as_u64().map(|bytes| bytes as f64)
            };
            let (short, long) = (read(scale.short)?, read(scale.long)?);
            Some((long - short) / (scale.long - scale.short) as f64)
        };
        let (Some(unlogged), Some(logged)) = (per_step(false), per_step(true)) else {
            tandem_testkit::skipped(&"not the driver stand-in (no TANDEM_EMU_STATS file)");
            return;
        };
        let per_log = logged - unlogged;
        eprintln!("{}: {per_log} bytes from the device a log", mode.name());
        assert_eq!(per_log, 8.0 * decayed as f64, "{}", mode.name());
    }
}

/// A 16-bit async worker's copy of the record into its replica (at its first step, or a step
/// computed again) is rounded on the device: over a whole run, bf16 async replicas on one GPU
/// read back exactly what f32 ones do (their losses and the checkpoint's f32 master weights
/// and state), where that copy once read the record back to the host, 1.59 MB a worker.
#[test]
fn a_bf16_async_run_reads_back_what_an_f32_run_does() {
    if tandem_testkit::or_skip(CudaBackend::new(0), KernelError::is_no_device).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let read_back = |precision: DType| {
        let run = RUNS
            .iter()
            .position(|&(mode, gpus, optimizer, dtype, exchange, scale)| {
                (mode, gpus, optimizer, dtype, exchange, scale.batch)
                    == (
                        Mode::Async,
                        &[0, 0],
                        "sgd",
                        precision,
                        Exchange::F32,
                        SMALL.batch,
                    )
            })
            .expect("a run of the census");
        let stats = first_run(run, (SMALL.short, false), dir.path())?;
        stats["bytes_dtoh"].as_u64()
    };
    let (Some(wide), Some(narrow)) = (read_back(DType::F32), read_back(DType::BF16)) else {
        tandem_testkit::skipped(&"not the driver stand-in (no TANDEM_EMU_STATS file)");
        return;
    };
    assert_eq!(
        narrow, wide,
        "bytes from the device over a run, bf16 against f32"
    );
}

#[test]
fn a_gpu_step_moves_only_its_batch_and_waits_only_for_f16_flags() {
    if tandem_testkit::or_skip(CudaBackend::new(0), KernelError::is_no_device).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (index, (mode, gpus, optimizer_name, dtype, exchange, scale)) in RUNS.iter().enumerate() {
        let name = format!(
            "{} {optimizer_name} {dtype} on GPUs {gpus:?}, exchanging {exchange}, batch {}",
            mode.name(),
            scale.batch
        );
        // From here on, the pool's replicas: with the trainer's pool, a sync run's workers of
        // one GPU are one replica (`shards` workers' batches), its step one replica's.
        let (replicas, shards) = pool_of(index);
        let gpus: Vec<usize> = (replicas.iter())
            .map(|device| match device {
                Device::Cuda { ordinal } => *ordinal,
                _ => unreachable!("only GPUs here"),
            })
            .collect();
        let Some((short, long)) = runs(index, dir.path()) else {
            tandem_testkit::skipped(&"not the driver stand-in (no TANDEM_EMU_STATS file)");
            return;
        };
        let per_step = |key: &str| {
            let (a, b) = (short[key].as_u64().unwrap(), long[key].as_u64().unwrap());
            (b - a) as f64 / (scale.long - scale.short) as f64
        };
        let bus = per_step("bytes_htod") + per_step("bytes_dtoh");
        // A sync step is every replica's batch; an async step one replica's. Each of issue
        // 30's figures a replica-step below is for the pool's replicas, which compute `shards`
        // workers' batches each: a worker's share is that much less.
        let replicas_per_step = match mode {
            Mode::Sync => gpus.len() as f64,
            Mode::Async => 1.0,
        };
        eprintln!(
            "{name}: replicas {}, workers a replica {shards}; per step {bus} bytes over the \
             host bus ({} in, {} out), {} kernel launches, {} graph launches of {} kernels, {} copies and {} memsets, {} bytes \
             device to device, {} between devices, {} set, {} host calls on streams",
            gpus.len(),
            per_step("bytes_htod"),
            per_step("bytes_dtoh"),
            per_step("kernel_launches"),
            per_step("graph_launches"),
            per_step("graph_kernels"),
            per_step("graph_copies"),
            per_step("graph_memsets"),
            per_step("bytes_dtod"),
            per_step("bytes_peer"),
            per_step("bytes_memset"),
            per_step("stream_calls"),
        );
        // What each kernel did in the extra steps: the products use the hardware (issue 30:
        // at most half a shared-memory load a multiply-add; `matmul` makes half,
        // `mma_matmul` 6 a lane for each 16 x 8 x 16 `mma.sync`, 0.09).
        let kernel = |name: &str, key: &str| {
            let count = |run: &serde_json::Value| run["kernels"][name][key].as_u64().unwrap_or(0);
            (count(&long) - count(&short)) as f64 / (scale.long - scale.short) as f64
        };
        let names: Vec<String> = long["kernels"]
            .as_object()
            .expect("the stand-in counts each kernel")
            .keys()
            .cloned()
            .collect();
        for name in &names {
            let (launches, fmas) = (kernel(name, "launches"), kernel(name, "fmas"));
            eprintln!(
                "  {name}: {launches} launches a step, {} instructions, {} global bytes read, \
                 {} written, {} shared loads for {fmas} multiply-adds",
                kernel(name, "instructions"),
                kernel(name, "global_bytes_read"),
                kernel(name, "global_bytes_written"),
                kernel(name, "shared_loads"),
            );
            if name.contains("matmul") {
                assert!(fmas > 0.0, "{name}: the products multiply");
                // gather_matmul also reads each pixel it stages from its table of quotients:
                // at most one a staged value, which a block multiplies into a 32 x 32 tile.
                // matmul_softmax_cross_entropy's last block also takes the mean loss and the
                // label check's two figures by block reductions (`kernels/reduce.cuh`): at most
                // 3 loads a thread of its 256 for each of the 3, once a launch.
                let besides = match name.as_str() {
                    "gather_matmul" => fmas / 32.0,
                    "matmul_softmax_cross_entropy" => launches * 3.0 * 3.0 * 256.0,
                    _ => 0.0,
                };
                assert!(
                    kernel(name, "shared_loads") <= 0.5 * fmas + besides,
                    "{name}: at most half a shared load a multiply-add"
                );
            }
        }
        let product = if *dtype == DType::F32 {
            "matmul"
        } else {
            "mma_matmul"
        };
        assert!(names.iter().any(|n| n == product), "{name}: {product} ran");
        // In: the batch's indices, the slot of its loss (4 bytes) and the update kernel's
        // values (SGD: the learning rate, L2 and moving-average decay; Adam six), for
        // regularised spans and the others (sync, each replica applies every update; async,
        // each its own).
        let hyper = optimizer(optimizer_name)
            .device_update(0, 0.0, true, 1.0)
            .expect("a device update")
            .hyper
            .len();
        assert_eq!(
            per_step("bytes_htod"),
            (scale.batch * shards * 4 + 4 + 2 * 4 * hyper) as f64 * replicas_per_step,
            "{name}: only the batch's indices and the update's rates go in"
        );
        // Out, at the next boundary (here the run's end), which reads them all: each step's
        // loss (4 bytes a replica-step).
        // An f16 replica's overflow check: after each pass, one flag a block of `unscale`
        // (`kernels/narrow.cu`), read as the pass ends, the one wait of its step.
        let checks = if *dtype == DType::F16 { 1.0 } else { 0.0 };
        assert_eq!(
            per_step("bytes_dtoh"),
            (4.0 + checks * 4.0 * UNSCALE_FLAGS) * replicas_per_step,
            "{name}: only the losses (and f16's overflow flags) come out"
        );
        assert!(bus <= 1024.0, "{name}: {bus} bytes a step");
        // Between GPUs, each replica's update first copies the other's gradients to its own
        // device, in the exchange's type: a bf16 exchange moves half of f32's bytes.
        let value_bytes = match exchange {
            Exchange::F32 => 4,
            Exchange::Bf16 => 2,
        };
        let peer = match gpus.iter().all(|&gpu| gpu == gpus[0]) {
            true => 0,
            false => 2 * Mlp::mnist().num_params() * value_bytes,
        };
        assert_eq!(
            per_step("bytes_peer"),
            peer as f64,
            "{name}: bytes between GPUs"
        );
        // Each replica's step is one graph launch, with the store's update in it.
        assert_eq!(
            per_step("graph_launches"),
            replicas_per_step,
            "{name}: a graph launch per replica-step"
        );
        // The graph's nodes (issue 30 asks for 5 kernels and nothing else). Fused so far: each
        // layer's bias (and ReLU) and the hidden gradient's ReLU mask in their products'
        // epilogues, each layer's bias gradient in its weight gradient's product, softmax with
        // its mean and label check, the sync update in one kernel, the gather in the first
        // product, and (f32) the sum of a product's splits over k in the product (its tiles'
        // last blocks add them), the second layer's product with softmax and the loss
        // (`matmul_softmax_cross_entropy`) and its two backward products in one launch
        // (`matmul_pair`): f32 runs the first product, the second with the loss, two launches
        // of backward products and the update, the 5 the issue asks for. 16-bit steps launch
        // their four products apart (the first with the gather), softmax with the loss apart,
        // and the update: 7 kernels; f16 adds `unscale`, a bf16 exchange `compress_bf16`.
        // Their kernels round what they store, with no `round_to` after them.
        let compress = if *exchange == Exchange::Bf16 {
            1.0
        } else {
            0.0
        };
        let most = compress
            + match *dtype {
                DType::F32 => 5.0,
                _ => 7.0 + checks,
            };
        // A replica's f32 batch of more than 4 tiles of 32 examples (the batched sync
        // `cuda:0x2`'s 200) is a walk over k that its weight gradients split (`KSplits` in
        // `tandem-kernels`), and a split product is launched alone: its second layer's backward
        // products are two launches, not a pair. Issue 30 counts the user's replicas' steps:
        // `shards` of them in a step of the pool's replica.
        let unpaired = match *dtype == DType::F32 && scale.batch * shards > 4 * 32 {
            true => 1.0,
            false => 0.0,
        };
        let kernels = per_step("graph_kernels") / replicas_per_step;
        assert!(
            kernels <= most + unpaired,
            "{name}: {kernels} kernel nodes a step of a replica of the pool"
        );
        assert!(
            kernels / shards as f64 <= most,
            "{name}: {kernels} kernel nodes for {shards} workers' batches"
        );
        assert_eq!(per_step("graph_memsets"), 0.0, "{name}: memset nodes");
        // Copy nodes: sync beside other replicas, each replica's f32 gradients into its outbox
        // (a bf16 exchange rounds them there in a kernel) and, from other devices, the others'
        // outboxes to its own; a lone replica's update reads its gradients where they are.
        let copies = match mode {
            Mode::Sync if gpus.len() > 1 => {
                let outbox = if *exchange == Exchange::F32 { 1.0 } else { 0.0 };
                let distinct = gpus.iter().any(|&gpu| gpu != gpus[0]);
                outbox
                    + if distinct {
                        gpus.len() as f64 - 1.0
                    } else {
                        0.0
                    }
            }
            _ => 0.0,
        };
        assert_eq!(
            per_step("graph_copies") / replicas_per_step,
            copies,
            "{name}: copy nodes a replica-step"
        );
        assert_eq!(
            per_step("kernel_launches"),
            0.0,
            "{name}: kernels launched beside the graphs"
        );
        assert_eq!(
            per_step("stream_synchronizations"),
            checks * replicas_per_step,
            "{name}: waits inside steps"
        );
        for key in ["context_synchronizations", "event_synchronizations"] {
            assert_eq!(per_step(key), 0.0, "{name}: {key} inside steps");
        }
        // The host's calls on the streams (issue 30 asks for at most 2 a replica-step): the
        // step's inputs in one copy and the graph launch; sync beside other replicas, also a
        // wait for each other replica's last step and the record of its own (async replicas
        // on one GPU share its order: no events); f16, the read of its overflow flags.
        let others = gpus.len() as f64 - 1.0;
        let beside = match *mode == Mode::Sync && others > 0.0 {
            true => others + 1.0,
            false => 0.0,
        };
        assert_eq!(
            per_step("stream_calls") / replicas_per_step,
            2.0 + beside + checks,
            "{name}: host calls on streams a replica-step"
        );
    }
}
