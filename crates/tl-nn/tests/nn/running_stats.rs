//! BatchNorm's running statistics: `batchMoments` and the update (`Train::update_running`) run
//! where the data lives. The values are those of the host rule the update replaced (the
//! moments read back, PyTorch's rule in f64, rounded once), bit for bit, on every session and
//! backend; on a CUDA backend a training step reads back the loss only and uploads nothing for
//! the statistics; a linked session's host write of one parameter touches that parameter only.

use tl_nn::{BatchNorm, Linear, Module, Runtime};
use tl_session::{Backend, Error, Optimizer, Train};
use tl_spec::{Scalar, Shape, Tensor};

use crate::{eager, linked, linked_on};

/// (N, C, H, W) of the batches.
const DIMS: [usize; 4] = [4, 3, 5, 6];
const MOMENTUM: f64 = 0.1;
/// Training passes per check.
const PASSES: usize = 3;

/// Runs `check(name, runtime)` on every session and backend: eager and linked, CPU f64 and f32,
/// the sim, and under `cuda-emu` the emulated device.
macro_rules! on_every_runtime {
    ($check:ident) => {
        $check("eager cpu f64", eager::<f64>(Backend::Cpu, 0));
        $check("eager cpu f32", eager::<f32>(Backend::Cpu, 0));
        $check("eager sim", eager::<f32>(Backend::CudaSim, 0));
        $check("linked cpu f64", linked::<f64>(0));
        $check("linked cpu f32", linked::<f32>(0));
        $check("linked sim", linked_on(Backend::CudaSim, 0));
        #[cfg(feature = "cuda-emu")]
        {
            $check("eager cuda-emu", eager::<f32>(Backend::Cuda, 0));
            $check("linked cuda-emu", linked_on(Backend::Cuda, 0));
        }
    };
}

/// Batch `k`: per channel a different mean and spread, so every statistic is exercised.
fn batch(dims: &[usize], k: usize) -> Tensor<f64> {
    let (c, r) = (dims[1], dims[2..].iter().product::<usize>());
    Tensor::from_fn(dims, |i| {
        let ch = (i / r) % c;
        let u = ((i * 37 + k * 11) % 23) as f64 / 23.0 - 0.5;
        (ch as f64 + 1.0) * (0.5 + k as f64) * u + ch as f64 - 1.0
    })
}

/// The host rule `BatchNorm::update_running` computed before the update moved to the session:
/// the moments `[μ…, var…]` read back, `(1 − m)·old + m·μ` and, with the unbiased
/// `var·count/(count − 1)` (NaN for one element, which keeps the old variance), the same for
/// the variance, in f64, each rounded once to `T`.
fn host_rule<T: Scalar>(moments: &[T], count: usize, old: (&[T], &[T])) -> (Vec<T>, Vec<T>) {
    let c = old.0.len();
    let mut mean = Vec::with_capacity(c);
    let mut var = Vec::with_capacity(c);
    for k in 0..c {
        let (om, ov) = (old.0[k].as_f64(), old.1[k].as_f64());
        mean.push(T::lit(
            (1.0 - MOMENTUM) * om + MOMENTUM * moments[k].as_f64(),
        ));
        let v = if count > 1 {
            moments[c + k].as_f64() * count as f64 / (count - 1) as f64
        } else {
            f64::NAN
        };
        var.push(T::lit(if v.is_nan() {
            ov
        } else {
            (1.0 - MOMENTUM) * ov + MOMENTUM * v
        }));
    }
    (mean, var)
}

fn bits<T: Scalar>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.as_f64().to_bits()).collect()
}

