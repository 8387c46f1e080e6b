//! The GPU half of issue 7: our training steps, a large matmul and elementwise bandwidth on one
//! backend, printed as JSON lines that `benches/gpu/torch_bench.py` joins with PyTorch's figures
//! for the same shapes on the same GPU. Not a criterion bench: the GPU machine runs the bundled
//! binary (`cargo xtask gpu-bundle`, then `run.sh` there), and the figures are medians of timed
//! iterations after warm-up, each ending in a host read of a scalar (which waits for the device).
//!
//! `cargo bench -p tl-session --features cuda --bench gpu -- --backend cuda` on a GPU machine;
//! `cargo bench -p tl-session --bench gpu -- --backend cuda-sim --quick` checks the code on the
//! simulation device (small sizes; the figures mean nothing there).
//!
//! `--only P1,P2,…` runs the rows whose names start with one of the prefixes (`--only
//! matmul/4096,attention-core`); `--once` runs each row's work once after its first call (no
//! warm-up, no median: the figures are single runs), which is what a kernel profiler wants
//! (the bundle's run.sh profiles `--once --only …` under `ncu` when the GPU machine has it).
//!
//! Rows (`name`, milliseconds, and for matmul/elementwise the rate):
//! - `step/{eager,linked}/{mlp,cnn,transformer,wide-mlp,resnet,lm}`: the tl-nn models of
//!   `common/models.rs`, `Runtime::step` with each model's optimizer;
//!   `step-bf16/{eager,linked}/{wide-mlp,resnet,lm}` the realistic ones in sessions with
//!   `Precision::Bf16` (torch_bench.py's twin: the AMP bf16 step);
//! - `matmul/{n}`: `sum(a·b)` with `a`, `b` of `n × n`, n = 2048 and 4096 (GFLOP/s counts the
//!   product only; the sum's n² reads are under 0.1% of the work at n = 4096); `matmul-tf32/{n}`
//!   and `matmul-bf16/{n}` the same in a session with `Precision::Tf32` / `Bf16` (on `Cuda`
//!   the tensor-core kernel `tl_gemm_tc`; f32 operands rounded as they are staged);
//! - `scale/{bytes}` and `add/{bytes}`: one elementwise op over a 256 MB (`--quick`: 4 MB) f32
//!   buffer, as (chain of 8 ops then `sum`) minus (`sum` alone), divided by 8; GB/s counts
//!   bytes read plus written;
//! - `attention/{flash,composed}/n{n}`: one causal `multiHeadAttention` (dModel 512, 8 heads
//!   of 64, batch 1; `--quick`: n 64) forward and backward (`Session::backward` from the sum
//!   of its output, then a gradient read), `fused` true (the flash kernels) or false (the
//!   composed launches), n = 1024 to 8192; torch_bench.py times the same projections around
//!   `F.scaled_dot_product_attention(is_causal=True)`;
//! - `attention-core/flash/n{n}`: the fused core alone on the device (`Device::flash_attention`
//!   and its backward on causal Q, K, V of (1, n, 8, 64), then a sum of dV read back), and on
//!   `Cuda` `attention-core/flash-one-pass/n{n}` and `…/flash-two-pass/n{n}` the same with the
//!   backward forced onto one path (`gates::force_flash_bwd_one_pass`: the one-pass kernel,
//!   dQ by `atomicAdd`, which `flash` runs when deterministic reductions are off, or the two
//!   fixed-order kernels), `attention-core/flash-wide/n{n}` the same with the wide tilings
//!   (`FlashTiles::Wide`: the forward's 64 keys a step in dynamic shared memory), and
//!   `attention-core/flash-d128/n{n}` (the default, `FlashTiles::Auto`: the backward on
//!   register tiles) and `…/flash-narrow-d128/n{n}` (`FlashTiles::Narrow`: tiles of 16)
//!   with heads of 128 at n = 1024 and 4096, `attention-core/flash-gqa/n{n}` with the 8 query heads over 2 key heads
//!   (grouped-query attention: K and V of (1, n, 2, 64), torch_bench.py's twin
//!   `attention-core/sdpa-gqa/n{n}` with `enable_gqa=True`), `attention-core/flash-bf16/n{n}`
//!   under bf16 autocast (`Flash::round`: `flash_attention_rounded`, the operands rounded into
//!   copies, two forward passes, p and dS rounded backward; torch_bench.py's twin
//!   `attention-core/sdpa-bf16/n{n}`, PyTorch's flash kernel on bf16 tensors), with
//!   TFLOP/s counted as FlashAttention's papers do (causal: 7·n²·d·H for forward and backward);
//!   torch_bench.py's `attention-core/sdpa/n{n}` is SDPA's forward and backward on the same
//!   f32 shapes (its memory-efficient kernel: PyTorch's flash kernel takes only 16-bit types),
//!   and `attention-core/sdpa-bf16/n{n}` the same in bf16 (its flash kernel), for scale;
//!   `attention-core/flash-tc/n{n}` with the forward on the tensor cores
//!   (`FlashProducts::Tf32x3`: three TF32 products for each f32 one, as PyTorch's f32
//!   memory-efficient kernel multiplies on sm80+), `attention-core/flash-tc-bf16/n{n}` the
//!   bf16 core on the tensor cores (one exact TF32 product a pair of rounded operands; twin
//!   `attention-core/sdpa-bf16/n{n}`), and on `Cuda` `attention-fwd/flash/n{n}`
//!   and `attention-fwd/flash-tc/n{n}` the forward alone (to a read of the sum of lse;
//!   2·n²·d·H products), beside torch_bench.py's `attention-fwd/sdpa/n{n}`;
//! - `gemm-core/{f32,tf32,bf16}/{n}`: the device's matmul alone, 16 products back to back
//!   then one read, n = 1024 and 2048, and `gemm-core/{tf32,bf16}/1024-split256` with the
//!   split-K threshold raised to 256 tiles (`gates::force_split_k_tiles`); torch_bench.py's
//!   twins: cuBLAS the same way;
//! - `conv/{implicit,im2col}/{shape}`: the ResNet's conv forward on the device, f32, no bias,
//!   3×3, padding 1, batch 32 on 32×32 images (`--quick`: batch 2 on 8×8), the stem (3 → 64
//!   channels) and a block's conv (64 → 64): `Device::conv_implicit` (the implicit-GEMM kernel)
//!   or the im2col path (`im2col`, the GEMM, the permute to (N, A, L)), timed to a read of the
//!   output's sum; GFLOP/s counts 2·N·A·L·C·K. torch_bench.py's `conv/cudnn/{shape}` is
//!   `F.conv2d` on the same operands (cuDNN, TF32 off, `cudnn.benchmark` on);
//! - `conv/{implicit,im2col}-bf16/{shape}`: the same forward under bf16 autocast (installed as
//!   a tape installs it): the tensor-core implicit kernel (`tl_conv_implicit_tc`, rounding as
//!   it stages) or `im2col` and the tensor-core GEMM; torch_bench.py's
//!   `conv/cudnn-bf16/{shape}` is `F.conv2d` on bf16 copies of the operands (cuDNN);
//! - `conv-dw/{implicit,im2col}/{shape}`: the same convs' weight cotangent from a cotangent of
//!   the output: `Device::conv_implicit_dw` (the implicit-GEMM kernel, split along N·L as the
//!   GEMM splits it) or the im2col path (the permute of the cotangent to (A, N·L), `im2col`,
//!   the GEMM `g'·colsᵀ`), timed to a read of the result's sum, GFLOP/s as above;
//!   torch_bench.py's `conv-dw/cudnn/{shape}` is `torch.nn.grad.conv2d_weight` (cuDNN's
//!   weight gradient) on the same operands;
//! - `conv-dx/{implicit,im2col}/{shape}`: the input cotangent: `Device::conv_implicit_dx` or
//!   the im2col path (the permute of the cotangent, the GEMM `wᵀ·g'`, `col2im`), GFLOP/s as
//!   above; torch_bench.py's `conv-dx/cudnn/{shape}` is `torch.nn.grad.conv2d_input`;
//! - `conv-{dw,dx}/{implicit,im2col}-bf16/{shape}`: both cotangents under bf16 autocast (the
//!   tensor-core kernels `tl_conv_implicit_dw_tc`, `tl_conv_implicit_dx_tc`, or the im2col
//!   path with the tensor-core GEMM); torch_bench.py's `conv-{dw,dx}/cudnn-bf16/{shape}` are
//!   cuDNN's on bf16 copies of the operands.

