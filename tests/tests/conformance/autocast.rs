//! Autocast's products on every tape (`checks::autocast`): under bf16 and TF32 the tape's
//! matmul, linear and conv (values and every gradient) equal the f64 reference on rounded
//! operands within the f32 accumulation bound: the CPU tape on every bf16 kernel this CPU has,
//! the CUDA tape on the simulation device and (feature `cuda-emu`) on the emulated kernels.
//! Likewise attention's core, fused and composed, against the spec's autocast reference
//! (`checks::autocast::tape_attention_matches_the_reference`), and `multiHeadAttention` against
//! its pieces on the same tape (`checks::autocast::mha`). And every product op's registry
//! cases, values and every gradient (`checks::autocast::check_products`), on each tape, the CPU
//! tape also with every size gate forced open and shut.

use tl_conformance::checks::autocast::mha::tape_mha_matches_its_composition;
use tl_conformance::checks::autocast::{
    TapeRun, check_products, product_entries, tape_attention_matches_the_reference,
    tape_products_match_the_reference,
};
use tl_conformance::{OpInfo, Report, RunConfig, assert_all_passed};
use tl_ir::Op;
use tl_spec::Tensor;
use tl_tape_cpu::gates::{self, Gates};
use tl_tape_cpu::precision::Bf16Kernel;
use tl_tape_cpu::{Precision, Tape};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, FlashProducts, SimDevice};

const AUTOCAST: [Precision; 2] = [Precision::Bf16, Precision::Tf32];

/// `op` on a fresh CPU tape at `p`: the value and every operand's gradient.
fn on_cpu(
    p: Precision,
    op: &Op,
    x: &[Tensor<f32>],
    g: &Tensor<f32>,
) -> Result<Vec<Tensor<f32>>, String> {
    let mut t = Tape::<f32>::new();
    t.set_precision(p);
    let ids: Vec<_> = x.iter().map(|v| t.leaf(v.clone(), None, true)).collect();
    let y = t.apply(op, &ids).map_err(|e| e.to_string())?;
    let grads = t.backward_dense(y, g).map_err(|e| e.to_string())?;
    let mut out = vec![t.get(y).map_err(|e| e.to_string())?.clone()];
    out.extend(ids.iter().map(|&i| grads[i].clone()));
    Ok(out)
}

/// `op` on a fresh CUDA tape over `dev` at `p`: the value and every operand's gradient (also
/// the GPU module's, `cuda_gpu::autocast_holds_on_the_gpu`).
pub(crate) fn on_device<D: Device>(
    dev: D,
    p: Precision,
    op: &Op,
    x: &[Tensor<f32>],
    g: &Tensor<f32>,
) -> Result<Vec<Tensor<f32>>, String> {
    let e = |e: tl_tape_cuda::Error| e.to_string();
    let mut t = CudaTape::new(dev);
    t.set_precision(p);
    let ids = x
        .iter()
        .map(|v| t.upload_leaf(v, None, true).map_err(e))
        .collect::<Result<Vec<_>, _>>()?;
    let y = t.apply(op, &ids).map_err(e)?;
    let seed = AnyBuffer::upload(t.device_mut(), g).map_err(e)?;
    let grads = t.backward_dense(y, &seed).map_err(e)?;
    let mut out = vec![t.read::<f32>(y).map_err(e)?];
    for &i in &ids {
        out.push(grads[i].download::<f32, _>(t.device()).map_err(e)?);
    }
    t.release_grads(grads);
    seed.release(t.device_mut());
    Ok(out)
}

#[test]
fn tape_products_match_the_reference_on_the_cpu() {
    for kernel in Bf16Kernel::available() {
        let _k = gates::force(Gates::DEFAULT.with_bf16_kernel(kernel));
        for p in AUTOCAST {
            let r = tape_products_match_the_reference(&mut on_cpu, p, 43);
            assert_eq!(r, Ok(()), "{kernel:?} {p:?}");
            let r = tape_attention_matches_the_reference(&mut on_cpu, p, 47);
            assert_eq!(r, Ok(()), "{kernel:?} {p:?}");
        }
    }
}

