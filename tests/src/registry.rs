//! The op registry, in the spirit of PyTorch's OpInfo: one [`OpInfo`] per `tl_ir::Op` variant,
//! saying which checks apply, how to generate valid cases, and the tolerances.
//!
//! **Coverage is enforced by the compiler.** The `registry!` invocation below is the single
//! list of entries; the macro expands it both into [`entry_of`] — an exhaustive `match` over
//! `Op` with no wildcard arm, so adding a variant to `Op` does not compile until it has an entry
//! here — and into [`all`], the list every check and `tl-verify` iterate over. The same
//! invocation produces both, so an entry cannot be matched but not run, or run but not matched.
//! The `registry` test then checks that every entry's generated ops map back to that entry.

use std::sync::Arc;

use proptest::prelude::*;
use tl_ir::Op;

use crate::checks::conventions::{at_exact, clamp_at_bounds, ties};
use crate::domain::Domain::{Any, AwayFromZero, Positive};
use crate::entries::*;
use crate::generate::Size;
use crate::{ANY, Check, OpCase};

/// Which of the four checks apply to an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applies {
    /// 1: tape forward == IR eval.
    pub forward: bool,
    /// 2: tape backward == IR backprop.
    pub backward: bool,
    /// 3: spec VJP == finite differences (only where the op is smooth on its generated domain
    /// and gradients flow by definition).
    pub finite_diff: bool,
    /// 4: JVP/VJP adjoint identity.
    pub adjoint: bool,
}

impl Applies {
    /// Every check applies.
    pub const ALL: Applies = Applies {
        forward: true,
        backward: true,
        finite_diff: true,
        adjoint: true,
    };
    /// Every check but finite differences.
    pub const NO_FD: Applies = Applies {
        finite_diff: false,
        ..Applies::ALL
    };

    /// Whether `check` applies.
    pub fn get(self, check: Check) -> bool {
        match check {
            Check::Forward => self.forward,
            Check::Backward => self.backward,
            Check::FiniteDiff => self.finite_diff,
            Check::Adjoint => self.adjoint,
            // Checks 5 and 6 compare two sessions or tapes: wherever the tape forward is checked.
            Check::Session | Check::CudaVsCpu | Check::Deterministic => self.forward,
        }
    }
}

/// Tolerances of one entry, as bounds on the errors of [`crate::metric`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tol {
    /// f64 backend vs f64 IR (checks 1, 2).
    pub f64: f64,
    /// f32 backend vs f64 IR on the same (f32-rounded) inputs (checks 1, 2), before scaling by
    /// reduction length (see [`Tol::f32_for`]).
    pub f32: f64,
    /// Spec VJP vs central differences with step [`crate::checks::FD_STEP`] (check 3).
    pub fd: f64,
    /// Adjoint identity (check 4).
    pub adjoint: f64,
}

impl Tol {
    /// The defaults: 1e-10 (f64), 1e-4 (f32), 1e-6 (finite differences), 1e-10 (adjoint).
    pub const DEFAULT: Tol = Tol {
        f64: 1e-10,
        f32: 1e-4,
        fd: 1e-6,
        adjoint: 1e-10,
    };

    /// The f32 tolerance for a computation whose longest reduction sums `len` terms: the
    /// worst-case rounding of a sequential sum grows linearly with its length, so the base
    /// tolerance is multiplied by `max(1, len / 64)`.
    pub fn f32_for(&self, len: usize) -> f64 {
        self.f32 * (len as f64 / 64.0).max(1.0)
    }
}

/// Generates an entry's cases of a given size (parameters, operand shapes and values).
pub type Generate = Arc<dyn Fn(Size) -> BoxedStrategy<OpCase> + Send + Sync>;

/// One registry entry.
#[derive(Clone)]
pub struct OpInfo {
    /// The op's name (as `Op::name` spells it).
    pub name: &'static str,
    /// Which checks apply.
    pub applies: Applies,
    /// Why a check does not apply (empty when all do).
    pub note: &'static str,
    /// Tolerances.
    pub tol: Tol,
    /// Generates valid cases (parameters, operand shapes and values) of a given size.
    pub generate: Generate,
    /// Operands that are indices (e.g. `gather`'s index tensor): never differentiated, so
    /// finite differences do not perturb them and require the VJP to give them no gradient.
    pub index_operands: Vec<usize>,
    /// Cases placed on the op's kinks, ties and bounds (exact zeros of either sign, `a = b`,
    /// `x = lo`/`hi`), for ops with such conventions: the sim checks draw a quarter of their
    /// cases from them ([`crate::checks::sim::sim_graph_cases`]), and the conventions checks
    /// ([`crate::checks::conventions`]) all of theirs.
    pub kinks: Option<Generate>,
    /// For pointwise and shape ops: the largest ulp distance ([`crate::metric::ulp_distance`])
    /// allowed between the sim and the CPU f32 tape, values and gradients (check 6 ≈cpu).
    /// `None`: the op reduces, and check 6 uses the f32 tolerance scaled by reduction length.
    pub ulps: Option<u64>,
}

