//! The worked example's user op (`examples/custom_op/op.rs`, the exact GELU) through the public
//! harness call, the planted wrong VJP rejected by it, and a model using the op as a layer
//! taking the same training steps eager on the CPU, linked, and eager on the CUDA sim.

#[path = "../../examples/custom_op/kernel.rs"]
mod kernel;
#[path = "../../examples/custom_op/op.rs"]
mod op;

use tl_conformance::RunConfig;
use tl_conformance::user::check_user_op;
use tl_nn::{Linear, Module, Runtime, Sequential, UserLayer};
use tl_session::{Backend, Optimizer, Train};
use tl_tape_cuda::user::with_device;

use crate::{eager, linked, tensor};

#[test]
fn the_example_op_passes_the_harness_and_its_wrong_twin_does_not() {
    let cfg = RunConfig::from_env_or(32);
    // With its kernels: on the sim their twin (the reference in f32), under `cuda-emu` the
    // kernels themselves on the emulated device, compared with the sim.
    let right = with_device(op::gelu_erf(false), kernel::device_impl());
    let right = check_user_op(&op::entry(right), &cfg);
    // Every row (and every row skipped, with why): the GPU bundle's log shows the device's.
    println!("{right}");
    assert!(right.passed(), "{right}");
    // Where tl-conformance's build cannot run the kernels, it says it skipped them.
    let ran =
        (right.reports.iter()).any(|r| r.label.contains("cuda-emu") || r.label.ends_with(" cuda"));
    assert_eq!(right.skipped.len(), usize::from(!ran), "{right}");
    let summary = if ran {
        " passed, 0 failed"
    } else {
        " passed, 0 failed, 1 skipped"
    };
    assert!(right.summary().ends_with(summary), "{right}");
    #[cfg(feature = "cuda-emu")]
    assert!(
        right.reports.iter().any(|r| r.label.contains("cuda-emu")),
        "{right}"
    );
    let wrong = check_user_op(&op::entry(op::gelu_erf(true)), &cfg);
    let bad: Vec<&str> = wrong.failures().iter().map(|r| r.label.as_str()).collect();
    assert!(
        bad.iter().any(|l| l.starts_with("3 fd")) && bad.iter().any(|l| l.starts_with("4 jvp")),
        "{wrong}"
    );
}

/// Three Adam steps of a 6-5-3 model with the user op as its activation; the losses.
fn losses<O: Train<T = f32>>(mut rt: Runtime<O>) -> Vec<f64> {
    let v = rt.vars();
    let model = Sequential::new()
        .add(Linear::new(&v.pp(0), 6, 5).unwrap())
        .add(UserLayer(with_device(
            op::gelu_erf(false),
            kernel::device_impl(),
        )))
        .add(Linear::new(&v.pp(2), 5, 3).unwrap());
    let mut opt = Optimizer::adam(1e-2).unwrap();
    let x = tensor::<f32>(&[4, 6], 11);
    let y = tensor::<f32>(&[4, 3], 12);
    (0..3)
        .map(|_| {
            rt.step(&model, &mut opt, |g| {
                let out = model.forward(&g.input(x.clone())?)?;
                out.mse_loss(&g.input(y.clone())?)
            })
            .unwrap()
        })
        .collect()
}

#[test]
fn a_model_with_the_user_op_trains_the_same_eager_linked_and_on_the_sim() {
    let cpu = losses(eager::<f32>(Backend::Cpu, 3));
    let lin = losses(linked::<f32>(3));
    let sim = losses(eager::<f32>(Backend::CudaSim, 3));
    assert!(cpu[2] < cpu[0], "the loss goes down: {cpu:?}");
    for (a, b) in cpu.iter().zip(&lin) {
        assert!(
            (a - b).abs() <= 1e-6 * a.abs().max(1.0),
            "eager {cpu:?} linked {lin:?}"
        );
    }
    for (a, b) in cpu.iter().zip(&sim) {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "cpu {cpu:?} sim {sim:?}"
        );
    }
}
