//! Gradient accumulation (`Runtime::step_accumulated`): one micro-batch is `Runtime::step` bit
//! for bit; equal micro-batches under a mean loss step like their union (the same parameters
//! and optimizer state, to the rounding of the sum), on every session; bad passes change
//! nothing.

use tl_nn::{Module, Runtime, Sequential};
use tl_session::{Backend, Optimizer, Train};
use tl_spec::{Scalar, Tensor};

use crate::{eager, linked, max_diff, mlp, tensor};

/// Rows `rows` of the batch (8, 5) and their targets (8, 3).
fn batch<T: Scalar>(rows: std::ops::Range<usize>) -> (Tensor<T>, Tensor<T>) {
    let (x, y) = (tensor::<T>(&[8, 5], 1), tensor::<T>(&[8, 3], 2));
    let pick = |t: &Tensor<T>, w: usize| {
        Tensor::new(
            [rows.len(), w],
            t.data()[rows.start * w..rows.end * w].to_vec(),
        )
        .unwrap()
    };
    (pick(&x, 5), pick(&y, 3))
}

/// The parameters after three steps of momentum SGD from seed 3, each step on the whole batch
/// (`micro` = None) or on `micro` equal parts of it, and the losses the steps returned.
fn train<O: Train>(mut rt: Runtime<O>, micro: Option<usize>) -> (Vec<Tensor<O::T>>, Vec<f64>) {
    let model: Sequential<O> = mlp(&rt, 5, 4, 3);
    let mut opt = Optimizer::momentum(0.1, 0.9).unwrap();
    let mut losses = Vec::new();
    for _ in 0..3 {
        let l = match micro {
            None => rt.step(&model, &mut opt, |g| {
                let (x, y) = batch::<O::T>(0..8);
                model.forward(&g.input(x)?)?.mse_loss(&g.input(y)?)
            }),
            Some(k) => rt.step_accumulated(&model, &mut opt, k, |g, i| {
                let n = 8 / k;
                let (x, y) = batch::<O::T>(i * n..(i + 1) * n);
                model.forward(&g.input(x)?)?.mse_loss(&g.input(y)?)
            }),
        };
        losses.push(l.unwrap());
    }
    assert_eq!(opt.steps_done(), 3, "one optimizer step per call");
    let params = rt
        .named_params_of(&model)
        .iter()
        .map(|(_, p)| rt.value_of(p).unwrap())
        .collect();
    (params, losses)
}

fn bits<T: Scalar>(ts: &[Tensor<T>]) -> Vec<Vec<u64>> {
    ts.iter()
        .map(|t| t.data().iter().map(|v| v.as_f64().to_bits()).collect())
        .collect()
}

#[test]
fn one_micro_batch_is_a_step_bit_for_bit() {
    let (a, la) = train(eager::<f32>(Backend::Cpu, 3), None);
    let (b, lb) = train(eager::<f32>(Backend::Cpu, 3), Some(1));
    assert_eq!((bits(&a), la), (bits(&b), lb));
    let (a, la) = train(eager::<f32>(Backend::CudaSim, 3), None);
    let (b, lb) = train(eager::<f32>(Backend::CudaSim, 3), Some(1));
    assert_eq!((bits(&a), la), (bits(&b), lb));
    let (a, la) = train(linked::<f32>(3), None);
    let (b, lb) = train(linked::<f32>(3), Some(1));
    assert_eq!((bits(&a), la), (bits(&b), lb));
}

#[test]
fn equal_micro_batches_step_like_their_union() {
    fn close<T: Scalar>(a: &[Tensor<T>], b: &[Tensor<T>], tol: f64) {
        for (x, y) in a.iter().zip(b) {
            let d = max_diff(x, y);
            assert!(d <= tol, "parameters differ by {d}");
        }
    }
    let (whole, whole_losses) = train(eager::<f64>(Backend::Cpu, 3), None);
    let (whole_sim, _) = train(eager::<f32>(Backend::CudaSim, 3), None);
    for k in [2, 4, 8] {
        let (b, losses) = train(eager::<f64>(Backend::Cpu, 3), Some(k));
        close(&whole, &b, 1e-12);
        // The mean of the micro-batches' mean losses is the whole batch's mean loss.
        for (x, y) in whole_losses.iter().zip(&losses) {
            assert!(
                (x - y).abs() <= 1e-12,
                "losses {whole_losses:?} vs {losses:?}"
            );
        }
        close(&whole, &train(linked::<f64>(3), Some(k)).0, 1e-12);
        close(
            &whole_sim,
            &train(eager::<f32>(Backend::CudaSim, 3), Some(k)).0,
            1e-5,
        );
    }
    // The first step alone moves the parameters by far more than these tolerances, so a sum in
    // place of the mean (or a lost micro-batch) fails them.
    let first = {
        let mut rt = eager::<f64>(Backend::Cpu, 3);
        let model: Sequential<_> = mlp(&rt, 5, 4, 3);
        let weight = rt.named_params_of(&model)[0].1.clone();
        let init = rt.value_of(&weight).unwrap();
        let mut opt = Optimizer::momentum(0.1, 0.9).unwrap();
        rt.step(&model, &mut opt, |g| {
            let (x, y) = batch::<f64>(0..8);
            model.forward(&g.input(x)?)?.mse_loss(&g.input(y)?)
        })
        .unwrap();
        max_diff(&init, &rt.value_of(&weight).unwrap())
    };
    assert!(first > 1e-4, "the first step moved the weight by {first}");
}