impl std::fmt::Debug for OpInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpInfo")
            .field("name", &self.name)
            .field("applies", &self.applies)
            .field("note", &self.note)
            .field("tol", &self.tol)
            .finish()
    }
}

fn entry(name: &'static str, generate: fn(Size) -> BoxedStrategy<OpCase>) -> OpInfo {
    OpInfo {
        name,
        applies: Applies::ALL,
        note: "",
        tol: Tol::DEFAULT,
        generate: Arc::new(generate),
        index_operands: Vec::new(),
        kinks: None,
        ulps: None,
    }
}

impl OpInfo {
    /// Small cases (what finite differences and shrunk failure reports use).
    pub fn cases(&self) -> BoxedStrategy<OpCase> {
        (self.generate)(Size::Small)
    }

    /// Three small cases for every large one (checks 1, 2 and 4).
    pub fn mixed_cases(&self) -> BoxedStrategy<OpCase> {
        prop_oneof![3 => (self.generate)(Size::Small), 1 => (self.generate)(Size::Large)].boxed()
    }

    fn indices(mut self, operands: &[usize]) -> Self {
        self.index_operands = operands.to_vec();
        self
    }

    /// Draw the sim checks' kink share from `kinks`.
    fn kinks(mut self, kinks: fn(Size) -> BoxedStrategy<OpCase>) -> Self {
        self.kinks = Some(Arc::new(kinks));
        self
    }

    /// Compare the sim with the CPU f32 tape within `bound` ulps.
    fn ulps(mut self, bound: u64) -> Self {
        self.ulps = Some(bound);
        self
    }

    fn no_fd(mut self, why: &'static str) -> Self {
        self.applies = Applies::NO_FD;
        self.note = why;
        self
    }
}

/// Declares the registry: `Op pattern => entry` pairs, expanded into [`entry_of`] (an
/// exhaustive match) and [`all`] (every entry, in declaration order).
macro_rules! registry {
    ($($pat:pat => $entry:expr),+ $(,)?) => {
        /// The registry entry for `op`'s variant; `None` for a user op ([`Op::User`]), whose
        /// entry is the user's own ([`crate::user::UserEntry`]). The `match` is exhaustive
        /// and has no wildcard arm: a new `Op` variant fails to compile until the registry has
        /// an entry for it.
        pub fn entry_of(op: &Op) -> Option<OpInfo> {
            match op {
                $($pat => Some($entry),)+
                Op::User(_) => None,
            }
        }

        /// Every registry entry, one per `Op` variant, in `Op`'s declaration order.
        pub fn all() -> Vec<OpInfo> {
            vec![$($entry),+]
        }
    };
}

const POS: crate::Domain = Positive(0.2, 3.0);

/// The ulp bound of check 6 (sim vs CPU f32 tape) for pointwise and shape ops: both compute
/// in f32 with the host's libm, so they agree bit for bit or nearly. Measured over 2,000 cases
/// per op (docs/verification.md, "Sim vs CPU in ulps"): 4 ulps at most (safeLog), 3 for div,
/// inv and sigmoid, 2 for softplus, 0 for every other op; the bound is twice the worst.
/// (sigmoid, softplus and safeLog have since moved to [`SAME_BITS`].)
pub const SIM_ULPS: u64 = 8;

/// The ulp bound of check 6 for the ops whose f32 transcendentals are all
/// `tl_spec::approx`'s functions on both sides (`tanh`, `sigmoid`, `gelu`, `silu`,
/// `softplus`, `safeLog`, `geluErf`): the CPU tape and the sim call the very same functions with the same
/// operations around them, so they must agree bit for bit.
pub const SAME_BITS: u64 = 0;
const NO_OPERANDS: &str = "a seeded draw has no operands";
const DETACH_NOTE: &str = "detach has no gradient by definition, while its value is the identity";

