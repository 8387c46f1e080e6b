//! `check_model` (`tl_conformance::model`) on models of one's own: an MLP (tanh; ReLU with
//! dropout, whose kinks finite differences pass over) and a layer calling a user op pass on
//! every session, a pass and two optimizer steps each; a user op whose VJP forgets a factor
//! fails the finite differences (every session agrees with its wrong rule), one whose CPU
//! kernel is off fails the eager f64 session that runs it (the reference evaluates the op's
//! own value), and one whose CPU VJP kernel is off fails the steps of every f64 session that
//! runs it, eager and linked. The op is `user_ops`' `Cube`.

use tl_conformance::RunConfig;
use tl_conformance::model::{UserModel, check_model};
use tl_ir::UserOpRef;
use tl_nn::{Activation, Dropout, Linear, Module, Scope, Sequential, Var, Vars};
use tl_session::Train;
use tl_spec::Shape;

use crate::user_ops::{Bug, Cube};

fn cfg() -> RunConfig {
    RunConfig::from_env_or(8)
}

/// 6 → 16 → 3, tanh or ReLU between, dropout after the activation when asked.
struct Mlp {
    relu: bool,
    dropout: bool,
}

impl UserModel for Mlp {
    type Model<O: Train> = Sequential<O>;

    fn name(&self) -> String {
        format!(
            "mlp-{}{}",
            if self.relu { "relu" } else { "tanh" },
            if self.dropout { "-dropout" } else { "" }
        )
    }
    fn build<O: Train>(&self, v: &Vars<'_, O>) -> tl_nn::Result<Sequential<O>> {
        let act = if self.relu {
            Activation::Relu
        } else {
            Activation::Tanh
        };
        let mut s = Sequential::new()
            .add(Linear::new(&v.pp(0), 6, 16)?)
            .add(act);
        if self.dropout {
            s = s.add(Dropout::new(0.25)?);
        }
        Ok(s.add(Linear::new(&v.pp(3), 16, 3)?))
    }
    fn inputs(&self) -> Vec<Shape> {
        vec![Shape::new(&[5, 6])]
    }
    fn forward<'g, O: Train>(
        &self,
        m: &Sequential<O>,
        _g: &Scope<'g, O>,
        x: &[Var<'g, O>],
    ) -> tl_nn::Result<Var<'g, O>> {
        m.forward(&x[0])
    }
}

/// `cube(linear(x))`: a layer of one's own calling a user op.
struct CubeLayer(Bug);

impl UserModel for CubeLayer {
    type Model<O: Train> = Linear;

    fn name(&self) -> String {
        format!("cube-{:?}", self.0).to_lowercase()
    }
    fn build<O: Train>(&self, v: &Vars<'_, O>) -> tl_nn::Result<Linear> {
        Linear::new(&v.pp("proj"), 4, 3)
    }
    fn inputs(&self) -> Vec<Shape> {
        vec![Shape::new(&[2, 4])]
    }
    fn forward<'g, O: Train>(
        &self,
        m: &Linear,
        _g: &Scope<'g, O>,
        x: &[Var<'g, O>],
    ) -> tl_nn::Result<Var<'g, O>> {
        m.forward(&x[0])?.user(&UserOpRef::new(Cube(self.0)), &[])
    }
}

#[test]
fn models_of_ones_own_pass_on_every_session() {
    let cfg = cfg();
    for report in [
        check_model(
            &Mlp {
                relu: false,
                dropout: false,
            },
            &cfg,
        ),
        check_model(
            &Mlp {
                relu: true,
                dropout: true,
            },
            &cfg,
        ),
        check_model(&CubeLayer(Bug::None), &cfg),
    ] {
        assert!(report.passed(), "{report}");
        let labels: Vec<&str> = report.reports.iter().map(|r| r.label.as_str()).collect();
        // The emulated CUDA device, eager and linked, a pass and the steps, each forward and
        // with each block's threads reversed.
        let device = if cfg!(feature = "cuda-emu") { 8 } else { 0 };
        assert_eq!(labels.len(), 12 + device, "{labels:?}");
        let cuda = ["eager cuda-f32", "linked cuda-f32"];
        if cfg!(feature = "cuda-emu") {
            for (row, kind) in [(12, "model "), (16, "model step ")] {
                assert!(labels[row].starts_with(kind), "{labels:?}");
                assert!(labels[row].ends_with("eager cuda-emu-f32"), "{labels:?}");
                assert!(
                    labels[row + 2].ends_with("linked cuda-emu-f32"),
                    "{labels:?}"
                );
            }
        } else {
            assert_eq!(report.skipped.len(), 4, "{report}");
            for session in cuda {
                for kind in ["model ", "model step "] {
                    assert!(
                        report
                            .skipped
                            .iter()
                            .any(|s| s.starts_with(kind) && s.contains(&format!("{session}: "))),
                        "{report}"
                    );
                }
            }
        }
        assert!(labels[0].starts_with("model fd "), "{labels:?}");
        let host = [
            "eager cpu-f64",
            "eager cpu-f32",
            "eager cuda-sim-f32",
            "linked f32",
            "linked cuda-sim-f32",
        ];
        for (k, session) in host.iter().enumerate() {
            assert!(labels[1 + k].ends_with(session), "{labels:?}");
            assert!(!labels[1 + k].starts_with("model step "), "{labels:?}");
        }
        for session in host.iter().chain(&["linked f64"]) {
            assert!(
                labels[6..12]
                    .iter()
                    .any(|l| l.starts_with("model step ") && l.ends_with(session)),
                "{labels:?}"
            );
        }
        for r in &report.reports {
            assert_eq!(r.cases, cfg.cases, "{r}");
        }
    }
}