/// `PASSES` training passes of a BatchNorm on `dims`-shaped batches in `rt`: after each, its
/// running statistics must have the host rule's bits, the rule applied to the moments of the
/// same batch computed by the same backend (a pass of its own).
fn check_passes<O: Train>(name: &str, rt: &Runtime<O>, dims: &[usize]) {
    let tag: String = dims.iter().map(|d| d.to_string()).collect();
    let bn = BatchNorm::with(&rt.vars().pp(format!("bn{tag}")), dims[1], 1e-5, MOMENTUM).unwrap();
    let (c, count) = (dims[1], dims.iter().product::<usize>() / dims[1]);
    let mut want = (vec![O::T::lit(0.0); c], vec![O::T::lit(1.0); c]);
    for k in 0..PASSES {
        let x = batch(dims, k).cast::<O::T>();
        // BatchNorm's layout: (N, C, R, 1).
        let as_4d = [dims[0], c, count / dims[0], 1];
        let moments = rt
            .forward_train(&bn, |g| {
                g.input(x.clone())?.reshape(&as_4d)?.batch_moments()
            })
            .unwrap();
        rt.forward_train(&bn, |g| bn.forward(&g.input(x.clone())?))
            .unwrap();
        want = host_rule(moments.data(), count, (&want.0, &want.1));
        let got = (
            rt.value_of(&bn.running_mean).unwrap(),
            rt.value_of(&bn.running_var).unwrap(),
        );
        let at = format!("{name} {dims:?} pass {k}");
        assert_eq!(
            bits(got.0.data()),
            bits(&want.0),
            "{at} running_mean: {:?} vs {:?}",
            got.0.data(),
            want.0
        );
        assert_eq!(
            bits(got.1.data()),
            bits(&want.1),
            "{at} running_var: {:?} vs {:?}",
            got.1.data(),
            want.1
        );
    }
}

/// Every session and backend, with (N, C, H, W), an unbatched-like (N, C, L) and one element
/// per channel (N = H = W = 1: the running variance is kept, the mean moves).
#[test]
fn running_statistics_equal_the_host_rule_bit_for_bit() {
    fn check<O: Train>(name: &str, rt: Runtime<O>) {
        for dims in [&DIMS[..], &[2, 3, 4], &[1, 3, 1, 1]] {
            check_passes(name, &rt, dims);
        }
    }
    on_every_runtime!(check);
}

/// One element per channel (N = H = W = 1): the mean moves, the variance stays exactly.
#[test]
fn a_single_element_per_channel_keeps_the_running_variance() {
    fn check<O: Train>(name: &str, rt: Runtime<O>) {
        let bn = BatchNorm::with(&rt.vars().pp("bn"), 3, 1e-5, MOMENTUM).unwrap();
        for k in 0..PASSES {
            let x = batch(&[1, 3, 1, 1], k).cast::<O::T>();
            rt.forward_train(&bn, |g| bn.forward(&g.input(x)?)).unwrap();
            let var = rt.value_of(&bn.running_var).unwrap();
            assert!(var.data().iter().all(|v| v.as_f64() == 1.0), "{name}");
            let mean = rt.value_of(&bn.running_mean).unwrap();
            assert!(mean.data().iter().any(|v| v.as_f64() != 0.0), "{name}");
        }
    }
    check("eager cpu", eager::<f32>(Backend::Cpu, 0));
    check("eager sim", eager::<f32>(Backend::CudaSim, 0));
    check("linked cpu", linked::<f32>(0));
    check("linked sim", linked_on(Backend::CudaSim, 0));
    #[cfg(feature = "cuda-emu")]
    {
        check("eager cuda-emu", eager::<f32>(Backend::Cuda, 0));
        check("linked cuda-emu", linked_on(Backend::Cuda, 0));
    }
}

/// The traffic of the third SGD step of `Sequential(BatchNorm, BatchNorm)` on batch (N, C, H,
/// W), loss the sum of the output; the device holds as many live buffers after the third step
/// as after the second (the replaced mirrors are released).
fn step_traffic<O: Train<T = f32>>(rt: &mut Runtime<O>) -> tl_tape_cuda::Traffic {
    let v = rt.vars();
    let c = DIMS[1];
    let bns = [
        BatchNorm::with(&v.pp("a"), c, 1e-5, MOMENTUM).unwrap(),
        BatchNorm::with(&v.pp("b"), c, 1e-5, MOMENTUM).unwrap(),
    ];
    let model = tl_nn::Sequential::new()
        .add(bns[0].clone())
        .add(bns[1].clone());
    let mut opt = Optimizer::sgd(0.01).unwrap();
    let x = batch(&DIMS, 0).cast::<f32>();
    let mut last = None;
    let mut live = Vec::new();
    for _ in 0..3 {
        let before = rt.session().traffic().unwrap_or_default();
        rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x.clone())?)?.sum()
        })
        .unwrap();
        last = Some(rt.session().traffic().unwrap() - before);
        live.push(rt.session().memory_usage().unwrap().live_buffers());
    }
    assert_eq!(live[1], live[2], "live buffers after steps 1-3: {live:?}");
    last.unwrap()
}