#[test]
fn a_failing_micro_batch_changes_nothing() {
    let mut rt = eager::<f64>(Backend::Cpu, 3);
    let model: Sequential<_> = mlp(&rt, 5, 4, 3);
    let values = |rt: &Runtime<_>| -> Vec<Tensor<f64>> {
        (rt.named_params_of(&model).iter())
            .map(|(_, p)| rt.value_of(p).unwrap())
            .collect()
    };
    let before = values(&rt);
    let mut opt = Optimizer::adam(0.01).unwrap().stop_on_non_finite_loss(true);
    let err = rt
        .step_accumulated(&model, &mut opt, 0, |g, _| g.full(&[], 0.0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least one micro-batch, got 0"), "{err}");
    // A NaN loss in the second of three micro-batches; then a forward error in the last.
    for bad in [1, 2] {
        let err = rt
            .step_accumulated(&model, &mut opt, 3, |g, i| {
                let (x, y) = batch::<f64>(0..4);
                let l = model.forward(&g.input(x)?)?.mse_loss(&g.input(y)?)?;
                match (i == bad, bad) {
                    (true, 1) => l.scale(f64::NAN),
                    (true, _) => model.forward(&g.input(Tensor::zeros([2, 7]))?),
                    _ => Ok(l),
                }
            })
            .unwrap_err()
            .to_string();
        let want = if bad == 1 { "NaN" } else { "Linear" };
        assert!(err.contains(want), "{err}");
        assert_eq!(values(&rt), before);
        assert_eq!(opt.steps_done(), 0);
    }
    // The next call steps as usual.
    rt.step_accumulated(&model, &mut opt, 2, |g, i| {
        let (x, y) = batch::<f64>(4 * i..4 * i + 4);
        model.forward(&g.input(x)?)?.mse_loss(&g.input(y)?)
    })
    .unwrap();
    assert_eq!(opt.steps_done(), 1);
    assert_ne!(values(&rt), before);
}

/// Micro-batch i of the batch through `bn`, summed.
fn bn_pass<'g, O: Train<T = f64>>(
    bn: &tl_nn::BatchNorm,
    g: &tl_nn::Scope<'g, O>,
    i: usize,
) -> tl_nn::Result<tl_nn::Var<'g, O>> {
    let (x, _) = batch::<f64>(4 * i..4 * i + 4);
    bn.forward(&g.input(x)?)?.sum()
}

/// BatchNorm's running statistics move once per micro-batch: after an accumulated step of two
/// micro-batches they are those of two training passes over the same micro-batches.
#[test]
fn batch_norm_statistics_move_once_per_micro_batch() {
    let stats = |accumulate: bool| {
        let mut rt = eager::<f64>(Backend::Cpu, 3);
        let bn = tl_nn::BatchNorm::new(&rt.vars().pp("bn"), 5).unwrap();
        let mut opt = Optimizer::sgd(0.1).unwrap();
        if accumulate {
            rt.step_accumulated(&bn, &mut opt, 2, |g, i| bn_pass(&bn, g, i))
                .unwrap();
        } else {
            for i in 0..2 {
                rt.forward_train(&bn, |g| bn_pass(&bn, g, i)).unwrap();
            }
        }
        let (mean, var) = (&bn.running_mean, &bn.running_var);
        (rt.value_of(mean).unwrap(), rt.value_of(var).unwrap())
    };
    assert_eq!(stats(true), stats(false));
}

