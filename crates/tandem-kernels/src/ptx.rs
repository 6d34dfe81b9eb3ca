//! The committed PTX of every `kernels/*.cu` file and the kernels each one defines.
//!
//! Always available (no `cuda` feature needed), so tools and tests can inspect it where no CUDA
//! is installed. `cargo xtask build-kernels` regenerates the files; `--check` fails when they are
//! stale.

/// The target every module is compiled for (`nvcc -arch=compute_75`): Turing and newer GPUs
/// JIT it to their own architecture. [`NARROW`] alone targets [`NARROW_TARGET`].
pub const PTX_TARGET: &str = "sm_75";

/// The target of [`NARROW`] (`compute_80`): its products run on tensor cores with bf16 and f16
/// operands, which GPUs before Ampere (compute capability 8.0) do not have; the backend loads
/// it only on GPUs that do.
pub const NARROW_TARGET: &str = "sm_80";

/// The PTX ISA version nvcc 13.0 writes. Loading it needs a CUDA 13.0-generation driver.
pub const PTX_ISA_VERSION: &str = "9.0";

/// The oldest NVIDIA Linux driver branch that loads [`PTX_ISA_VERSION`]: older ones fail with
/// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`.
pub const MIN_DRIVER: u32 = 580;

/// The most gradient buffers one `sgd_ema_update` or `mean_gradients` launch averages
/// (`MAX_GRADS` in `kernels/update.cu`: they travel by value among the kernel's parameters).
pub const MAX_GRADIENT_BUFFERS: usize = 16;

/// The most consecutive spans (each with its own `[lr, wd, d]`) one `sgd_ema_update` launch
/// updates (`MAX_SPANS` in `kernels/update.cu`).
pub const MAX_UPDATE_SPANS: usize = 8;

/// The length of `sgd_ema_update`'s span table as the launch passes it: the spans' ends, then
/// their `[lr, wd, d]` addresses.
pub const SPAN_TABLE: usize = 2 * MAX_UPDATE_SPANS;

/// One compiled `kernels/*.cu` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtxModule {
    /// The file's stem: `kernels/NAME.cu`, `ptx/NAME.ptx`.
    pub name: &'static str,
    /// The PTX text.
    pub ptx: &'static str,
}

impl PtxModule {
    /// The compute capability its `.target sm_XY` line asks for, as `10 X + Y` (75 for
    /// `sm_75`); `None` when the PTX names no such target.
    pub fn capability(&self) -> Option<u32> {
        let line = self.ptx.lines().find_map(|l| l.strip_prefix(".target "))?;
        let digits = line.split([',', ' ']).next()?.strip_prefix("sm_")?;
        digits.trim_end_matches(char::is_alphabetic).parse().ok()
    }
}