/// On a device backend a training step of batch norms reads back the loss and nothing else
/// (neither the input nor the moments, nor, in the linked session, any parameter) and uploads
/// the batch and nothing else (no running statistics): the update runs on the device.
#[test]
fn a_device_training_step_reads_back_only_the_loss() {
    fn check<O: Train<T = f32>>(name: &str, mut rt: Runtime<O>) {
        let t = step_traffic(&mut rt);
        let numel: u64 = DIMS.iter().map(|&d| d as u64).product();
        assert_eq!(
            (t.downloads, t.download_bytes),
            (1, 4),
            "{name}: the loss only: {t:?}"
        );
        assert_eq!(
            (t.uploads, t.upload_bytes),
            (1, numel * 4),
            "{name}: the batch only: {t:?}"
        );
    }
    check("eager sim", eager::<f32>(Backend::CudaSim, 0));
    check("linked sim", linked_on(Backend::CudaSim, 0));
    #[cfg(feature = "cuda-emu")]
    {
        check("eager cuda-emu", eager::<f32>(Backend::Cuda, 0));
        check("linked cuda-emu", linked_on(Backend::Cuda, 0));
    }
}

/// The leaf of a running statistic recorded in a pass keeps the value it was recorded with
/// after the pass's update (PyTorch raises on reading a tensor modified in place; here the
/// leaf is the value before): read from the pass's tape, from a tape compiled again (linked:
/// the pass ended by a setting change), and from the pure evaluation (linked).
#[test]
fn a_recorded_leaf_keeps_its_value_after_the_update() {
    fn check<O: Train<T = f32>>(name: &str, rt: Runtime<O>, recompile: fn(&mut O)) {
        let bn = BatchNorm::with(&rt.vars().pp("bn"), 3, 1e-5, MOMENTUM).unwrap();
        for k in 0..PASSES {
            let before = rt.value_of(&bn.running_var).unwrap();
            let x = batch(&DIMS, k).cast::<f32>();
            let leaf = rt
                .record(
                    &bn,
                    true,
                    |g| {
                        bn.forward(&g.input(x)?)?;
                        g.param(&bn.running_var)
                    },
                    |s, r| {
                        let on_tape = s.read(r)?;
                        recompile(s);
                        Ok(vec![on_tape, s.read(r)?, s.value(r)?])
                    },
                )
                .unwrap();
            for (j, v) in leaf.iter().enumerate() {
                assert_eq!(v.data(), before.data(), "{name} pass {k} read {j}");
            }
            assert_ne!(
                rt.value_of(&bn.running_var).unwrap().data(),
                before.data(),
                "{name}: the buffer itself moved"
            );
        }
    }
    fn none<O>(_: &mut O) {}
    fn end_pass(s: &mut tl_session::LinkedSession<f32>) {
        s.set_deterministic(false);
    }
    check("eager cpu", eager::<f32>(Backend::Cpu, 0), none);
    check("eager sim", eager::<f32>(Backend::CudaSim, 0), none);
    check("linked cpu", linked::<f32>(0), end_pass);
    check("linked sim", linked_on(Backend::CudaSim, 0), end_pass);
    #[cfg(feature = "cuda-emu")]
    {
        check("eager cuda-emu", eager::<f32>(Backend::Cuda, 0), none);
        check("linked cuda-emu", linked_on(Backend::Cuda, 0), end_pass);
    }
}