#[path = "common/models.rs"]
mod common;

use std::time::Instant;

use common::{BenchModel, EagerRun, LinkedRun, filled};
use tl_session::{Backend, LinkedSession, Ops, Options, Precision, Session, Train};
use tl_tape_cuda::device::{Flash, FlashDims, FlashMask, Windows};
use tl_tape_cuda::{Buffer, Device, Gemm, SimDevice};

struct Args {
    backend: Backend,
    quick: bool,
    iters: usize,
    /// Row-name prefixes to run (`--only`; empty: every row).
    only: Vec<String>,
    /// One timed run a row, no warm-up (`--once`).
    once: bool,
}

impl Args {
    /// Whether row `name` runs (`--only`).
    fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| name.starts_with(p.as_str()))
    }
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        backend: Backend::Cuda,
        quick: false,
        iters: 20,
        only: Vec::new(),
        once: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--backend" => {
                a.backend = match it.next().as_deref() {
                    Some("cuda") => Backend::Cuda,
                    Some("cuda-sim") => Backend::CudaSim,
                    Some("cpu") => Backend::Cpu,
                    other => return Err(format!("--backend cuda|cuda-sim|cpu, got {other:?}")),
                }
            }
            "--quick" => a.quick = true,
            "--once" => a.once = true,
            "--only" => {
                // (cargo appends `--bench`: a flag is not a value.)
                a.only = it
                    .next()
                    .filter(|v| !v.starts_with("--"))
                    .unwrap_or_default()
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(str::to_owned)
                    .collect();
                if a.only.is_empty() {
                    return Err(
                        "--only needs row-name prefixes, e.g. matmul/4096,attention-core".into(),
                    );
                }
            }
            "--iters" => {
                a.iters = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--iters needs a positive number")?
            }
            // cargo passes `--bench` to bench targets.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.quick {
        a.iters = a.iters.min(3);
    }
    Ok(a)
}

