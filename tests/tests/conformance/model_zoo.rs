//! tl-nn's own models (`tl_nn::models`: what `tl train` trains and the benchmarks time) under
//! `check_model`, at small sizes: each one's gradients against finite differences, a pass and
//! two training steps on every session against the IR's f64 reference (and, with `cuda-emu`,
//! on the CUDA device's kernels on the emulator). A layer of these models that computed a
//! wrong value or gradient on one session, or stepped wrongly, fails its model here even where
//! its own layer check draws other shapes.
//!
//! At these sizes the tapes take their small-size paths. The same models run again with every
//! size-, shape- and thread-gated path of the CPU tape (`tl_tape_cpu::gates`) and of the CUDA
//! tape (`tl_tape_cuda::gates`) forced on, then off: the GEMM's thread split and layout copies,
//! the threaded element-wise and row splits, the memory-lean fused attention, conv's
//! weight-cotangent chunks; on the CUDA devices the implicit-GEMM convs, split-K products,
//! sums by block, the one-launch norms, the one-pass flash backward (the emulator) and the
//! fused optimizer step.

use tl_conformance::RunConfig;
use tl_conformance::model::{UserModel, check_model};
use tl_nn::models::{
    self, BlockConfig, CnnConfig, Fno1d, FnoConfig, LlamaBlock, LlamaConfig, LmConfig, ResNet,
    ResNetConfig, TransformerBlock, TransformerLm,
};
use tl_nn::{Activation, Module, Parameters, Rope, Scope, Sequential, Var, Vars};
use tl_session::{Param, Train};
use tl_spec::Shape;

/// Every model with its input shape; the language model's token ids are fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zoo {
    /// `models::mlp` 6 → 10 → 10 → 3, GELU, on (4, 6).
    Mlp,
    /// `models::cnn`: 2 channels of 6×6, stages of 3 and 4 channels, 3 classes, batch 2.
    Cnn,
    /// `Fno1d`: 2 → 1 channels on a grid of 8, width 4, 3 modes, 2 layers, exact GELU.
    Fno,
    /// A causal `TransformerBlock` of width 8, 2 heads, MLP 12, on (2, 5, 8).
    Block,
    /// `TransformerLm`: vocabulary 7, context 5, width 8, 2 heads, MLP 12, 2 blocks, batch 2.
    Lm,
    /// `ResNet`: 2 → 3 channels, one basic block, 3 classes, on (2, 2, 5, 5).
    ResNet,
    /// A `LlamaBlock` of width 8, 2 query heads over 1 key/value head, MLP 12, on (2, 5, 8).
    Llama,
}

const LM: LmConfig = LmConfig {
    vocab: 7,
    context: 5,
    d_model: 8,
    heads: 2,
    d_ff: 12,
    blocks: 2,
};

/// The language model's windows: 2 of `LM.context` ids.
const TOKENS: [usize; 10] = [3, 0, 6, 2, 2, 5, 1, 4, 0, 6];

/// One of the models, on any session.
enum Net<O: Train> {
    Seq(Sequential<O>),
    Fno(Fno1d),
    Block(TransformerBlock),
    Lm(TransformerLm),
    ResNet(ResNet),
    Llama(LlamaBlock),
}

impl<O: Train> Parameters for Net<O> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        match self {
            Net::Seq(m) => m.visit_params(f),
            Net::Fno(m) => m.visit_params(f),
            Net::Block(m) => m.visit_params(f),
            Net::Lm(m) => m.visit_params(f),
            Net::ResNet(m) => m.visit_params(f),
            Net::Llama(m) => m.visit_params(f),
        }
    }
}

impl UserModel for Zoo {
    type Model<O: Train> = Net<O>;

    fn name(&self) -> String {
        format!("{self:?}").to_lowercase()
    }

    fn build<O: Train>(&self, v: &Vars<'_, O>) -> tl_nn::Result<Net<O>> {
        Ok(match self {
            Zoo::Mlp => Net::Seq(models::mlp(v, &[6, 10, 10, 3], Activation::Gelu)?),
            Zoo::Cnn => Net::Seq(models::cnn(
                v,
                &CnnConfig {
                    in_channels: 2,
                    height: 6,
                    width: 6,
                    channels: vec![3, 4],
                    classes: 3,
                },
            )?),
            Zoo::Fno => Net::Fno(Fno1d::new(
                v,
                &FnoConfig {
                    in_channels: 2,
                    out_channels: 1,
                    width: 4,
                    modes: 3,
                    layers: 2,
                    proj_hidden: 6,
                    exact_gelu: true,
                },
            )?),
            Zoo::Block => Net::Block(TransformerBlock::new(
                v,
                &BlockConfig {
                    d_model: 8,
                    heads: 2,
                    d_ff: 12,
                    causal: true,
                },
            )?),
            Zoo::Lm => Net::Lm(TransformerLm::new(v, &LM)?),
            Zoo::ResNet => Net::ResNet(ResNet::new(
                v,
                &ResNetConfig {
                    in_channels: 2,
                    channels: 3,
                    blocks: 1,
                    classes: 3,
                },
            )?),
            Zoo::Llama => Net::Llama(LlamaBlock::new(
                v,
                &LlamaConfig {
                    d_model: 8,
                    heads: 2,
                    kv_heads: 1,
                    d_ff: 12,
                    rope: Rope::DEFAULT,
                    eps: 1e-5,
                },
            )?),
        })
    }