/// In a linked session on a device, after steps that left every parameter newer on the
/// device than on the host, a host write of one parameter during a pass downloads at most
/// that parameter (its leaves keep their recorded value), never the others; the write is what
/// the parameter reads afterwards.
#[test]
fn a_linked_host_write_touches_only_its_parameter() {
    let mut rt = linked_on(Backend::CudaSim, 0);
    let v = rt.vars();
    let (c, f) = (DIMS[1], DIMS[3]);
    let bn = BatchNorm::with(&v.pp("bn"), c, 1e-5, MOMENTUM).unwrap();
    let lin = Linear::new(&v.pp("lin"), f, 64).unwrap();
    let model = tl_nn::Sequential::new().add(bn.clone()).add(lin.clone());
    let mut opt = Optimizer::sgd(0.01).unwrap();
    let x = batch(&DIMS, 0).cast::<f32>();
    for _ in 0..2 {
        rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x.clone())?)?.sum()
        })
        .unwrap();
    }
    for (p, bytes) in [
        (&bn.running_mean, c * 4),
        (lin.bias.as_ref().unwrap(), 64 * 4),
        (&bn.weight, c * 4),
    ] {
        let new = Tensor::from_fn(p.shape().clone(), |i| i as f32 + 0.5);
        let (t, leaf) = rt
            .record(
                &model,
                true,
                |g| {
                    model.forward(&g.input(x.clone())?)?;
                    g.param(p)
                },
                |s, r| {
                    let before = s.traffic().unwrap_or_default();
                    s.set_param(p, new.clone())?;
                    let t = s.traffic().unwrap() - before;
                    Ok((t, s.read(r)?))
                },
            )
            .unwrap();
        assert!(
            t.downloads <= 1 && t.download_bytes <= bytes as u64,
            "{p:?}: at most its own {bytes} bytes: {t:?}"
        );
        assert_ne!(leaf.data(), new.data(), "{p:?}: the leaf keeps its value");
        assert_eq!(rt.value_of(p).unwrap().data(), new.data(), "{p:?}");
    }
}

/// Bad input to `update_running` is an error naming the call and what is wrong, on both
/// sessions and every backend: a parameter that requires grad (as the mean or the variance),
/// the same buffer twice, buffers of two shapes, moments not (2, C), a momentum outside
/// [0, 1], moments of an ended pass; nothing is written.
#[test]
fn update_running_rejects_bad_input() {
    fn check<O: Train>(name: &str, mut rt: Runtime<O>) {
        let bn = BatchNorm::with(&rt.vars().pp("bn"), 3, 1e-5, MOMENTUM).unwrap();
        let bn4 = BatchNorm::with(&rt.vars().pp("bn4"), 4, 1e-5, MOMENTUM).unwrap();
        let x = batch(&DIMS, 0).cast::<O::T>();
        let before = rt.value_of(&bn.running_mean).unwrap();
        let (rm, rv) = (&bn.running_mean, &bn.running_var);
        let mut stale = None;
        let errors = rt
            .record(
                &bn,
                true,
                |g| g.input(x)?.batch_moments(),
                |s, m| {
                    stale = Some(m.clone());
                    let row = s.gather_row(m, 0)?;
                    let count = 120;
                    Ok(vec![
                        s.update_running(&bn.weight, rv, m, MOMENTUM, count),
                        s.update_running(rm, &bn.bias, m, MOMENTUM, count),
                        s.update_running(rm, rm, m, MOMENTUM, count),
                        s.update_running(rm, &bn4.running_var, m, MOMENTUM, count),
                        s.update_running(rm, rv, &row, MOMENTUM, count),
                        s.update_running(rm, rv, m, 1.5, count),
                        s.update_running(rm, rv, m, f64::NAN, count),
                        s.update_running(rm, rv, m, -0.1, count),
                    ])
                },
            )
            .unwrap();
        let texts: Vec<String> = errors
            .into_iter()
            .map(|e| e.expect_err(name).to_string())
            .collect();
        for t in &texts[..2] {
            assert!(t.contains("requires grad"), "{name}: {t}");
        }
        assert!(texts[2].contains("same parameter"), "{name}: {}", texts[2]);
        let shapes = [(3, "[3]", "[4]"), (4, "[2, 3]", "[3]")];
        for (i, a, b) in shapes {
            assert!(
                texts[i].contains(a) && texts[i].contains(b),
                "{name}: {}",
                texts[i]
            );
        }
        for t in &texts[5..] {
            assert!(t.contains("momentum"), "{name}: {t}");
        }
        assert!(
            texts.iter().all(|t| t.contains("update_running")),
            "{name}: {texts:?}"
        );
        // Moments of an ended pass.
        let e = (rt.session_mut())
            .update_running(rm, rv, &stale.unwrap(), MOMENTUM, 120)
            .unwrap_err();
        assert!(matches!(e, Error::StaleHandle { .. }), "{name}: {e}");
        assert_eq!(rt.value_of(rm).unwrap().data(), before.data(), "{name}");
        let ones = [O::T::lit(1.0); 3];
        assert_eq!(rt.value_of(rv).unwrap().data(), &ones[..], "{name}");
    }
    check("eager cpu", eager::<f32>(Backend::Cpu, 0));
    check("eager sim", eager::<f32>(Backend::CudaSim, 0));
    check("linked cpu", linked::<f32>(0));
    check("linked sim", linked_on(Backend::CudaSim, 0));
    #[cfg(feature = "cuda-emu")]
    {
        check("eager cuda-emu", eager::<f32>(Backend::Cuda, 0));
        check("linked cuda-emu", linked_on(Backend::Cuda, 0));
    }
}

