//! The committed PTX of every `kernels/*.cu` file and the kernels each one defines.
//!
//! Always available (no `cuda` feature needed), so tools and tests can inspect it where no CUDA
//! is installed. `cargo xtask build-kernels` regenerates the files; `--check` fails when they are
//! stale.

/// `kernels/elementwise.cu`: `bias_add` (optionally + ReLU) and `relu_backward`.
pub const ELEMENTWISE: &str = include_str!("../ptx/elementwise.ptx");
/// `kernels/gather.cu`: `gather` of a batch from a device-resident u8 data set.
pub const GATHER: &str = include_str!("../ptx/gather.ptx");
/// `kernels/matmul.cu`: the tiled `matmul`, either operand transposed, optional bias + ReLU.
pub const MATMUL: &str = include_str!("../ptx/matmul.ptx");
/// `kernels/reduce.cu`: `column_sum`, `mean_loss` and `count_correct`, deterministic; the last two
/// also check the labels.
pub const REDUCE: &str = include_str!("../ptx/reduce.ptx");
/// `kernels/softmax_xent.cu`: the fused `softmax_cross_entropy`.
pub const SOFTMAX_XENT: &str = include_str!("../ptx/softmax_xent.ptx");
/// `kernels/update.cu`: `sgd_ema_update` and `mean_gradients`.
pub const UPDATE: &str = include_str!("../ptx/update.ptx");

/// The target every module is compiled for (`nvcc -arch=compute_75`): Turing and newer GPUs
/// JIT it to their own architecture.
pub const PTX_TARGET: &str = "sm_75";

/// The PTX ISA version nvcc 13.0 writes. Loading it needs a CUDA 13.0-generation driver.
pub const PTX_ISA_VERSION: &str = "9.0";

/// The oldest NVIDIA Linux driver branch that loads [`PTX_ISA_VERSION`]: older ones fail with
/// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`.
pub const MIN_DRIVER: u32 = 580;

/// The most gradient buffers one `sgd_ema_update` or `mean_gradients` launch averages
/// (`MAX_GRADS` in `kernels/update.cu`: they travel by value among the kernel's parameters).
pub const MAX_GRADIENT_BUFFERS: usize = 16;

/// One compiled `kernels/*.cu` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtxModule {
    /// The file's stem: `kernels/NAME.cu`, `ptx/NAME.ptx`.
    pub name: &'static str,
    /// The PTX text.
    pub ptx: &'static str,
}

/// Every module, one per `kernels/*.cu` file, in file-name order.
pub const MODULES: [PtxModule; 6] = [
    PtxModule {
        name: "elementwise",
        ptx: ELEMENTWISE,
    },
    PtxModule {
        name: "gather",
        ptx: GATHER,
    },
    PtxModule {
        name: "matmul",
        ptx: MATMUL,
    },
    PtxModule {
        name: "reduce",
        ptx: REDUCE,
    },
    PtxModule {
        name: "softmax_xent",
        ptx: SOFTMAX_XENT,
    },
    PtxModule {
        name: "update",
        ptx: UPDATE,
    },
];

/// A kernel entry point: the only way the launch code names one, so that the tests can check
/// every name against the PTX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `bias_add` in [`ELEMENTWISE`].
    BiasAdd,
    /// `relu_backward` in [`ELEMENTWISE`].
    ReluBackward,
    /// `gather` in [`GATHER`].
    Gather,
    /// `matmul` in [`MATMUL`].
    Matmul,
    /// `column_sum` in [`REDUCE`].
    ColumnSum,
    /// `mean_loss` in [`REDUCE`]: the mean of `softmax_cross_entropy`'s per-row losses, and the
    /// label check.
    MeanLoss,
    /// `count_correct` in [`REDUCE`].
    CountCorrect,
    /// `softmax_cross_entropy` in [`SOFTMAX_XENT`].
    SoftmaxCrossEntropy,
    /// `sgd_ema_update` in [`UPDATE`].
    SgdEmaUpdate,
    /// `mean_gradients` in [`UPDATE`].
    MeanGradients,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 10] = [
        Kernel::BiasAdd,
        Kernel::ReluBackward,
        Kernel::Gather,
        Kernel::Matmul,
        Kernel::ColumnSum,
        Kernel::MeanLoss,
        Kernel::CountCorrect,
        Kernel::SoftmaxCrossEntropy,
        Kernel::SgdEmaUpdate,
        Kernel::MeanGradients,
    ];

    /// Its position in [`ALL`](Self::ALL), for tables indexed by kernel.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The entry point's name in the PTX (`extern "C"`, so unmangled).
    pub const fn entry(self) -> &'static str {
        match self {
            Kernel::BiasAdd => "bias_add",
            Kernel::ReluBackward => "relu_backward",
            Kernel::Gather => "gather",
            Kernel::Matmul => "matmul",
            Kernel::ColumnSum => "column_sum",
            Kernel::MeanLoss => "mean_loss",
            Kernel::CountCorrect => "count_correct",
            Kernel::SoftmaxCrossEntropy => "softmax_cross_entropy",
            Kernel::SgdEmaUpdate => "sgd_ema_update",
            Kernel::MeanGradients => "mean_gradients",
        }
    }

    /// The index in [`MODULES`] of the module that defines it.
    pub const fn module_index(self) -> usize {
        match self {
            Kernel::BiasAdd | Kernel::ReluBackward => 0,
            Kernel::Gather => 1,
            Kernel::Matmul => 2,
            Kernel::ColumnSum | Kernel::MeanLoss | Kernel::CountCorrect => 3,
            Kernel::SoftmaxCrossEntropy => 4,
            Kernel::SgdEmaUpdate | Kernel::MeanGradients => 5,
        }
    }

    /// The module that defines it.
    pub const fn module(self) -> &'static PtxModule {
        &MODULES[self.module_index()]
    }
}