registry! {
    Op::Add => entry("add", |z| binary(z, Op::Add, ANY, ANY)).ulps(SIM_ULPS),
    Op::Sub => entry("sub", |z| binary(z, Op::Sub, ANY, ANY)).ulps(SIM_ULPS),
    Op::Mul => entry("mul", |z| binary(z, Op::Mul, ANY, ANY)).ulps(SIM_ULPS),
    Op::Div => entry("div", |z| binary(z, Op::Div, ANY, AwayFromZero(0.5, 2.0))).ulps(SIM_ULPS),
    Op::Scale(_) => entry("scale", |z| unary_param(z, -3.0f64..=3.0, Op::Scale, ANY)).ulps(SIM_ULPS),
    Op::Abs => entry("abs", |z| unary(z, Op::Abs, AwayFromZero(0.1, 2.0))).ulps(SIM_ULPS).kinks(|z| at_exact(z, Op::Abs, 0.0)),
    Op::Sqrt => entry("sqrt", |z| unary(z, Op::Sqrt, POS)).ulps(SIM_ULPS).kinks(|z| at_exact(z, Op::Sqrt, 0.0)),
    Op::Exp => entry("exp", |z| unary(z, Op::Exp, ANY)).ulps(SIM_ULPS),
    Op::Log => entry("log", |z| unary(z, Op::Log, POS)).ulps(SIM_ULPS),
    Op::Inv => entry("inv", |z| unary(z, Op::Inv, AwayFromZero(0.3, 2.0))).ulps(SIM_ULPS),
    Op::Relu => entry("relu", |z| unary(z, Op::Relu, AwayFromZero(0.1, 2.0))).ulps(SIM_ULPS).kinks(|z| at_exact(z, Op::Relu, 0.0)),
    Op::Clamp { .. } => entry("clamp", clamp).ulps(SIM_ULPS).kinks(clamp_at_bounds),
    Op::Max => entry("max", |z| tie_free(z, Op::Max)).ulps(SIM_ULPS).kinks(|z| ties(z, Op::Max)),
    Op::Min => entry("min", |z| tie_free(z, Op::Min)).ulps(SIM_ULPS).kinks(|z| ties(z, Op::Min)),
    Op::Sigmoid => entry("sigmoid", |z| unary(z, Op::Sigmoid, Any(4.0))).ulps(SAME_BITS),
    Op::Tanh => entry("tanh", |z| unary(z, Op::Tanh, Any(3.0))).ulps(SAME_BITS),
    Op::Softplus => entry("softplus", |z| unary(z, Op::Softplus, Any(4.0))).ulps(SAME_BITS),
    Op::SafeLog { .. } => entry("safeLog", |z| {
        let eps = prop_oneof![Just(1e-6), 1e-4f64..=0.5];
        unary_param(z, eps, |eps| Op::SafeLog { eps }, Any(4.0))
    })
    .ulps(SAME_BITS),
    Op::Detach => entry("detach", |z| unary(z, Op::Detach, ANY)).no_fd(DETACH_NOTE).ulps(SIM_ULPS),
    Op::Constant(_) => entry("constant", constant).no_fd("constant has no operands").ulps(SIM_ULPS),
    Op::Reshape(_) => entry("reshape", reshape).ulps(SIM_ULPS),
    Op::Flatten => entry("flatten", |z| unary(z, Op::Flatten, ANY)).ulps(SIM_ULPS),
    Op::Transpose2d => entry("transpose2d", |z| of_rank(z, Op::Transpose2d, 2, 80)).ulps(SIM_ULPS),
    Op::PermuteBca => entry("permuteBCA", |z| of_rank(z, Op::PermuteBca, 3, 20)).ulps(SIM_ULPS),
    Op::PermuteCab => entry("permuteCAB", |z| of_rank(z, Op::PermuteCab, 3, 20)).ulps(SIM_ULPS),
    Op::SwapLastTwo => entry("swapLastTwo", |z| of_rank(z, Op::SwapLastTwo, 3, 40)).ulps(SIM_ULPS),
    Op::SwapAdjacent(_) => entry("swapAdjacent", swap_adjacent).ulps(SIM_ULPS),
    Op::BroadcastTo(_) => entry("broadcastTo", broadcast_to),
    Op::Sum => entry("sum", |z| unary(z, Op::Sum, ANY)),
    Op::ReduceSum(_) => entry("reduceSum", |z| reduce_axis(z, Op::ReduceSum)),
    Op::ReduceMean(_) => entry("reduceMean", |z| reduce_axis(z, Op::ReduceMean)),
    Op::Matmul => entry("matmul", matmul),
    Op::Bmm => entry("bmm", bmm),
    Op::Linear => entry("linear", linear),
    Op::Softmax => entry("softmax", |z| unary(z, Op::Softmax, Any(3.0))),
    Op::LogSoftmax => entry("logSoftmax", |z| unary(z, Op::LogSoftmax, Any(3.0))),
    Op::MseLoss => entry("mseLoss", mse_loss),
    Op::Gelu => entry("gelu", |z| unary(z, Op::Gelu, Any(4.0))).ulps(SAME_BITS),
    Op::Silu => entry("silu", |z| unary(z, Op::Silu, Any(4.0))).ulps(SAME_BITS),
    Op::GeluErf => entry("geluErf", |z| unary(z, Op::GeluErf, Any(4.0))).ulps(SAME_BITS),
    // leakyRelu and elu: SIM_ULPS, not SAME_BITS (which also holds the GPU to the sim's bits):
    // elu's kernels call CUDA's expm1f/expf, within a few ulps of libm's.
    Op::LeakyRelu { .. } => entry("leakyRelu", |z| {
        let slope = prop_oneof![Just(0.01), -2.0f64..=2.0];
        unary_param(z, slope, |negative_slope| Op::LeakyRelu { negative_slope }, AwayFromZero(0.1, 2.0))
    })
    .ulps(SIM_ULPS)
    .kinks(|z| at_exact(z, Op::LeakyRelu { negative_slope: 0.2 }, 0.0)),
    Op::Elu { .. } => entry("elu", |z| {
        let alpha = prop_oneof![Just(1.0), -2.0f64..=3.0];
        unary_param(z, alpha, |alpha| Op::Elu { alpha }, AwayFromZero(0.1, 3.0))
    })
    .ulps(SIM_ULPS)
    .kinks(|z| at_exact(z, Op::Elu { alpha: 0.5 }, 0.0)),
    Op::Concat => entry("concat0", concat).ulps(SIM_ULPS),
    Op::Slice { .. } => entry("sliceRange0", slice).ulps(SIM_ULPS),
    Op::CrossEntropy { .. } => entry("crossEntropy", cross_entropy),
    Op::GatherScalar { .. } => entry("gatherScalar", |z| {
        gather_static(z, 1, true, |index| Op::GatherScalar { index })
    }),
    Op::GatherRow { .. } => entry("gatherRow", |z| {
        gather_static(z, 2, true, |index| Op::GatherRow { index })
    }),
    Op::GatherScalarRaw { .. } => entry("gatherScalarRaw", |z| {
        gather_static(z, 1, false, |index| Op::GatherScalarRaw { index })
    }),
    Op::GatherRowRaw { .. } => entry("gatherRowRaw", |z| {
        gather_static(z, 2, false, |index| Op::GatherRowRaw { index })
    }),
    Op::GatherScalarNat { .. } => entry("gatherScalarNat", |z| {
        gather_nat(z, 1, true, |at, _| Op::GatherScalarNat { at })
    }),
    Op::GatherRowNat { .. } => entry("gatherRowNat", |z| {
        gather_nat(z, 2, true, |at, _| Op::GatherRowNat { at })
    }),
    Op::GatherScalarsNatVec { .. } => entry("gatherScalarsNatVec", |z| {
        gather_nat(z, 1, false, |at, k| Op::GatherScalarsNatVec { at, k })
    }),
    Op::GatherRowsNatVec { .. } => entry("gatherRowsNatVec", |z| {
        gather_nat(z, 2, false, |at, k| Op::GatherRowsNatVec { at, k })
    }),
    Op::GatherIndexTensor => entry("gather", gather_index_tensor).indices(&[1]),
    Op::ScatterAddVec { .. } => entry("scatterAddVec", |z| scatter_add(z, false)),
    Op::ScatterAddRow { .. } => entry("scatterAddRow", |z| scatter_add(z, true)),
    Op::LayerNorm { .. } => entry("layerNorm", layer_norm),
    Op::RmsNorm { .. } => entry("rmsNorm", rms_norm),
    Op::BatchNorm { .. } => entry("batchnormChannelFirst", batch_norm),
    Op::BatchMoments => entry("batchMoments", batch_moments),
    Op::MaskedSoftmax { .. } => entry("maskedSoftmax", masked_softmax),
    Op::MultiHeadAttention { .. } => entry("multiHeadAttention", multi_head_attention),
    Op::ScaledDotProductAttention { .. } => entry("scaledDotProductAttention", scaled_dot_product_attention),
    Op::Conv { .. } => entry("conv", conv),
    Op::ConvTranspose { .. } => entry("convTranspose", conv_transpose),
    Op::MaxPool { .. } => entry("maxPool", |z| pool(z, PoolKind::Max)),
    Op::AvgPool { .. } => entry("avgPool", |z| pool(z, PoolKind::Avg)),
    Op::SmoothMaxPool { .. } => entry("smoothMaxPool", |z| pool(z, PoolKind::Smooth)),
    Op::SpectralConv1dRfft { .. } => entry("spectralConv1dRfft", spectral_conv1d),
    Op::RandUniform { .. } => entry("randUniform", rand_uniform).no_fd(NO_OPERANDS),
    Op::BernoulliMask { .. } => entry("bernoulliMask", bernoulli_mask).no_fd(NO_OPERANDS),
    Op::Dropout { .. } => entry("dropout", dropout),
}

/// The entry named `name`, if any.
pub fn by_name(name: &str) -> Option<OpInfo> {
    all().into_iter().find(|e| e.name == name)
}