/// On a device the update of both running statistics is one kernel launch and two pool
/// allocations (the new mirrors), nothing copied either way; the values are those of the
/// reference rule (`tl_spec::ops::norm::running_update`) applied to the moments, the mean
/// from the first row, the variance from the second made unbiased with the batch's N·H·W,
/// bit for bit, so a kernel that swapped the rows or took another count fails.
#[test]
fn a_device_update_is_one_launch_of_the_reference_rule() {
    use tl_spec::ops::norm::{RunningStat, running_update};
    fn check<O: Train<T = f32>>(name: &str, rt: Runtime<O>) {
        let bn = BatchNorm::with(&rt.vars().pp("bn"), 3, 1e-5, MOMENTUM).unwrap();
        // A first pass leaves the buffers' mirrors on the device.
        let first = batch(&DIMS, 0).cast::<f32>();
        rt.forward_train(&bn, |g| bn.forward(&g.input(first)?))
            .unwrap();
        let old_mean = rt.value_of(&bn.running_mean).unwrap();
        let old_var = rt.value_of(&bn.running_var).unwrap();
        let x = batch(&DIMS, 1).cast::<f32>();
        let count = DIMS.iter().product::<usize>() / 3;
        let (moments, work) = rt
            .record(
                &bn,
                true,
                |g| g.input(x)?.batch_moments(),
                |s, m| {
                    let moments = s.read(m)?;
                    let (t0, u0) = (s.traffic().unwrap(), s.memory_usage().unwrap());
                    s.update_running(&bn.running_mean, &bn.running_var, m, MOMENTUM, count)?;
                    let (t1, u1) = (s.traffic().unwrap(), s.memory_usage().unwrap());
                    Ok((moments, (t1 - t0, u1.alloc_count - u0.alloc_count)))
                },
            )
            .unwrap();
        let (t, allocs) = work;
        assert_eq!(t.launches, 1, "{name}: {t:?}");
        assert_eq!(allocs, 2, "{name}");
        assert_eq!((t.uploads, t.downloads), (0, 0), "{name}: {t:?}");
        let mo = moments.data();
        let rule = |old: f32, s: f32, kind| {
            running_update(f64::from(old), f64::from(s), MOMENTUM, kind) as f32
        };
        let (om, ov) = (old_mean.data(), old_var.data());
        let mean = RunningStat::Mean;
        let want_mean: Vec<f32> = (0..3).map(|k| rule(om[k], mo[k], mean)).collect();
        let var = RunningStat::Variance { count };
        let want_var: Vec<f32> = (0..3).map(|k| rule(ov[k], mo[3 + k], var)).collect();
        let got = (
            rt.value_of(&bn.running_mean).unwrap(),
            rt.value_of(&bn.running_var).unwrap(),
        );
        assert_eq!(bits(got.0.data()), bits(&want_mean), "{name} running_mean");
        assert_eq!(bits(got.1.data()), bits(&want_var), "{name} running_var");
        // The other pairing, or the count of all elements, gives other values.
        let swapped: Vec<f32> = (0..3).map(|k| rule(ov[k], mo[k], var)).collect();
        let all = RunningStat::Variance { count: count * 3 };
        let other_count: Vec<f32> = (0..3).map(|k| rule(ov[k], mo[3 + k], all)).collect();
        assert_ne!(bits(&swapped), bits(&want_var), "{name}");
        assert_ne!(bits(&other_count), bits(&want_var), "{name}");
    }
    check("eager sim", eager::<f32>(Backend::CudaSim, 0));
    check("linked sim", linked_on(Backend::CudaSim, 0));
    #[cfg(feature = "cuda-emu")]
    {
        check("eager cuda-emu", eager::<f32>(Backend::Cuda, 0));
        check("linked cuda-emu", linked_on(Backend::Cuda, 0));
    }
}