/// The attention check has teeth: a tape that rounds the operands but multiplies by the
/// unrounded probabilities and dS (the f32 tape on rounded q, k, v and cotangent) fails it.
#[test]
fn the_attention_check_sees_probabilities_left_unrounded() {
    for p in AUTOCAST {
        let mut operands_only = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
            let r = |t: &Tensor<f32>| t.map(|v| p.round(v));
            let x: Vec<_> = x.iter().map(r).collect();
            on_cpu(Precision::F32, op, &x, &r(g))
        };
        let r = tape_attention_matches_the_reference(&mut operands_only, p, 47);
        assert!(
            r.as_ref()
                .is_err_and(|e| e.contains("scaledDotProductAttention")),
            "{p:?}: {r:?}"
        );
    }
}

#[test]
fn tape_products_match_the_reference_on_the_cuda_sim() {
    for p in AUTOCAST {
        let mut run = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
            on_device(SimDevice::new(), p, op, x, g)
        };
        assert_eq!(
            tape_products_match_the_reference(&mut run, p, 43),
            Ok(()),
            "{p:?}"
        );
        assert_eq!(
            tape_attention_matches_the_reference(&mut run, p, 47),
            Ok(()),
            "{p:?}"
        );
    }
}

/// `multiHeadAttention` at both settings against its composition on the same tape
/// (`checks::autocast::mha`), on the CPU tape at each bf16 kernel this CPU has, at the default
/// gates and with every size gate forced open and shut.
#[test]
fn multi_head_attention_matches_its_composition_on_the_cpu() {
    for kernel in Bf16Kernel::available() {
        for gates in [
            Gates::DEFAULT,
            Gates::fast_paths_on(2),
            Gates::fast_paths_off(),
        ] {
            let _g = gates::force(gates.with_bf16_kernel(kernel));
            for p in AUTOCAST {
                let r = tape_mha_matches_its_composition(&mut on_cpu, p, 53);
                assert_eq!(r, Ok(()), "{kernel:?} {gates:?} {p:?}");
            }
        }
    }
}

/// The same on the sim, its fused core on the CUDA cores and on the tensor cores.
#[test]
fn multi_head_attention_matches_its_composition_on_the_cuda_sim() {
    mha_matches_on(|| Ok(SimDevice::new()));
    mha_matches_on(|| Ok(tc_sim()));
}

/// The same on the emulated kernels, the fused core on the CUDA cores and on the tensor cores.
#[cfg(feature = "cuda-emu")]
#[test]
fn multi_head_attention_matches_its_composition_on_the_emulated_kernels() {
    let emu = |products: Option<FlashProducts>| {
        move || {
            let mut dev = tl_tape_cuda::CudaDevice::new().map_err(|e| e.to_string())?;
            if let Some(products) = products {
                dev.set_flash_products(products);
            }
            Ok(dev)
        }
    };
    mha_matches_on(emu(None));
    mha_matches_on(emu(Some(FlashProducts::Tf32x3)));
}

/// The composition check has teeth: it fails an op that does not round while its pieces do
/// (on the value), a weight gradient one bit off, and x's gradient off by 2⁻¹⁰ of itself at
/// one element (a quarter of a bf16 unit).
#[test]
fn the_composition_check_sees_an_op_that_differs_from_its_pieces() {
    type Change = fn(&mut Vec<Tensor<f32>>);
    let cases: [(Option<Change>, &str); 3] = [
        (None, "value"),
        (
            Some(|r| {
                let v = &mut r[2].data_mut()[5];
                *v = f32::from_bits(v.to_bits() ^ 1);
            }),
            "wk's gradient",
        ),
        (
            Some(|r| {
                let v = &mut r[5].data_mut()[3];
                *v += *v * 2f32.powi(-10);
            }),
            "x's gradient",
        ),
    ];
    for (change, needle) in cases {
        let mut changed = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
            if !matches!(op, Op::MultiHeadAttention { .. }) {
                return on_cpu(p, op, x, g);
            }
            match change {
                // The op without autocast: its pieces round, it does not.
                None => on_cpu(Precision::F32, op, x, g),
                Some(change) => {
                    let mut r = on_cpu(p, op, x, g)?;
                    change(&mut r);
                    Ok(r)
                }
            }
        };
        let r = tape_mha_matches_its_composition(&mut changed, Precision::Bf16, 53);
        assert!(
            r.as_ref()
                .is_err_and(|e| e.contains("multiHeadAttention") && e.contains(needle)),
            "{needle}: {r:?}"
        );
    }
}

