//! One training loop for both sessions: the digits MLP learns eager (CPU, CUDA sim) and
//! linked with the same code; the reset lives inside the step, so memory stays flat; a handle
//! kept from an earlier pass is an error.

use tl_nn::{CLASSES, Labels, Module, PIXELS, Parameters, Runtime, data};
use tl_session::{Backend, Ops, Optimizer, Train};

use crate::{eager, linked, mlp, tensor};

/// Two epochs of Adam on 512 digits; returns (first-epoch mean loss, last, test accuracy).
fn learn<O: Train>(mut rt: Runtime<O>) -> (f64, f64, f64) {
    let (train, test) = data::digits().unwrap();
    let train = train.truncate(512);
    let model = mlp(&rt, PIXELS, 32, CLASSES);
    let mut opt = Optimizer::adam(1e-2).unwrap();
    let mut epochs = Vec::new();
    for epoch in 0..3 {
        let mut total = 0.0;
        let batches = train.batches::<O::T>(32, CLASSES, epoch).unwrap();
        for (x, labels) in &batches {
            total += rt
                .step(&model, &mut opt, |g| {
                    model.forward(&g.input(x.clone())?)?.cross_entropy(labels)
                })
                .unwrap();
        }
        epochs.push(total / batches.len() as f64);
    }
    let acc = rt
        .accuracy(
            &model,
            &test.features(),
            &test.labels(CLASSES).unwrap(),
            100,
        )
        .unwrap();
    (epochs[0], epochs[2], acc)
}

#[test]
fn the_same_loop_trains_eager_and_linked() {
    let runs = [
        ("eager cpu", learn(eager::<f32>(Backend::Cpu, 0))),
        ("eager cuda-sim", learn(eager::<f32>(Backend::CudaSim, 0))),
        ("linked", learn(linked::<f32>(0))),
    ];
    for (name, (first, last, acc)) in runs {
        assert!(last < 0.5 * first, "{name}: loss {first} → {last}");
        assert!(acc > 0.85, "{name}: test accuracy {acc}");
    }
    // Same seed, same model, same data order: the three agree closely.
    let (a, b, c) = (runs[0].1, runs[1].1, runs[2].1);
    assert!(
        (a.1 - b.1).abs() < 1e-3 && (a.1 - c.1).abs() < 1e-3,
        "{a:?} {b:?} {c:?}"
    );
}

#[test]
fn memory_stays_flat_over_many_steps_on_the_cuda_sim() {
    let mut rt = eager::<f32>(Backend::CudaSim, 0);
    let model = mlp(&rt, 16, 32, 4);
    let x = tensor::<f32>(&[8, 16], 1);
    let labels = Labels::new(vec![0, 1, 2, 3, 3, 2, 1, 0], 4).unwrap();
    let mut opt = Optimizer::momentum(0.05, 0.9).unwrap();
    let mut usage = Vec::new();
    for i in 0..300 {
        rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
        })
        .unwrap();
        if i == 10 || i == 299 {
            usage.push(rt.session().memory_usage().expect("a CUDA backend"));
        }
    }
    let (warm, end) = (usage[0], usage[1]);
    assert_eq!(
        warm.live_buffers(),
        end.live_buffers(),
        "{warm:?} → {end:?}"
    );
    assert_eq!(warm.live_bytes, end.live_bytes);
    assert_eq!(end.live_buffers(), end.alloc_count - end.free_count);
    // Between steps only parameters and optimizer state live: 4 parameters, 4 velocities.
    assert_eq!(end.live_buffers(), 8);
}

/// What a long run holds between steps, after step `step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    /// Tape nodes (0: the step's reset cleared the pass).
    tape: usize,
    /// Optimizer state tensors and their elements.
    state: (usize, usize),
    /// CUDA sim: live buffers (alloc − free), live bytes, and the device's own count of live
    /// buffers; zeros on the CPU.
    device: (u64, usize, usize),
}