/// The one table of modules and kernels: for each `kernels/NAME.cu` file (in file-name order),
/// its constant, its stem and the kernels it defines, each as `Variant => "entry"`. It generates
/// the module constants, [`MODULES`], [`Kernel`] and `Kernel`'s `ALL`, `entry` and
/// `module_index`.
macro_rules! kernel_table {
    ($(
        $(#[$module_doc:meta])*
        $module:ident = $stem:literal {
            $( $(#[$kernel_doc:meta])* $kernel:ident => $entry:literal, )+
        }
    )+) => {
        $(
            $(#[$module_doc])*
            pub const $module: &str = include_str!(concat!("../ptx/", $stem, ".ptx"));
        )+

        /// The modules' positions in [`MODULES`].
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        enum ModuleIndex {
            $( $module, )+
        }

        /// Every module, one per `kernels/*.cu` file, in file-name order.
        pub const MODULES: [PtxModule; [$($stem),+].len()] = [
            $( PtxModule { name: $stem, ptx: $module }, )+
        ];

        /// A kernel entry point: the only way the launch code names one, so that the tests can
        /// check every name against the PTX.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Kernel {
            $($(
                #[doc = concat!("`", $entry, "` in [`", stringify!($module), "`].")]
                $(#[$kernel_doc])*
                $kernel,
            )+)+
        }

        impl Kernel {
            /// Every kernel.
            pub const ALL: [Kernel; [$($(Kernel::$kernel),+),+].len()] = [
                $($( Kernel::$kernel, )+)+
            ];

            /// The entry point's name in the PTX (`extern "C"`, so unmangled).
            pub const fn entry(self) -> &'static str {
                match self {
                    $($( Kernel::$kernel => $entry, )+)+
                }
            }

            /// The index in [`MODULES`] of the module that defines it.
            pub const fn module_index(self) -> usize {
                match self {
                    $($( Kernel::$kernel => ModuleIndex::$module as usize, )+)+
                }
            }
        }
    };
}

kernel_table! {
    /// `kernels/elementwise.cu`: `bias_add` (optionally + ReLU) and `relu_backward`.
    ELEMENTWISE = "elementwise" {
        BiasAdd => "bias_add",
        ReluBackward => "relu_backward",
    }
    /// `kernels/gather.cu`: `gather` of a batch from a device-resident u8 data set.
    GATHER = "gather" {
        Gather => "gather",
    }
    /// `kernels/matmul.cu`: the tiled `matmul`, either operand transposed, optional bias + ReLU,
    /// optionally split over k (the last block of a tile adds the splits); `gather_matmul`
    /// gathers op(A).
    MATMUL = "matmul" {
        Matmul => "matmul",
        /// `matmul` with op(A) a batch it gathers (`gather`'s arithmetic), writing the batch.
        GatherMatmul => "gather_matmul",
        /// Two unsplit products in one launch (a layer's weight and input gradients).
        MatmulPair => "matmul_pair",
        /// A last layer's product with `softmax_cross_entropy` of its logits.
        MatmulSoftmaxCrossEntropy => "matmul_softmax_cross_entropy",
    }
    /// `kernels/narrow.cu` (compute_80): the 16-bit backend's tensor-core `mma_matmul` and
    /// `gather_mma_matmul`, `round_to`, which rounds a span to bf16 or f16, and `unscale`,
    /// which takes the loss scale off the gradients and flags those that are not finite.
    NARROW = "narrow" {
        MmaMatmul => "mma_matmul",
        /// `mma_matmul` with op(A) a batch it gathers (a 16-bit `gather`'s values), writing
        /// the batch.
        GatherMmaMatmul => "gather_mma_matmul",
        RoundTo => "round_to",
        Unscale => "unscale",
    }
    /// `kernels/reduce.cu`: `column_sum`, `sum_squares` and `count_correct`, deterministic;
    /// the last also checks the labels.
    REDUCE = "reduce" {
        ColumnSum => "column_sum",
        /// The sum of squares of `DeviceOp::SumSquares`, in f64.
        SumSquares => "sum_squares",
        CountCorrect => "count_correct",
    }
    /// `kernels/softmax_xent.cu`: the fused `softmax_cross_entropy`, with its mean loss and
    /// label check.
    SOFTMAX_XENT = "softmax_xent" {
        SoftmaxCrossEntropy => "softmax_cross_entropy",
    }
    /// `kernels/update.cu`: `sgd_ema_update`, `adam_update`, `mean_gradients` and
    /// `compress_bf16`.
    UPDATE = "update" {
        SgdEmaUpdate => "sgd_ema_update",
        /// Adam, bit for bit `tandem_optim::adam_update`.
        AdamUpdate => "adam_update",
        MeanGradients => "mean_gradients",
        /// Gradients divided by the worker count and rounded to bf16, for a 16-bit exchange.
        CompressBf16 => "compress_bf16",
    }
}

impl Kernel {
    /// Its position in [`ALL`](Self::ALL), for tables indexed by kernel.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The module that defines it.
    pub const fn module(self) -> &'static PtxModule {
        &MODULES[self.module_index()]
    }
}
