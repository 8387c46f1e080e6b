//! BatchNorm's running statistics from `batchMoments` (the per-channel moments computed where
//! the data lives): the same values as the host computation they replaced (the mean and the
//! unbiased variance in f64 over the input read back), on every session and backend, and on a
//! CUDA backend a training pass reads back 2·C values per layer, never the input.

use tl_nn::{BatchNorm, Module, Runtime};
use tl_session::{Backend, Optimizer, Train};
use tl_spec::{Scalar, Tensor};

use crate::{eager, linked};

/// (N, C, H, W) of the batches.
const DIMS: [usize; 4] = [4, 3, 5, 6];
const MOMENTUM: f64 = 0.1;

/// Batch `k`: per channel a different mean and spread, so every statistic is exercised.
fn batch(dims: &[usize], k: usize) -> Tensor<f64> {
    let (c, r) = (dims[1], dims[2..].iter().product::<usize>());
    Tensor::from_fn(dims, |i| {
        let ch = (i / r) % c;
        let u = ((i * 37 + k * 11) % 23) as f64 / 23.0 - 0.5;
        (ch as f64 + 1.0) * (0.5 + k as f64) * u + ch as f64 - 1.0
    })
}

/// The host computation `BatchNorm::update_running` made before `batchMoments`: the mean and
/// the unbiased variance of each channel of x in f64, PyTorch's momentum rule, one element
/// per channel keeping the old variance.
fn host_update(x: &Tensor<f64>, old: (&[f64], &[f64])) -> (Vec<f64>, Vec<f64>) {
    let d = x.shape().dims();
    let (n, c, r) = (d[0], d[1], d[2..].iter().product::<usize>());
    let count = n * r;
    let (mut mean, mut var) = (old.0.to_vec(), old.1.to_vec());
    for ch in 0..c {
        let vals = (0..n).flat_map(|b| x.data()[(b * c + ch) * r..(b * c + ch + 1) * r].iter());
        let m = vals.clone().sum::<f64>() / count as f64;
        let ss: f64 = vals.map(|v| (v - m) * (v - m)).sum();
        mean[ch] = (1.0 - MOMENTUM) * mean[ch] + MOMENTUM * m;
        if count > 1 {
            var[ch] = (1.0 - MOMENTUM) * var[ch] + MOMENTUM * ss / (count - 1) as f64;
        }
    }
    (mean, var)
}

/// Two training passes of a BatchNorm on `dims`-shaped batches in `rt`: its running mean and
/// variance after each, beside the host computation's on the same (rounded) inputs.
fn passes<O: Train>(rt: &Runtime<O>, dims: &[usize]) -> Vec<[(Vec<f64>, Vec<f64>); 2]> {
    let name = format!(
        "bn{}",
        dims.iter().map(|d| d.to_string()).collect::<String>()
    );
    let bn = BatchNorm::with(&rt.vars().pp(&name), dims[1], 1e-5, MOMENTUM).unwrap();
    let f64s = |t: Tensor<O::T>| t.data().iter().map(|v| v.as_f64()).collect::<Vec<_>>();
    let mut want = (vec![0.0; dims[1]], vec![1.0; dims[1]]);
    let mut out = Vec::new();
    for k in 0..2 {
        let x = batch(dims, k).cast::<O::T>();
        rt.forward_train(&bn, |g| bn.forward(&g.input(x.clone())?))
            .unwrap();
        want = host_update(&x.cast(), (&want.0, &want.1));
        let got = (
            f64s(rt.value_of(&bn.running_mean).unwrap()),
            f64s(rt.value_of(&bn.running_var).unwrap()),
        );
        out.push([got, want.clone()]);
    }
    out
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    for (k, (a, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - w).abs() <= tol * w.abs().max(1.0),
            "{what}[{k}]: {a} vs the host computation's {w} (tolerance {tol})"
        );
    }
}

