//! The harness from outside the workspace: what a user who depends on `tl-conformance` by
//! version writes to hold an op and a model of their own to the reference. `softsign`
//! (`x / (1 + |x|)`, PyTorch's `F.softsign`), written here, goes through `check_user_op` (every
//! check the catalogue's ops get); a digits-shaped MLP calling it goes through `check_model`
//! (its gradients against finite differences, a pass and two training steps on every session).
//! A wrong VJP fails both.

use tl_conformance::RunConfig;
use tl_conformance::model::{UserModel, check_model};
use tl_conformance::user::{UserEntry, check_user_op};
use tl_ir::{UserOp, UserOpRef};
use tl_nn::{Linear, Module, Scope, Sequential, UserLayer, Var, Vars};
use tl_session::Train;
use tl_spec::{Scalar, Shape, Tensor};

/// `x / (1 + |x|)`, its derivative `1 / (1 + |x|)²`; `wrong` forgets the square.
struct Softsign {
    wrong: bool,
}

impl Softsign {
    /// The derivative at `v`.
    fn slope<T: Scalar>(&self, v: T) -> T {
        let d = T::one() + v.abs();
        if self.wrong {
            T::one() / d
        } else {
            T::one() / (d * d)
        }
    }
}

impl UserOp for Softsign {
    fn name(&self) -> &'static str {
        if self.wrong {
            "softsign_wrong"
        } else {
            "softsign"
        }
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        Ok(s[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        Ok(x[0].map(|v| v / (T::one() + v.abs())))
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(
            x[0].zip_map("softsign", g, |v, g| g * self.slope(v))?,
        )])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map("softsign", dx[0], |v, d| d * self.slope(v))
    }
}

/// 64 → 32 → softsign → 10 on a batch of 8 digits-sized inputs.
struct Mlp {
    wrong: bool,
}

impl UserModel for Mlp {
    type Model<O: Train> = Sequential<O>;

    fn name(&self) -> String {
        format!("mlp-{}", Softsign { wrong: self.wrong }.name())
    }
    fn build<O: Train>(&self, v: &Vars<'_, O>) -> tl_nn::Result<Sequential<O>> {
        Ok(Sequential::new()
            .add(Linear::new(&v.pp(0), 64, 32)?)
            .add(UserLayer(UserOpRef::new(Softsign { wrong: self.wrong })))
            .add(Linear::new(&v.pp(2), 32, 10)?))
    }
    fn inputs(&self) -> Vec<Shape> {
        vec![Shape::new(&[8, 64])]
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

fn cfg() -> RunConfig {
    RunConfig::from_env_or(8)
}

#[test]
fn softsign_passes_every_check() {
    let entry = UserEntry::elementwise(UserOpRef::new(Softsign { wrong: false }));
    let report = check_user_op(&entry, &cfg());
    println!("{report}");
    assert!(report.passed(), "{report}");
}

#[test]
fn an_mlp_calling_softsign_passes_check_model() {
    let report = check_model(&Mlp { wrong: false }, &cfg());
    println!("{report}");
    assert!(report.passed(), "{report}");
}

#[test]
fn a_wrong_vjp_fails_the_op_check_and_the_model_check() {
    let op = check_user_op(
        &UserEntry::elementwise(UserOpRef::new(Softsign { wrong: true })),
        &cfg(),
    );
    assert!(!op.passed(), "{op}");
    let model = check_model(&Mlp { wrong: true }, &cfg());
    let failed: Vec<&str> = model.failures().iter().map(|r| r.label.as_str()).collect();
    assert_eq!(failed, ["model fd mlp-softsign_wrong"], "{model}");
}