/// Issue 14, long runs: 2000 Adam steps of a small MLP hold memory flat after warm-up, on the
/// CPU and on the CUDA simulation device. On the sim, the allocator's live buffers
/// (`alloc_count − free_count`) and bytes do not move after step 10, and agree with the device's
/// own table of live buffers. The CPU backend has no allocator (host tensors are freed when
/// dropped), so what is counted there is what a session keeps between steps: tape nodes (none)
/// and the optimizer's state (a fixed set of tensors).
#[test]
fn memory_stays_flat_over_two_thousand_steps_on_the_cpu_and_the_cuda_sim() {
    for backend in [Backend::Cpu, Backend::CudaSim] {
        let mut rt = eager::<f32>(backend, 0);
        let model = mlp(&rt, 6, 8, 3);
        let x = tensor::<f32>(&[4, 6], 7);
        let labels = Labels::new(vec![0, 1, 2, 1], 3).unwrap();
        let mut opt = Optimizer::adam(1e-3).unwrap();
        let mut held = Vec::new();
        let mut losses = Vec::new();
        for step in 0..2000 {
            let loss = rt
                .step(&model, &mut opt, |g| {
                    model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
                })
                .unwrap();
            losses.push(loss);
            if step >= 10 && (step % 250 == 0 || step == 1999) {
                let s = rt.session();
                let state = s.optimizer_state(&opt).unwrap();
                let device = match s.memory_usage() {
                    Some(u) => {
                        let own = s.device_live_buffers().expect("a device backend");
                        assert_eq!(
                            u.alloc_count - u.free_count,
                            own as u64,
                            "{backend:?} step {step}: the allocator's count disagrees with the device's table: {u:?}"
                        );
                        (u.live_buffers(), u.live_bytes, own)
                    }
                    None => (0, 0, 0),
                };
                held.push(Held {
                    tape: s.tape_len(),
                    state: (state.len(), state.values().map(|t| t.numel()).sum()),
                    device,
                });
            }
        }
        assert_eq!(held.len(), 8, "{backend:?}");
        assert!(
            held.iter().all(|h| *h == held[0]),
            "{backend:?}: what is held between steps moved: {held:?}"
        );
        let h = held[0];
        assert_eq!(h.tape, 0, "{backend:?}: the tape is empty between steps");
        // Adam keeps two moments (and a step count) per parameter: 4 parameters, 6·8 + 8 + 8·3 + 3
        // elements each moment.
        assert!(h.state.0 >= 8, "{backend:?}: {h:?}");
        assert!(
            h.state.1 >= 2 * (6 * 8 + 8 + 8 * 3 + 3),
            "{backend:?}: {h:?}"
        );
        if backend == Backend::CudaSim {
            // Between steps: 4 parameters and their 8 Adam moments live on the device.
            assert_eq!(h.device.0, 12, "{h:?}");
            assert!(h.device.1 > 0, "{h:?}");
        }
        assert!(
            losses.iter().all(|l| l.is_finite()) && losses[1999] < losses[0],
            "{backend:?}: the run trained: {} → {}",
            losses[0],
            losses[1999]
        );
    }
}

/// `Runtime::step` ends its pass with the step, so on the CPU the optimizer writes every
/// parameter in place: each keeps its buffer from step to step (where a step that left the
/// pass open would write a new buffer beside the old values the pass still held), eager and
/// linked, plain SGD and AdamW.
#[test]
fn a_cpu_step_updates_the_parameters_in_place() {
    fn run<O: Train<T = f32>>(mut rt: Runtime<O>, mut opt: Optimizer) {
        let model = mlp(&rt, 6, 8, 3);
        let x = tensor::<f32>(&[4, 6], 7);
        let labels = Labels::new(vec![0, 1, 2, 1], 3).unwrap();
        let mut params = Vec::new();
        model.visit_params(&mut |p| params.push(p.clone()));
        // Where each parameter's values live (the reading clone dropped at once).
        let storage = |rt: &Runtime<O>| -> Vec<usize> {
            (params.iter())
                .map(|p| rt.value_of(p).unwrap().data().as_ptr() as usize)
                .collect()
        };
        let (first, mut values) = (storage(&rt), Vec::new());
        for _ in 0..3 {
            rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
            })
            .unwrap();
            assert_eq!(storage(&rt), first, "{}", opt.rule_name());
            // A copy: a kept clone would share the buffer, and the next update could not
            // write it in place.
            values.push(rt.value_of(&params[0]).unwrap().data().to_vec());
        }
        assert_ne!(values[0], values[2], "the steps moved nothing");
    }
    for make in [
        || Optimizer::sgd(0.1).unwrap(),
        || Optimizer::adamw(0.01).unwrap(),
    ] {
        run(eager::<f32>(Backend::Cpu, 0), make());
        run(linked::<f32>(0), make());
    }
}

#[test]
fn a_handle_from_an_earlier_pass_is_an_error() {
    let mut rt = eager::<f64>(Backend::Cpu, 0);
    let model = mlp(&rt, 3, 4, 2);
    let x = tensor::<f64>(&[2, 3], 5);
    let mut kept = None;
    rt.eval(&model, |g| {
        let y = model.forward(&g.input(x.clone())?)?;
        kept = Some(y.tensor_ref().clone());
        Ok(y)
    })
    .unwrap();
    // The pass ended with a reset: the session refuses the stale handle, saying so.
    let err = rt
        .session_mut()
        .value(&kept.unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("reset"), "{err}");
}