/// The attention check on the sim with the fused core on the tensor cores
/// (`FlashProducts::Tf32x3`: under autocast the rounded operands' exact products, the sim twins
/// of `tl_flash_fwd_tc` and the backward's two kernels).
#[test]
fn tape_attention_matches_the_reference_on_the_cuda_sim_with_tensor_core_flash() {
    attention_matches_on(|| Ok(tc_sim()));
}

/// The same on the emulated tensor-core kernels.
#[cfg(feature = "cuda-emu")]
#[test]
fn tape_attention_matches_the_reference_on_the_emulated_kernels_with_tensor_core_flash() {
    attention_matches_on(|| {
        let mut dev = tl_tape_cuda::CudaDevice::new().map_err(|e| e.to_string())?;
        dev.set_flash_products(FlashProducts::Tf32x3);
        Ok(dev)
    });
}

/// A fixed check (`check(run, p, seed)`) at both autocast settings, on tapes over the devices
/// `make` gives.
fn holds_on<D: Device>(
    make: impl Fn() -> Result<D, String>,
    check: fn(&mut TapeRun<'_>, Precision, u64) -> Result<(), String>,
    seed: u64,
) {
    for p in AUTOCAST {
        let mut run = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
            on_device(make()?, p, op, x, g)
        };
        assert_eq!(check(&mut run, p, seed), Ok(()), "{p:?}");
    }
}

/// The attention check at both autocast settings, on tapes over the devices `make` gives.
fn attention_matches_on<D: Device>(make: impl Fn() -> Result<D, String>) {
    holds_on(make, tape_attention_matches_the_reference, 47);
}

/// The composition check at both settings, on tapes over the devices `make` gives.
fn mha_matches_on<D: Device>(make: impl Fn() -> Result<D, String>) {
    holds_on(make, tape_mha_matches_its_composition, 53);
}

/// The value of a fused `scaledDotProductAttention` (causal, 4 query heads over 2, 37
/// positions) on a CUDA tape over `dev` under bf16, its operands requiring grad or not: the
/// value's bits.
fn attention_value<D: Device>(dev: D, requires_grad: bool) -> Vec<u32> {
    let mut t = CudaTape::new(dev);
    t.set_precision(Precision::Bf16);
    let shapes: [&[usize]; 3] = [&[37, 32], &[37, 16], &[37, 16]];
    let ids: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let n: usize = s.iter().product();
            let data = (0..n)
                .map(|i| ((i * 7 + k * 3) % 23) as f32 / 11.0 - 1.0)
                .collect();
            let x = Tensor::new(*s, data).unwrap();
            t.upload_leaf(&x, None, requires_grad).unwrap()
        })
        .collect();
    let op = Op::ScaledDotProductAttention {
        heads: 4,
        mask: Some(tl_spec::ops::attention::Mask::causal(37).unwrap()),
        fused: true,
    };
    let y = t.apply(&op, &ids).unwrap();
    let v = t.read::<f32>(y).unwrap();
    v.data().iter().map(|x| x.to_bits()).collect()
}

/// Under autocast a fused attention node that will not be differentiated computes no Ō (its
/// first pass keeps each row's statistics alone): the differentiated node's value bit for bit,
/// on the sim, with either FlashProducts.
#[test]
fn attention_without_gradients_gives_the_same_value_on_the_cuda_sim() {
    let sim = |rg| attention_value(SimDevice::new(), rg);
    assert_eq!(sim(false), sim(true));
    let tc = |rg| attention_value(tc_sim(), rg);
    assert_eq!(tc(false), tc(true), "on the tensor cores");
}

/// A sim whose fused attention core runs on the tensor cores (`FlashProducts::Tf32x3`).
fn tc_sim() -> SimDevice {
    let mut dev = SimDevice::new();
    dev.set_flash_products(FlashProducts::Tf32x3);
    dev
}