#[test]
fn a_wrong_vjp_fails_the_finite_differences_and_a_wrong_kernel_the_eager_sessions() {
    let cfg = cfg();
    let vjp = check_model(&CubeLayer(Bug::Vjp), &cfg);
    let failed: Vec<&str> = vjp.failures().iter().map(|r| r.label.as_str()).collect();
    assert_eq!(failed, ["model fd cube-vjp"], "{vjp}");
    let msg = vjp.failures()[0].failure.clone().unwrap_or_default();
    assert!(
        msg.contains("the gradient of") && msg.contains("central differences give"),
        "{msg}"
    );

    // Off by one part in 10⁴: the f64 session that runs the kernel fails (below f32's
    // tolerance, the f32 ones may pass); the simulation device runs the op's own value, as the
    // reference does, and the finite differences hold the reference.
    let kernel = check_model(&CubeLayer(Bug::CpuKernel), &cfg);
    let failed: Vec<&str> = kernel.failures().iter().map(|r| r.label.as_str()).collect();
    assert!(
        failed.contains(&"model cube-cpukernel eager cpu-f64"),
        "{kernel}"
    );
    for passed in [
        "model fd cube-cpukernel",
        "model cube-cpukernel eager cuda-sim-f32",
    ] {
        assert!(!failed.contains(&passed), "{kernel}");
    }
    let msg = kernel.failures()[0].failure.clone().unwrap_or_default();
    assert!(msg.contains("the output differs"), "{msg}");
}

/// The steps run the session's own backward and update: a CPU VJP kernel off by one part in
/// 10⁴ fails the steps of the f64 sessions that run it, eager and linked (whose step compiles
/// to the CPU tape), and not the simulation device's (the op's own VJP rule, as the
/// reference's) nor the finite differences.
#[test]
fn a_wrong_cpu_vjp_kernel_fails_the_steps_of_the_sessions_that_run_it() {
    let cfg = cfg();
    let report = check_model(&CubeLayer(Bug::CpuVjp), &cfg);
    let failed: Vec<&str> = report.failures().iter().map(|r| r.label.as_str()).collect();
    for session in ["eager cpu-f64", "linked f64"] {
        assert!(
            failed.contains(&format!("model step cube-cpuvjp {session}").as_str()),
            "{report}"
        );
    }
    for passed in [
        "model fd cube-cpuvjp",
        "model cube-cpuvjp eager cuda-sim-f32",
        "model step cube-cpuvjp eager cuda-sim-f32",
        "model step cube-cpuvjp linked cuda-sim-f32",
    ] {
        assert!(!failed.contains(&passed), "{report}");
    }
    let step = report
        .failures()
        .into_iter()
        .find(|r| r.label == "model step cube-cpuvjp linked f64")
        .and_then(|r| r.failure.clone())
        .unwrap_or_default();
    assert!(
        step.contains("update over 2 steps, over the rate"),
        "{step}"
    );
}

/// A pass with nothing to differentiate (no parameter, no input) fails the finite differences
/// rather than passing without a comparison.
#[test]
fn a_model_with_nothing_to_differentiate_fails_the_finite_differences() {
    struct Constant;
    impl UserModel for Constant {
        type Model<O: Train> = Sequential<O>;
        fn name(&self) -> String {
            "constant".into()
        }
        fn build<O: Train>(&self, _v: &Vars<'_, O>) -> tl_nn::Result<Sequential<O>> {
            Ok(Sequential::new().add(Activation::Tanh))
        }
        fn inputs(&self) -> Vec<Shape> {
            Vec::new()
        }
        fn forward<'g, O: Train>(
            &self,
            m: &Sequential<O>,
            g: &Scope<'g, O>,
            _x: &[Var<'g, O>],
        ) -> tl_nn::Result<Var<'g, O>> {
            m.forward(&g.full(&[3], 0.5)?)
        }
    }
    let report = check_model(&Constant, &cfg());
    let failed: Vec<&str> = report.failures().iter().map(|r| r.label.as_str()).collect();
    assert_eq!(failed, ["model fd constant"], "{report}");
    let msg = report.failures()[0].failure.clone().unwrap_or_default();
    assert!(msg.contains("nothing to differentiate"), "{msg}");
    // No trainable parameter: the steps are skipped, and said.
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.contains("model step constant") && s.contains("nothing to step")),
        "{report}"
    );
    assert!(
        report
            .reports
            .iter()
            .all(|r| !r.label.starts_with("model step ")),
        "{report}"
    );
}