/// Median wall time of `f` in milliseconds over `a.iters` runs after two warm-up runs; with
/// `--once`, the time of one run.
fn median_ms(a: &Args, mut f: impl FnMut()) -> f64 {
    let iters = if a.once { 1 } else { a.iters };
    if !a.once {
        f();
        f();
    }
    let mut t: Vec<f64> = (0..iters)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// [`median_ms`] of the device work `f`, each run ending in a read: `f` launches and returns
/// its buffers, the last one's sum is read back (which waits for every launch), and all are
/// released. One run first, whose error (a refused launch) is returned.
fn device_ms<D: Device>(
    a: &Args,
    dev: &mut D,
    f: impl Fn(&mut D) -> tl_tape_cuda::Result<Vec<Buffer>>,
) -> tl_tape_cuda::Result<f64> {
    let run = |dev: &mut D| -> tl_tape_cuda::Result<f32> {
        let bufs = f(dev)?;
        let total = dev.reduce_sum(bufs[bufs.len() - 1])?;
        let got = dev.download(total)?;
        dev.release_all(bufs.into_iter().chain([total]));
        Ok(got[0])
    };
    run(dev)?;
    Ok(median_ms(a, || {
        run(dev).unwrap();
    }))
}

fn row(backend: Backend, name: &str, ms: f64, rate: Option<(&str, f64)>) {
    let rate = rate.map_or(String::new(), |(unit, v)| format!(", \"{unit}\": {v:.3}"));
    println!(
        "{{\"backend\": \"{}\", \"name\": \"{name}\", \"ms\": {ms:.4}{rate}}}",
        backend.name()
    );
}

/// Issue 39's realistic sizes (`--quick`: small batches and images), named as the rows name
/// them.
fn realistic(a: &Args) -> [(&'static str, BenchModel); 3] {
    [
        (
            "wide-mlp",
            BenchModel::wide_mlp(if a.quick { 4 } else { 256 }),
        ),
        (
            "resnet",
            BenchModel::resnet(if a.quick { 2 } else { 32 }, if a.quick { 8 } else { 32 }),
        ),
        ("lm", BenchModel::lm(if a.quick { 1 } else { 16 })),
    ]
}

fn steps(a: &Args) {
    let batch = if a.quick { 4 } else { 64 };
    let small = [
        ("mlp", BenchModel::mlp(batch)),
        ("cnn", BenchModel::cnn(batch)),
        (
            "transformer",
            BenchModel::transformer(if a.quick { 16 } else { 128 }),
        ),
    ];
    for (name, m) in small.iter().chain(&realistic(a)) {
        step_rows(a, "step", name, m, Precision::F32);
    }
}

/// The realistic sizes under bf16 autocast (`Precision::Bf16`: tensor-core products on
/// `Cuda`), against PyTorch's AMP rows; run last.
fn bf16_rows(a: &Args) {
    for (name, m) in &realistic(a) {
        step_rows(a, "step-bf16", name, m, Precision::Bf16);
    }
}

/// `{prefix}/{eager,linked}/{name}`: training steps of `m` on an eager and a linked session
/// with autocast `precision`. A model whose first step fails prints its error instead of a
/// row, and the bench goes on.
fn step_rows(a: &Args, prefix: &str, name: &str, m: &BenchModel, precision: Precision) {
    let eager_row = format!("{prefix}/eager/{name}");
    let linked_row = format!("{prefix}/linked/{name}");
    let r = (|| -> tl_nn::Result<()> {
        if a.wants(&eager_row) {
            let s = Session::new(Options {
                precision,
                ..Options::backend(a.backend)
            })?;
            time_steps(a, &eager_row, EagerRun::with_session(m, s)?)?;
        }
        if a.wants(&linked_row) {
            let mut s = LinkedSession::new();
            s.set_backend(a.backend)?;
            s.set_precision(precision)?;
            time_steps(a, &linked_row, LinkedRun::with_session(m, s)?)?;
        }
        Ok(())
    })();
    if let Err(e) = r {
        eprintln!("gpu bench: {prefix}/…/{name}: {e}");
    }
}

/// Row `name`: the median step of `run`, after a first step whose error is returned.
fn time_steps<O: Train<T = f32>>(
    a: &Args,
    name: &str,
    mut run: common::Run<'_, O>,
) -> tl_nn::Result<()> {
    run.try_step()?;
    let ms = median_ms(a, || {
        run.step();
    });
    row(a.backend, name, ms, None);
    Ok(())
}

/// The matmul rows: f32 on `s`, then TF32 and bf16 autocast (tensor cores on `Cuda`) on
/// sessions of the same backend with that precision, at 2048² and 4096² (`--quick`: 64²).
fn matmuls(a: &Args, s: &mut Session<f32>) -> tl_session::Result<()> {
    let sizes: &[usize] = if a.quick { &[64] } else { &[2048, 4096] };
    for &n in sizes {
        matmul(a, s, "matmul", n)?;
    }
    for (prefix, precision) in [
        ("matmul-tf32", Precision::Tf32),
        ("matmul-bf16", Precision::Bf16),
    ] {
        let mut s = Session::<f32>::new(Options {
            precision,
            ..Options::backend(a.backend)
        })?;
        for &n in sizes {
            matmul(a, &mut s, prefix, n)?;
        }
    }
    Ok(())
}

/// `sum(a·b)` of two resident `n × n` parameters on `s`, as row `{prefix}/{n}`.
fn matmul(a: &Args, s: &mut Session<f32>, prefix: &str, n: usize) -> tl_session::Result<()> {
    let name = format!("{prefix}/{n}");
    if !a.wants(&name) {
        return Ok(());
    }
    // Parameters stay resident on the device across resets: nothing is uploaded per iteration.
    let x = s.param(filled(&[n, n], 1, 0.01), Some("a"), false)?;
    let y = s.param(filled(&[n, n], 2, 0.01), Some("b"), false)?;
    let mut run = || -> tl_session::Result<f32> {
        s.reset();
        let xa = s.use_param(&x)?;
        let ya = s.use_param(&y)?;
        let p = s.matmul(&xa, &ya)?;
        let total = s.sum(&p)?;
        Ok(s.value(&total)?.item()?)
    };
    run()?;
    let ms = median_ms(a, || {
        run().unwrap();
    });
    let gflops = 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e9;
    row(a.backend, &name, ms, Some(("gflops", gflops)));
    Ok(())
}

fn elementwise(a: &Args, s: &mut Session<f32>) -> tl_session::Result<()> {
    const CHAIN: usize = 8;
    let len = if a.quick { 1 << 20 } else { 1 << 26 };
    let name = |op: &str| format!("{op}/{}MB", (len * 4) >> 20);
    if !["scale", "add"].iter().any(|op| a.wants(&name(op))) {
        return Ok(());
    }
    let x = s.param(filled(&[len], 3, 1.0), Some("x"), false)?;
    for op in ["scale", "add"] {
        let name = name(op);
        if !a.wants(&name) {
            continue;
        }
        // Per iteration: (chain of ops, sum) or (sum alone) on the resident buffer; reset frees
        // the chain's outputs.
        let mut chain = |n: usize| -> tl_session::Result<()> {
            s.reset();
            let xa = s.use_param(&x)?;
            let mut h = xa.clone();
            for _ in 0..n {
                h = match op {
                    "scale" => s.scale(&h, 0.5)?,
                    _ => s.add(&h, &xa)?,
                };
            }
            let total = s.sum(&h)?;
            s.value(&total)?;
            Ok(())
        };
        chain(CHAIN)?;
        let with = median_ms(a, || chain(CHAIN).unwrap());
        let without = median_ms(a, || chain(0).unwrap());
        let ms = ((with - without) / CHAIN as f64).max(1e-6);
        // Bytes read plus written per op: scale reads one buffer, add two.
        let buffers = if op == "scale" { 2.0 } else { 3.0 };
        let moved = buffers * 4.0 * len as f64;
        row(
            a.backend,
            &name,
            ms,
            Some(("gbps", moved / (ms * 1e-3) / 1e9)),
        );
    }
    Ok(())
}

/// The attention rows' geometry: heads of 64, sequence lengths.
const ATT_HEADS: usize = 8;
const ATT_D: usize = 64;

fn attention_lengths(a: &Args) -> &'static [usize] {
    if a.quick {
        &[64]
    } else {
        &[1024, 2048, 4096, 8192]
    }
}

fn attention(a: &Args, s: &mut Session<f32>) -> tl_session::Result<()> {
    let (dm, heads) = (ATT_HEADS * ATT_D, ATT_HEADS);
    for &n in attention_lengths(a) {
        if !["flash", "composed"]
            .iter()
            .any(|p| a.wants(&format!("attention/{p}/n{n}")))
        {
            continue;
        }
        let mask = tl_spec::ops::attention::Mask::causal(n)?;
        let w: Vec<_> = (0..4)
            .map(|k| s.param(filled(&[dm, dm], 10 + k, 0.04), None, true))
            .collect::<tl_session::Result<_>>()?;
        let x = s.param(filled(&[n, dm], 20, 1.0), Some("x"), false)?;
        for (name, fused) in [("flash", true), ("composed", false)] {
            let name = format!("attention/{name}/n{n}");
            if !a.wants(&name) {
                continue;
            }
            let mut run = || -> tl_session::Result<()> {
                s.reset();
                let ws = w
                    .iter()
                    .map(|p| s.use_param(p))
                    .collect::<tl_session::Result<Vec<_>>>()?;
                let xa = s.use_param(&x)?;
                let y = s.multi_head_attention(
                    &ws[0],
                    &ws[1],
                    &ws[2],
                    &ws[3],
                    &xa,
                    heads,
                    Some(mask.clone()),
                    fused,
                )?;
                let total = s.sum(&y)?;
                s.backward(&total)?;
                s.grad(&w[0])?;
                Ok(())
            };
            run()?;
            let ms = median_ms(a, || run().unwrap());
            row(a.backend, &name, ms, None);
        }
        s.reset();
    }
    Ok(())
}

/// The fused attention core alone on `dev`: forward and backward of causal attention over
/// (1, n, 8, d) Q, K, V (d = 64, or 128 in the rows labelled `-d128`, at n = 1024 and 4096;
/// K and V of 2 heads in the rows labelled `-gqa`; under bf16 autocast in the rows labelled
/// `-bf16`), timed to a read of `sum(dV)` (which waits for every launch).
fn attention_core<D: Device>(a: &Args, dev: &mut D, label: &str) -> tl_tape_cuda::Result<()> {
    attention_core_rows(a, dev, label, true)
}

/// The fused core's rows of `label` on `dev` (module docs): forward and backward
/// (`attention-core/…`) or, without `backward`, the forward alone (`attention-fwd/…`). A
/// label with `-tc` runs the core on the tensor cores (`FlashProducts::Tf32x3`).
fn attention_core_rows<D: Device>(
    a: &Args,
    dev: &mut D,
    label: &str,
    backward: bool,
) -> tl_tape_cuda::Result<()> {
    let d = if label.ends_with("-d128") { 128 } else { ATT_D };
    let products = match label.contains("-tc") {
        true => tl_tape_cuda::FlashProducts::Tf32x3,
        false => tl_tape_cuda::FlashProducts::Fma,
    };
    let round = match label.ends_with("-bf16") {
        true => tl_tape_cuda::Precision::Bf16,
        false => tl_tape_cuda::Precision::F32,
    };
    let kv_heads = if label.ends_with("-gqa") {
        2
    } else {
        ATT_HEADS
    };
    for &n in attention_lengths(a) {
        if d != ATT_D && !a.quick && n != 1024 && n != 4096 {
            continue;
        }
        let group = if backward {
            "attention-core"
        } else {
            "attention-fwd"
        };
        let name = format!("{group}/{label}/n{n}");
        if !a.wants(&name) {
            continue;
        }
        let dims = FlashDims {
            batch: 1,
            nq: n,
            nk: n,
            heads: ATT_HEADS,
            kv_heads,
            d,
        };
        let mask = tl_spec::ops::attention::Mask::causal(n)?;
        let f = Flash::new(dims, FlashMask::of("bench", Some(&mask), n, n, 1)?)
            .with_round(round)
            .with_products(products);
        let lens = [dims.q_len(), dims.kv_len(), dims.kv_len(), dims.q_len()];
        let data: Vec<Vec<f32>> = (0..4)
            .map(|k| filled(&[lens[k]], 30 + k as u64, 1.0).data().to_vec())
            .collect();
        let [q, k, v, go] = [0, 1, 2, 3].map(|i| dev.upload(&data[i]));
        let (q, k, v, go) = (q?, k?, v?, go?);
        let ms = device_ms(a, dev, |dev| {
            if round.is_autocast() {
                let [o, lse, exact] = dev.flash_attention_rounded([q, k, v], &f)?;
                let [dq, dk, dv] = dev.flash_attention_bwd([q, k, v], exact, lse, go, &f)?;
                return Ok(vec![o, lse, exact, dq, dk, dv]);
            }
            let (o, lse) = dev.flash_attention([q, k, v], &f)?;
            if !backward {
                return Ok(vec![lse, o]);
            }
            let [dq, dk, dv] = dev.flash_attention_bwd([q, k, v], o, lse, go, &f)?;
            Ok(vec![o, lse, dq, dk, dv])
        })?;
        // Causal: 2·n²·d·H products forward, 5 more backward (FlashAttention's count).
        let flops = if backward { 7.0 } else { 2.0 } * (n * n * d * ATT_HEADS) as f64;
        row(
            a.backend,
            &name,
            ms,
            Some(("tflops", flops / (ms * 1e-3) / 1e12)),
        );
        dev.release_all([q, k, v, go]);
    }
    Ok(())
}

/// The ResNet's conv forward and weight cotangent on `dev` by the implicit-GEMM kernels and by
/// the im2col path (module docs), timed to a read of the result's sum.
fn convs<D: Device>(a: &Args, dev: &mut D) -> tl_tape_cuda::Result<()> {
    let (batch, side) = if a.quick { (2, 8) } else { (32, 32) };
    for (c, out) in [(3, 64), (64, 64)] {
        let win = Windows {
            batch,
            channels: c,
            big: vec![side, side],
            small: vec![side, side],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            padding: vec![1, 1],
        };
        let l = win.check("bench")?;
        let shape = format!("n{batch}-c{c}-a{out}-{side}x{side}");
        let rows = [
            "conv/implicit",
            "conv/im2col",
            "conv-dw/implicit",
            "conv-dw/im2col",
            "conv-dx/implicit",
            "conv-dx/im2col",
            "conv/implicit-bf16",
            "conv/im2col-bf16",
            "conv-dw/implicit-bf16",
            "conv-dw/im2col-bf16",
            "conv-dx/implicit-bf16",
            "conv-dx/im2col-bf16",
        ]
        .map(|k| format!("{k}/{shape}"));
        if !rows.iter().any(|r| a.wants(r)) {
            continue;
        }
        let x = dev.upload(filled(&[l.big_len()], 40, 1.0).data())?;
        let w = dev.upload(filled(&[out * c * 9], 41, 0.1).data())?;
        let gy = dev.upload(filled(&[batch * out * l.small], 42, 0.1).data())?;
        let g = Gemm::nn(out, c * 9, batch * l.small);
        let implicit = |dev: &mut D| -> tl_tape_cuda::Result<Vec<Buffer>> {
            Ok(vec![dev.conv_implicit(w, x, &win, out)?])
        };
        let im2col = |dev: &mut D| -> tl_tape_cuda::Result<Vec<Buffer>> {
            let cols = dev.im2col(x, &win)?;
            let y = dev.matmul(w, cols, g)?;
            let p = dev.permute(y, &[out, batch, l.small], &[1, 0, 2])?;
            Ok(vec![cols, y, p])
        };
        let implicit_dw = |dev: &mut D| -> tl_tape_cuda::Result<Vec<Buffer>> {
            Ok(vec![dev.conv_implicit_dw(gy, x, &win, out)?])
        };
        let im2col_dw = |dev: &mut D| -> tl_tape_cuda::Result<Vec<Buffer>> {
            let gr = dev.permute(gy, &[batch, out, l.small], &[1, 0, 2])?;
            let cols = dev.im2col(x, &win)?;
            let dw = dev.matmul(gr, cols, win.dw_gemm(out))?;
            Ok(vec![gr, cols, dw])
        };
        let implicit_dx = |dev: &mut D| -> tl_tape_cuda::Result<Vec<Buffer>> {
            Ok(vec![dev.conv_implicit_dx(w, gy, &win, out)?])
        };
        let im2col_dx = |dev: &mut D| -> tl_tape_cuda::Result<Vec<Buffer>> {
            let gr = dev.permute(gy, &[batch, out, l.small], &[1, 0, 2])?;
            let gt = Gemm::nn(c * 9, out, batch * l.small).with_t(true, false);
            let dcols = dev.matmul(w, gr, gt)?;
            let dx = dev.col2im(dcols, &win)?;
            Ok(vec![gr, dcols, dx])
        };
        let flops = 2.0 * (batch * out * l.small * c * 9) as f64;
        type Run<'a, D> = &'a dyn Fn(&mut D) -> tl_tape_cuda::Result<Vec<Buffer>>;
        let runs: [(&String, Precision, Run<D>); 12] = [
            (&rows[0], Precision::F32, &implicit),
            (&rows[1], Precision::F32, &im2col),
            (&rows[2], Precision::F32, &implicit_dw),
            (&rows[3], Precision::F32, &im2col_dw),
            (&rows[4], Precision::F32, &implicit_dx),
            (&rows[5], Precision::F32, &im2col_dx),
            (&rows[6], Precision::Bf16, &implicit),
            (&rows[7], Precision::Bf16, &im2col),
            (&rows[8], Precision::Bf16, &implicit_dw),
            (&rows[9], Precision::Bf16, &im2col_dw),
            (&rows[10], Precision::Bf16, &implicit_dx),
            (&rows[11], Precision::Bf16, &im2col_dx),
        ];
        for (row_name, prec, f) in runs {
            if !a.wants(row_name) {
                continue;
            }
            let _precision = tl_tape_cuda::precision::install(prec);
            let ms = device_ms(a, dev, f)?;
            row(
                a.backend,
                row_name,
                ms,
                Some(("gflops", flops / (ms * 1e-3) / 1e9)),
            );
        }
        dev.release_all([x, w, gy]);
    }
    Ok(())
}

/// Products a `gemm-core` row runs back to back before it reads a result (the read waits for
/// them all), so that one launch and read are a sixteenth of each product's figure.
const BACK_TO_BACK: usize = 16;

/// `gemm-core/{f32,tf32,bf16}/{n}`: the device's `n × n` matmul alone at each precision
/// (autocast installed as a tape installs it: TF32 and bf16 on the tensor-core kernel), n =
/// 1024 and 2048 (`--quick`: 64); ms and GFLOP/s per product. `gemm-core/{tf32,bf16}/1024-split256`
/// the same with the split-K threshold at 256 output tiles instead of
/// [`tl_tape_cuda::device::SPLIT_K_TILES`] (`gates::force_split_k_tiles`): 1024³ on the
/// tensor-core kernel's 128-wide tiles is 64 tiles, one block each on a GPU of 132
/// multiprocessors by default, 4 runs of k (256 blocks) under 256. torch_bench.py's twins:
/// cuBLAS in the same mode, back to back as well.
fn gemm_core<D: Device>(a: &Args, dev: &mut D) -> tl_tape_cuda::Result<()> {
    let sizes: &[usize] = if a.quick { &[64] } else { &[1024, 2048] };
    for (label, prec) in [
        ("f32", Precision::F32),
        ("tf32", Precision::Tf32),
        ("bf16", Precision::Bf16),
    ] {
        let _precision = tl_tape_cuda::precision::install(prec);
        for &n in sizes {
            let splits: &[(&str, Option<usize>)] = match (prec, n) {
                (Precision::F32, _) | (_, 2048) => &[("", None)],
                _ => &[("", None), ("-split256", Some(256))],
            };
            for &(suffix, split) in splits {
                let name = format!("gemm-core/{label}/{n}{suffix}");
                if !a.wants(&name) {
                    continue;
                }
                let _split = tl_tape_cuda::gates::force_split_k_tiles(split);
                let x = dev.upload(filled(&[n, n], 1, 0.01).data())?;
                let y = dev.upload(filled(&[n, n], 2, 0.01).data())?;
                let g = Gemm::nn(n, n, n);
                let ms = device_ms(a, dev, |dev| {
                    (0..BACK_TO_BACK).map(|_| dev.matmul(x, y, g)).collect()
                })? / BACK_TO_BACK as f64;
                let gflops = 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e9;
                row(a.backend, &name, ms, Some(("gflops", gflops)));
                dev.release_all([x, y]);
            }
        }
    }
    Ok(())
}

/// [`gemm_core`], [`attention_core`] (with both flash tilings on `Cuda`) and [`convs`] on the
/// backend's device (the CUDA device or the simulation device).
fn device_rows(a: &Args) -> Result<(), String> {
    let r = match a.backend {
        #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
        Backend::Cuda => tl_tape_cuda::CudaDevice::new().and_then(|mut d| {
            gemm_core(a, &mut d)?;
            attention_core(a, &mut d, "flash")?;
            // The two backward paths side by side whatever the reduction mode: one pass (dQ
            // by atomicAdd over the key blocks) and the two fixed-order kernels.
            for (label, one_pass) in [("flash-one-pass", true), ("flash-two-pass", false)] {
                let _gate = tl_tape_cuda::gates::force_flash_bwd_one_pass(Some(one_pass));
                attention_core(a, &mut d, label)?;
            }
            attention_core(a, &mut d, "flash-d128")?;
            attention_core(a, &mut d, "flash-gqa")?;
            attention_core(a, &mut d, "flash-bf16")?;
            // The forward on the tensor cores (3xTF32), with its backward and alone, beside
            // the FMA forward alone.
            attention_core(a, &mut d, "flash-tc")?;
            attention_core(a, &mut d, "flash-tc-bf16")?;
            attention_core_rows(a, &mut d, "flash", false)?;
            attention_core_rows(a, &mut d, "flash-tc", false)?;
            // Each tiling where the default (`FlashTiles::Auto`) does not take it: the narrow
            // backward at d = 128, the wide forward (dynamic shared memory, 64 keys a step) at
            // d = 64. The same bits, timed beside the default so that the default follows the
            // measurement.
            d.set_flash_tiles(tl_tape_cuda::FlashTiles::Narrow);
            attention_core(a, &mut d, "flash-narrow-d128")?;
            d.set_flash_tiles(tl_tape_cuda::FlashTiles::Wide);
            attention_core(a, &mut d, "flash-wide")?;
            d.set_flash_tiles(tl_tape_cuda::FlashTiles::Auto);
            convs(a, &mut d)
        }),
        #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
        Backend::Cuda => return Err("built without the `cuda` feature".into()),
        Backend::CudaSim => {
            let mut d = SimDevice::new();
            gemm_core(a, &mut d)
                .and_then(|()| attention_core(a, &mut d, "flash"))
                .and_then(|()| attention_core(a, &mut d, "flash-gqa"))
                .and_then(|()| attention_core(a, &mut d, "flash-bf16"))
                .and_then(|()| attention_core(a, &mut d, "flash-tc"))
                .and_then(|()| convs(a, &mut d))
        }
        Backend::Cpu => Ok(()),
    };
    r.map_err(|e| e.to_string())
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu bench: {e}");
            std::process::exit(2);
        }
    };
    let mut s = match Session::<f32>::new(Options::backend(a.backend)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpu bench: skipping, {e}");
            return;
        }
    };
    steps(&a);
    let r = matmuls(&a, &mut s)
        .and_then(|()| elementwise(&a, &mut s))
        .and_then(|()| attention(&a, &mut s))
        .map_err(|e| e.to_string())
        .and_then(|()| device_rows(&a));
    bf16_rows(&a);
    if let Err(e) = r {
        eprintln!("gpu bench: {e}");
        std::process::exit(1);
    }
}