/// The same on the emulated kernels (`TL_FA_STATS`), which also give the sim's bits.
#[cfg(feature = "cuda-emu")]
#[test]
fn attention_without_gradients_gives_the_same_value_on_the_emulated_kernels() {
    use tl_tape_cuda::CudaDevice;
    let emu = |rg| attention_value(CudaDevice::new().unwrap(), rg);
    assert_eq!(emu(false), emu(true));
    assert_eq!(
        emu(false),
        attention_value(SimDevice::new(), true),
        "the sim's bits"
    );
    let tc = |rg| {
        let mut dev = CudaDevice::new().unwrap();
        dev.set_flash_products(FlashProducts::Tf32x3);
        attention_value(dev, rg)
    };
    assert_eq!(tc(false), tc(true), "on the tensor cores");
    assert_eq!(tc(false), attention_value(tc_sim(), true), "the sim's bits");
}

/// The check has teeth: the plain f32 tape (no rounding) misses the bf16 bound.
#[test]
fn the_check_sees_a_tape_that_does_not_round() {
    let mut f32_tape = |_: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
        on_cpu(Precision::F32, op, x, g)
    };
    let r = tape_products_match_the_reference(&mut f32_tape, Precision::Bf16, 43);
    assert!(r.as_ref().is_err_and(|e| e.contains("matmul")), "{r:?}");
}

#[cfg(feature = "cuda-emu")]
#[test]
fn tape_products_match_the_reference_on_the_emulated_kernels() {
    use tl_tape_cuda::CudaDevice;
    for p in AUTOCAST {
        let mut run = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
            let dev = CudaDevice::new().map_err(|e| e.to_string())?;
            on_device(dev, p, op, x, g)
        };
        assert_eq!(
            tape_products_match_the_reference(&mut run, p, 43),
            Ok(()),
            "{p:?}"
        );
        assert_eq!(
            tape_attention_matches_the_reference(&mut run, p, 47),
            Ok(()),
            "{p:?}"
        );
    }
}

/// [`check_products`] at both settings on every product op's registry cases, `cfg.cases` each,
/// on the tape `run` gives (named `name` in the reports).
fn every_product(cfg: &RunConfig, name: &str, run: &mut TapeRun<'_>) -> Vec<Report> {
    products(&product_entries(), cfg, name, run)
}

/// [`check_products`] of `entries` at each autocast precision.
fn products(entries: &[OpInfo], cfg: &RunConfig, name: &str, run: &mut TapeRun<'_>) -> Vec<Report> {
    let mut reports = Vec::new();
    for p in AUTOCAST {
        for e in entries {
            reports.push(check_products(e, cfg, p, name, run));
        }
    }
    reports
}

/// The product entries whose path the implicit-GEMM conv gate moves: `conv` alone (its
/// forward, input and weight cotangents; `convTranspose` runs `col2im` and the GEMM at every
/// size).
fn implicit_conv_entries() -> Vec<OpInfo> {
    let conv: Vec<OpInfo> = product_entries()
        .into_iter()
        .filter(|e| e.name == "conv")
        .collect();
    assert_eq!(conv.len(), 1, "the conv entry");
    conv
}

/// The product ops' registry cases on the CPU tape, on each bf16 kernel this CPU has, at the
/// default gates and with every size gate forced open (`Gates::fast_paths_on(2)`: two threads,
/// every split threshold 0, the column-major product with its copies from side 1, the 16-wide
/// kernel at every depth where the CPU has AVX-512, one batch entry per conv weight-cotangent
/// chunk) and shut (`fast_paths_off`: the scalar level, strided products, one thread). The
/// autocast path rounds into copies and then runs the f32 GEMM, so each gate moves its sums.
#[test]
fn every_product_op_matches_the_reference_on_the_cpu() {
    let names = [
        entries_named(),
        vec!["matmul", "bmm", "linear", "conv", "convTranspose"],
    ];
    assert_eq!(names[0], names[1], "the product ops' entries");
    let (cfg, mut reports) = (RunConfig::from_env(), Vec::new());
    for kernel in Bf16Kernel::available() {
        for (gates, what) in [
            (Gates::DEFAULT, "default"),
            (Gates::fast_paths_on(2), "gates open"),
            (Gates::fast_paths_off(), "gates shut"),
        ] {
            let _g = gates::force(gates.with_bf16_kernel(kernel));
            let name = format!("cpu {kernel:?} {what}");
            reports.extend(every_product(&cfg, &name, &mut on_cpu));
        }
    }
    assert_all_passed(&reports, cfg.cases);
}