    fn inputs(&self) -> Vec<Shape> {
        let dims: &[usize] = match self {
            Zoo::Mlp => &[4, 6],
            Zoo::Cnn => &[2, 2, 6, 6],
            Zoo::Fno => &[2, 8, 2],
            Zoo::Block | Zoo::Llama => &[2, 5, 8],
            Zoo::Lm => return Vec::new(),
            Zoo::ResNet => &[2, 2, 5, 5],
        };
        vec![Shape::new(dims)]
    }

    fn forward<'g, O: Train>(
        &self,
        m: &Net<O>,
        g: &Scope<'g, O>,
        x: &[Var<'g, O>],
    ) -> tl_nn::Result<Var<'g, O>> {
        match m {
            Net::Seq(m) => m.forward(&x[0]),
            Net::Fno(m) => m.forward(&x[0]),
            Net::Block(m) => m.forward(&x[0]),
            Net::Lm(m) => m.logits(g, &TOKENS, TOKENS.len() / LM.context),
            Net::ResNet(m) => m.forward(&x[0]),
            Net::Llama(m) => m.forward(&x[0]),
        }
    }
}

/// Every model, in report order.
const ALL: [Zoo; 7] = [
    Zoo::Mlp,
    Zoo::Cnn,
    Zoo::Fno,
    Zoo::Block,
    Zoo::Lm,
    Zoo::ResNet,
    Zoo::Llama,
];

/// `f` with every gated path of the CPU and the CUDA tape forced on (`on`) or off, on this
/// thread (the CPU tape carries its overrides to its pool threads).
fn forced<R>(on: bool, f: impl FnOnce() -> R) -> R {
    use tl_tape_cpu::gates::{self as cpu, Gates};
    use tl_tape_cuda::gates as cuda;
    let (all, none) = if on { (0, usize::MAX) } else { (usize::MAX, 0) };
    let _cpu = cpu::force(match on {
        true => Gates::fast_paths_on(2),
        false => Gates::fast_paths_off(),
    });
    let _implicit = cuda::force_conv_implicit_min_tiles(Some(all));
    let _split_k = cuda::force_split_k_tiles(Some(none));
    let _sums = cuda::force_sums_by_block(Some(on));
    let _norm = cuda::force_norm_fused_max(Some(none));
    let _norm_split = cuda::force_norm_split_parts(Some(if on { 3 } else { 1 }));
    let _flash = cuda::force_flash_bwd_one_pass(Some(on));
    let _optimizer = cuda::force_fused_optimizer(Some(on));
    f()
}

/// Every model passes every row with every gated path forced on, then off.
#[test]
fn tl_nns_models_pass_check_model_with_every_gated_path_forced() {
    let cfg = RunConfig::from_env_or(2);
    let mut failed = Vec::new();
    for on in [true, false] {
        for model in ALL {
            let report = forced(on, || check_model(&model, &cfg));
            if !report.passed() {
                println!("{report}");
                failed.push(format!("gated paths forced on: {on}: {}", report.summary()));
            }
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}

/// Every model passes every row: finite differences, each session's pass and steps.
#[test]
fn tl_nns_models_pass_check_model_on_every_session() {
    let cfg = RunConfig::from_env_or(4);
    let mut failed = Vec::new();
    for model in ALL {
        let report = check_model(&model, &cfg);
        println!("{report}");
        // Each model has trainable parameters: its steps ran, on every session.
        assert!(
            report
                .reports
                .iter()
                .filter(|r| r.label.starts_with("model step "))
                .count()
                >= 6,
            "{report}"
        );
        if !report.passed() {
            failed.push(report.summary());
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}

/// A case on a kink f32 cannot hold: at `TL_SEED=606` with 64 cases the cnn's step row on the
/// eager CPU f32 session draws one whose two steps pass within f32's rounding of a ReLU's or a
/// max pool's kink. Every f32 session and the IR in f32 take the other branch there and give
/// one weight an update 0.02 off the f64 reference's (a fifth of it). The row passes on the
/// tolerance floor the reference's own f32 error sets (`tl_conformance::model`, "floors"), and
/// its measured error shows the floor was used. Not under `cuda-emu`: the emulated device's
/// rows would add minutes and check nothing this test is about.
#[cfg(not(feature = "cuda-emu"))]
#[test]
fn a_case_on_a_kink_f32_cannot_hold_passes_on_the_reference_floor() {
    let report = check_model(
        &Zoo::Cnn,
        &RunConfig {
            cases: 64,
            seed: 606,
        },
    );
    assert!(report.passed(), "{report}");
    let row = report
        .reports
        .iter()
        .find(|r| r.label == "model step cnn eager cpu-f32");
    assert!(row.is_some_and(|r| r.max_err > 1e-2), "{report}");
}