/// On the CUDA device (`cuda-emu`: the emulated kernels) the micro-batches' sum stays in device
/// memory: an accumulated step of k passes makes k times a plain step's host↔device copies (each
/// pass's part of the batch up, its loss down) and no other, where the simulation device, whose sum is on
/// the host, downloads the gradients too; both give the same parameters and losses, bit for
/// bit, on the eager and the linked session. A failing last pass leaves no buffer of the sum
/// behind.
#[cfg(feature = "cuda-emu")]
#[test]
fn on_the_cuda_device_the_sum_stays_in_device_memory() {
    use tl_tape_cuda::Traffic;

    const K: usize = 4;
    /// Three accumulated steps of K micro-batches: the parameters' bits, the losses, and the
    /// copies of a plain step beside those of the last accumulated one.
    fn run<O: Train<T = f32>>(mut rt: Runtime<O>) -> (Vec<Vec<u64>>, Vec<f64>, [Traffic; 2]) {
        let model: Sequential<O> = mlp(&rt, 5, 4, 3);
        let mut opt = Optimizer::momentum(0.1, 0.9).unwrap();
        let copies = |rt: &Runtime<O>| rt.session().traffic().unwrap();
        let mut step = |rt: &mut Runtime<O>| {
            rt.step(&model, &mut opt, |g| {
                let (x, y) = batch::<f32>(0..8);
                model.forward(&g.input(x)?)?.mse_loss(&g.input(y)?)
            })
            .unwrap();
        };
        // The first step puts the parameters on the device (the linked session's device is
        // made then); the second is what a step copies.
        step(&mut rt);
        let before = copies(&rt);
        step(&mut rt);
        let plain = copies(&rt) - before;
        let (mut losses, mut last) = (Vec::new(), Traffic::default());
        for _ in 0..3 {
            let before = copies(&rt);
            let l = rt.step_accumulated(&model, &mut opt, K, |g, i| pass(&model, g, i));
            losses.push(l.unwrap());
            last = copies(&rt) - before;
        }
        let params: Vec<_> = (rt.named_params_of(&model).iter())
            .map(|(_, p)| rt.value_of(p).unwrap())
            .collect();
        (bits(&params), losses, [plain, last])
    }
    /// Micro-batch i of four (two rows of the batch) through `model`, its mean squared error.
    fn pass<'g, O: Train<T = f32>>(
        model: &Sequential<O>,
        g: &tl_nn::Scope<'g, O>,
        i: usize,
    ) -> tl_nn::Result<tl_nn::Var<'g, O>> {
        let (x, y) = batch::<f32>(2 * i..2 * i + 2);
        model.forward(&g.input(x)?)?.mse_loss(&g.input(y)?)
    }
    let copies = |t: &Traffic| (t.uploads, t.upload_bytes, t.downloads, t.download_bytes);
    // K passes of a quarter of the batch each: K times the copies (each pass's batch up, its
    // loss down), the same batch bytes.
    let k = K as u64;
    let k_passes = |t: &Traffic| {
        (
            t.uploads * k,
            t.upload_bytes,
            t.downloads * k,
            t.download_bytes * k,
        )
    };
    for (at, sim, cuda) in [
        (
            "eager",
            run(eager::<f32>(Backend::CudaSim, 3)),
            run(eager::<f32>(Backend::Cuda, 3)),
        ),
        (
            "linked",
            run(crate::linked_on(Backend::CudaSim, 3)),
            run(crate::linked_on(Backend::Cuda, 3)),
        ),
    ] {
        let [sim_plain, sim_acc] = sim.2;
        // The sim's sum is on the host: its passes download the gradients as well.
        assert!(
            sim_acc.downloads > K as u64 * sim_plain.downloads,
            "{at}: {sim_acc:?}"
        );
        let [plain, acc] = cuda.2;
        assert_eq!(
            copies(&acc),
            k_passes(&plain),
            "{at}: an accumulated step's copies {acc:?}, a plain step's {plain:?}"
        );
        assert_eq!((&cuda.0, &cuda.1), (&sim.0, &sim.1), "{at}: the sim's bits");
    }

    // The last pass fails: the step is an error, the sum's buffers go back.
    let mut rt = eager::<f32>(Backend::Cuda, 3);
    let model: Sequential<_> = mlp(&rt, 5, 4, 3);
    let mut opt = Optimizer::sgd(0.1).unwrap();
    let live = |rt: &Runtime<tl_session::Session<f32>>| {
        let m = rt.session().memory_usage().unwrap();
        (m.live_buffers(), m.live_bytes)
    };
    // A step first: the parameters' device buffers are made.
    rt.step_accumulated(&model, &mut opt, 3, |g, i| pass(&model, g, i))
        .unwrap();
    let before = live(&rt);
    let err = rt.step_accumulated(&model, &mut opt, 3, |g, i| match i {
        2 => model.forward(&g.input(Tensor::zeros([2, 7]))?),
        _ => pass(&model, g, i),
    });
    let err = err.unwrap_err().to_string();
    assert!(err.contains("Linear"), "{err}");
    assert_eq!(
        live(&rt),
        before,
        "the device's live buffers (count, bytes)"
    );
}