fn entries_named() -> Vec<&'static str> {
    product_entries().iter().map(|e| e.name).collect()
}

/// The product ops' registry cases on the sim, at the default gates (the registry's convs are
/// small: im2col and the tensor-core GEMM) and conv's again with the implicit-GEMM conv
/// kernels forced on (`force_conv_implicit_min_tiles(Some(0))`: the forward on the
/// tensor-core implicit kernel, rounding as it stages; the cotangents' operands rounded into
/// copies, then the f32 kernels). No registry case reaches a split along `k` (k ≥ 256) even with the split
/// threshold forced; the fixed products of `tl_tape_cuda`'s `autocast::` tests split it.
#[test]
fn every_product_op_matches_the_reference_on_the_cuda_sim() {
    let mut run = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
        on_device(SimDevice::new(), p, op, x, g)
    };
    let cfg = RunConfig::from_env();
    let mut reports = every_product(&cfg, "cuda-sim", &mut run);
    let _implicit = tl_tape_cuda::gates::force_conv_implicit_min_tiles(Some(0));
    let conv = implicit_conv_entries();
    reports.extend(products(&conv, &cfg, "cuda-sim implicit conv", &mut run));
    assert_all_passed(&reports, cfg.cases);
}

/// A quarter of the default cases (the emulated kernels give the sim's bits on every registry
/// op: `cuda_emu::`), unless `TL_CASES` is set; the default gates, then conv's cases with the
/// implicit-GEMM conv kernels forced on.
#[cfg(feature = "cuda-emu")]
#[test]
fn every_product_op_matches_the_reference_on_the_emulated_kernels() {
    let mut run = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
        let dev = tl_tape_cuda::CudaDevice::new().map_err(|e| e.to_string())?;
        on_device(dev, p, op, x, g)
    };
    let cfg = RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 4);
    let mut reports = every_product(&cfg, "cuda-emu", &mut run);
    let _implicit = tl_tape_cuda::gates::force_conv_implicit_min_tiles(Some(0));
    let conv = implicit_conv_entries();
    reports.extend(products(&conv, &cfg, "cuda-emu implicit conv", &mut run));
    assert_all_passed(&reports, cfg.cases);
}

/// The product check has teeth, on every product op: a tape that does not round fails it; one
/// that rounds the operands but not the cotangent fails a gradient (its values are right); one
/// that rounds the bias too (linear, conv, convTranspose) fails the value (its gradients are
/// right).
#[test]
fn the_product_check_sees_each_rounding_left_out_or_added() {
    let cfg = RunConfig {
        cases: 8,
        ..RunConfig::from_env()
    };
    let p = Precision::Bf16;
    let r = |t: &Tensor<f32>| t.map(|v| p.round(v));
    for e in product_entries() {
        let fails = |run: &mut TapeRun<'_>, what: &str, needle: &str| {
            let report = check_products(&e, &cfg, p, what, run);
            let msg = report.failure.clone().unwrap_or_default();
            assert!(
                !report.passed() && msg.contains(needle),
                "{}: {what} should fail on {needle:?}: {report}",
                e.name
            );
        };
        let mut f32_tape = |_: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
            on_cpu(Precision::F32, op, x, g)
        };
        fails(&mut f32_tape, "no rounding", "against");
        let mut operands_only = |_: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
            let x: Vec<_> = x
                .iter()
                .enumerate()
                .map(|(k, t)| match (op, k) {
                    (Op::Linear | Op::Conv { .. } | Op::ConvTranspose { .. }, 1) => t.clone(),
                    _ => r(t),
                })
                .collect();
            on_cpu(Precision::F32, op, &x, g)
        };
        fails(&mut operands_only, "cotangent unrounded", "gradient");
        if e.name != "matmul" && e.name != "bmm" {
            let mut bias_too = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
                let mut x = x.to_vec();
                x[1] = r(&x[1]);
                on_cpu(p, op, &x, g)
            };
            fails(&mut bias_too, "bias rounded", "value");
        }
    }
}