/// The eval forward as it was before it read the running statistics where they live: the
/// statistics read back to the host, then −μ and `1/√(var + ε)` (f64, rounded once) uploaded
/// as constants of the pass.
fn eval_with_host_constants<O: Train>(
    rt: &Runtime<O>,
    bn: &BatchNorm,
    x: &Tensor<O::T>,
) -> Tensor<O::T> {
    let (dims, c) = (x.shape().dims().to_vec(), bn.running_mean.shape().numel());
    let r = dims[2..].iter().product::<usize>();
    let rm = rt.value_of(&bn.running_mean).unwrap();
    let rv = rt.value_of(&bn.running_var).unwrap();
    let neg: Vec<O::T> = rm.data().iter().map(|v| -*v).collect();
    let inv: Vec<O::T> = (rv.data().iter())
        .map(|v| O::T::lit(1.0 / (v.as_f64() + bn.eps).sqrt()))
        .collect();
    rt.eval(bn, |g| {
        let to = Shape::new(&[dims[0], c, r, 1]);
        let x4 = g.input(x.clone())?.reshape(&[dims[0], c, r, 1])?;
        fn to_4d<'g, O: Train>(
            v: tl_nn::Var<'g, O>,
            to: &Shape,
        ) -> tl_nn::Result<tl_nn::Var<'g, O>> {
            v.reshape(&[to.dims()[1], 1, 1])?.broadcast_to(to)
        }
        let per_channel = |v| to_4d(v, &to);
        let mean = per_channel(g.constant(Tensor::new([c], neg)?)?)?;
        let inv = per_channel(g.constant(Tensor::new([c], inv)?)?)?;
        let xhat = ((&x4 + &mean)? * inv)?;
        let w = per_channel(g.param(&bn.weight)?)?;
        let b = per_channel(g.param(&bn.bias)?)?;
        ((&xhat * &w)? + b)?.reshape(&dims)
    })
    .unwrap()
}

/// An eval pass reads the running statistics where they live: on a device backend, after
/// training passes, it uploads the batch and downloads the output and nothing else (no
/// statistic read back, none uploaded as a constant), every pass; on every session and
/// backend its output has the bits of the former host-constant recipe.
#[test]
fn an_eval_pass_reads_the_running_statistics_where_they_live() {
    fn check<O: Train>(name: &str, rt: Runtime<O>) {
        let bn = BatchNorm::with(&rt.vars().pp("bn"), DIMS[1], 1e-5, MOMENTUM).unwrap();
        for k in 0..PASSES {
            let x = batch(&DIMS, k).cast::<O::T>();
            rt.forward_train(&bn, |g| bn.forward(&g.input(x)?)).unwrap();
        }
        let x = batch(&DIMS, PASSES).cast::<O::T>();
        let numel: u64 = DIMS.iter().map(|&d| d as u64).product();
        let bytes = numel * 4;
        let mut outs = Vec::new();
        for pass in 0..2 {
            let before = rt.session().traffic();
            outs.push((rt.eval(&bn, |g| bn.forward(&g.input(x.clone())?))).unwrap());
            if let (Some(b), Some(a)) = (before, rt.session().traffic()) {
                let t = a - b;
                let copies = (t.uploads, t.upload_bytes, t.downloads, t.download_bytes);
                assert_eq!(copies, (1, bytes, 1, bytes), "{name} eval {pass}: {t:?}");
            }
        }
        let want = eval_with_host_constants(&rt, &bn, &x);
        for (pass, got) in outs.iter().enumerate() {
            assert_eq!(bits(got.data()), bits(want.data()), "{name} eval {pass}");
        }
        // The running statistics moved: the check is not on the initial (0, 1).
        let rm = rt.value_of(&bn.running_mean).unwrap();
        assert!(rm.data().iter().any(|v| v.as_f64() != 0.0), "{name}");
    }
    on_every_runtime!(check);
}