#[test]
fn the_loss_must_be_a_scalar() {
    let mut rt = linked::<f64>(0);
    let model = mlp(&rt, 3, 4, 2);
    let x = tensor::<f64>(&[2, 3], 5);
    let err = rt
        .step(&model, &mut Optimizer::sgd(0.1).unwrap(), |g| {
            model.forward(&g.input(x.clone())?)
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Runtime::step") && err.contains("scalar"),
        "{err}"
    );
    // The runtime is usable afterwards.
    let labels = Labels::new(vec![0, 1], 2).unwrap();
    rt.step(&model, &mut Optimizer::sgd(0.1).unwrap(), |g| {
        model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
    })
    .unwrap();
}

/// gelu of the model's output on `x`.
fn gelu_of<'g, O: Train>(
    model: &tl_nn::Sequential<O>,
    g: &tl_nn::Scope<'g, O>,
    x: &tl_spec::Tensor<O::T>,
) -> tl_nn::Result<tl_nn::Var<'g, O>> {
    model.forward(&g.input(x.clone())?)?.gelu()
}

/// `Runtime::eval` records its pass with gradients off (PyTorch's `torch.no_grad()`): the
/// output has the bits of the same pass recorded with gradients (`Runtime::record`), the CPU
/// tape keeps no workspace for a backward (gelu's tanh term: fewer bytes reach the pool at the
/// reset), and gradients are on again for the next step, which trains. Two runtimes of one
/// seed (the same parameters), each pool fresh.
#[test]
fn an_eval_pass_records_without_gradients() {
    let x = tensor::<f32>(&[32, 6], 3);
    let pass = |record: bool| {
        let mut rt = eager::<f32>(Backend::Cpu, 0);
        let model = mlp(&rt, 6, 16, 8);
        let y = match record {
            true => rt.record(
                &model,
                false,
                |g| gelu_of(&model, g, &x),
                |s, r| Ok(s.read(r)?),
            ),
            false => rt.eval(&model, |g| gelu_of(&model, g, &x)),
        };
        let bits: Vec<u32> = y.unwrap().data().iter().map(|v| v.to_bits()).collect();
        let bytes = rt.session().pool_stats().unwrap().held_bytes;
        assert!(
            rt.session().is_grad_enabled(),
            "gradients are on after the pass"
        );
        let mut params = Vec::new();
        model.visit_params(&mut |p| params.push(p.clone()));
        let before = rt.value_of(&params[0]).unwrap();
        let labels = Labels::new(vec![1; 32], 8).unwrap();
        let mut opt = Optimizer::sgd(0.1).unwrap();
        rt.step(&model, &mut opt, |g| {
            gelu_of(&model, g, &x)?.cross_entropy(&labels)
        })
        .unwrap();
        assert_ne!(
            rt.value_of(&params[0]).unwrap(),
            before,
            "the next step trains"
        );
        (bits, bytes)
    };
    let ((with_bits, with_bytes), (bits, bytes)) = (pass(true), pass(false));
    assert_eq!(bits, with_bits, "the same values");
    assert!(
        bytes < with_bytes,
        "no backward workspace kept: {bytes} vs {with_bytes} bytes"
    );
}

/// A step whose loss depends on nothing trainable (every parameter frozen) is an error naming
/// the cause, as PyTorch's `loss.backward()` is, on both sessions; nothing changes, and the
/// runtime steps again once a parameter is unfrozen.
#[test]
fn a_step_with_nothing_trainable_is_an_error() {
    fn check<O: Train<T = f32>>(mut rt: Runtime<O>, name: &str) {
        let model = mlp(&rt, 6, 8, 3);
        let x = tensor::<f32>(&[4, 6], 5);
        let labels = Labels::new(vec![0, 1, 2, 1], 3).unwrap();
        let mut opt = Optimizer::sgd(0.5).unwrap();
        let before = rt.state_dict(&model).unwrap();
        assert_eq!(rt.set_trainable(&model, "", false).unwrap(), 4);
        let err = rt
            .step(&model, &mut opt, |g| {
                model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
            })
            .unwrap_err();
        assert!(
            err.to_string().contains("does not require grad"),
            "{name}: {err}"
        );
        assert_eq!(
            rt.state_dict(&model).unwrap(),
            before,
            "{name}: nothing stepped"
        );
        assert_eq!(rt.set_trainable(&model, "2.", true).unwrap(), 2);
        rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
        })
        .unwrap();
        assert_ne!(
            rt.state_dict(&model).unwrap(),
            before,
            "{name}: the unfrozen layer steps"
        );
    }
    check(eager::<f32>(Backend::Cpu, 0), "eager");
    check(linked::<f32>(0), "linked");
}