/// The running statistics equal the host computation: to 1e-12 in f64 (the same sums in
/// another order), to 1e-5 relative in f32 (sums of 120 f32 terms against f64 ones; the
/// statistics are O(1)), on the CPU tape, the simulation device and (feature `cuda-emu`) the
/// CUDA device over the emulated kernels, eager and linked.
#[test]
fn running_statistics_equal_the_host_computation() {
    fn check<O: Train>(name: &str, rt: Runtime<O>, tol: f64) {
        for dims in [&DIMS[..], &[2, 3, 4], &[1, 2, 1, 1]] {
            for (k, [got, want]) in passes(&rt, dims).iter().enumerate() {
                let at = format!("{name} {dims:?} pass {k}");
                close(&format!("{at} running_mean"), &got.0, &want.0, tol);
                close(&format!("{at} running_var"), &got.1, &want.1, tol);
            }
        }
    }
    check("eager cpu f64", eager::<f64>(Backend::Cpu, 0), 1e-12);
    check("eager cpu f32", eager::<f32>(Backend::Cpu, 0), 1e-5);
    check("eager sim", eager::<f32>(Backend::CudaSim, 0), 1e-5);
    check("linked f64", linked::<f64>(0), 1e-12);
    check("linked f32", linked::<f32>(0), 1e-5);
    check("linked sim", linked_on(Backend::CudaSim), 1e-5);
    #[cfg(feature = "cuda-emu")]
    {
        check("eager cuda-emu", eager::<f32>(Backend::Cuda, 0), 1e-5);
        check("linked cuda-emu", linked_on(Backend::Cuda), 1e-5);
    }
}

/// One element per channel (N = H = W = 1): the mean moves, the variance stays exactly.
#[test]
fn a_single_element_per_channel_keeps_the_running_variance() {
    fn check<O: Train>(name: &str, rt: Runtime<O>) {
        for [got, want] in passes(&rt, &[1, 3, 1, 1]) {
            assert_eq!(got.1, vec![1.0; 3], "{name}");
            close(name, &got.0, &want.0, 1e-6);
        }
    }
    check("eager cpu", eager::<f32>(Backend::Cpu, 0));
    check("eager sim", eager::<f32>(Backend::CudaSim, 0));
    check("linked sim", linked_on(Backend::CudaSim));
}

fn linked_on(backend: Backend) -> Runtime<tl_session::LinkedSession<f32>> {
    let mut rt = linked::<f32>(0);
    rt.session_mut().set_backend(backend).unwrap();
    rt
}

/// The traffic of the third SGD step of `Sequential(BatchNorm, BatchNorm)` on batch (N, C, H,
/// W), loss the sum of the output.
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
    for _ in 0..3 {
        let before = rt.session().traffic().unwrap_or_default();
        rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x.clone())?)?.sum()
        })
        .unwrap();
        last = Some(rt.session().traffic().unwrap() - before);
    }
    last.unwrap()
}

/// On a device backend a training step reads back the loss and, per batch norm, O(C) values,
/// never its (N, C, H, W) input (360 values each here): each layer's 2·C moments. The linked
/// session also reads back every trainable parameter once a step (here each layer's weight
/// and bias, C each): writing the new running statistics from the host mid-pass syncs the
/// pass's device-updated leaves first (`LinkedSession::set_param`). The eager session uploads
/// the batch and each layer's 2·C new running statistics.
#[test]
fn a_device_training_pass_reads_back_the_moments_not_the_input() {
    const LAYERS: u64 = 2;
    let c = DIMS[1] as u64;
    let numel: u64 = DIMS.iter().map(|&d| d as u64).product();
    fn check<O: Train<T = f32>>(name: &str, mut rt: Runtime<O>, per_layer: [u64; 2]) {
        let t = step_traffic(&mut rt);
        let numel: u64 = DIMS.iter().map(|&d| d as u64).product();
        assert_eq!(
            (t.downloads, t.download_bytes),
            (1 + LAYERS * per_layer[0], 4 + LAYERS * per_layer[1]),
            "{name}: the loss and O(C) values per layer: {t:?}"
        );
        assert!(t.download_bytes < numel * 4, "{name}: {t:?}");
    }
    let eager_layer = [1, 2 * c * 4];
    let linked_layer = [3, 4 * c * 4];
    check("eager sim", eager::<f32>(Backend::CudaSim, 0), eager_layer);
    let t = step_traffic(&mut eager::<f32>(Backend::CudaSim, 0));
    assert_eq!(
        (t.uploads, t.upload_bytes),
        (1 + 2 * LAYERS, numel * 4 + LAYERS * 2 * c * 4),
        "eager sim: the batch and each layer's running statistics: {t:?}"
    );
    check("linked sim", linked_on(Backend::CudaSim), linked_layer);
    #[cfg(feature = "cuda-emu")]
    {
        check(
            "eager cuda-emu",
            eager::<f32>(Backend::Cuda, 0),
            eager_layer,
        );
        check("linked cuda-emu", linked_on(Backend::Cuda), linked_layer);
    }
}