/// A training step that stops at its loss (non-finite, with `stop_on_non_finite_loss`) or in
/// its closure after the forward leaves BatchNorm's running statistics as they were, as it
/// leaves the parameters (a NaN batch would otherwise poison every later eval); a step that
/// goes on, with the flag or without, updates them by the host rule, as `forward_train` does.
#[test]
fn a_step_stopped_at_its_loss_leaves_the_running_statistics() {
    fn check<O: Train>(name: &str, mut rt: Runtime<O>) {
        let bn = BatchNorm::with(&rt.vars().pp("bn"), DIMS[1], 1e-5, MOMENTUM).unwrap();
        let x = batch(&DIMS, 0).cast::<O::T>();
        let mut nan = x.clone();
        nan.data_mut()[0] = O::T::lit(f64::NAN);
        let stats = |rt: &Runtime<O>| {
            let [m, v] = [&bn.running_mean, &bn.running_var].map(|p| rt.value_of(p).unwrap());
            (bits(m.data()), bits(v.data()))
        };
        let before = stats(&rt);
        let mut stop = Optimizer::sgd(0.1).unwrap().stop_on_non_finite_loss(true);
        let e = rt
            .step(&bn, &mut stop, |g| {
                bn.forward(&g.input(nan.clone())?)?.sum()
            })
            .unwrap_err();
        assert!(e.to_string().contains("NaN"), "{name}: {e}");
        assert_eq!(
            stats(&rt),
            before,
            "{name}: a refused NaN loss moved the statistics"
        );
        let e = rt.step(&bn, &mut stop, |g| {
            let y = bn.forward(&g.input(x.clone())?)?;
            y.reshape(&[7])
        });
        assert!(e.is_err(), "{name}");
        assert_eq!(
            stats(&rt),
            before,
            "{name}: a failed closure moved the statistics"
        );
        // The steps that go on: the host rule from the batch's moments, twice.
        let (c, count) = (DIMS[1], DIMS.iter().product::<usize>() / DIMS[1]);
        let as_4d = [DIMS[0], c, count / DIMS[0], 1];
        let moments = rt
            .forward_train(&bn, |g| {
                g.input(x.clone())?.reshape(&as_4d)?.batch_moments()
            })
            .unwrap();
        // A step whose closure panics (caught by the caller) leaves no deferral behind: the
        // next training forward outside a step updates the statistics at once.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut opt = Optimizer::sgd(0.1).unwrap();
            let _ = rt.step(&bn, &mut opt, |g| {
                bn.forward(&g.input(x.clone())?)?;
                panic!("a planted panic after the forward");
            });
        }));
        assert!(panicked.is_err(), "{name}");
        assert_eq!(
            stats(&rt),
            before,
            "{name}: the panicked step moved the statistics"
        );
        rt.forward_train(&bn, |g| bn.forward(&g.input(x.clone())?))
            .unwrap();
        let once = host_rule(
            moments.data(),
            count,
            (&vec![O::T::lit(0.0); c], &vec![O::T::lit(1.0); c]),
        );
        assert_eq!(
            stats(&rt),
            (bits(&once.0), bits(&once.1)),
            "{name}: forward_train"
        );
        let mut want = once;
        for mut opt in [stop, Optimizer::sgd(0.1).unwrap()] {
            rt.step(&bn, &mut opt, |g| bn.forward(&g.input(x.clone())?)?.sum())
                .unwrap();
            want = host_rule(moments.data(), count, (&want.0, &want.1));
            assert_eq!(stats(&rt), (bits(&want.0), bits(&want.1)), "{name}");
        }
    }
    on_every_runtime!(check);
}
