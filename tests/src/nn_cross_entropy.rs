//! The layer check's `CrossEntropy` entry: `Var::cross_entropy` with `Labels` on the
//! sessions of [`NnSession`], against log-softmax times a one-hot mask.

use std::cell::RefCell;

use proptest::prelude::*;
use tl_ir::{GraphBuilder, Id, Op};
use tl_nn::Runtime;
use tl_session::{Param, TensorRef};
use tl_spec::{Scalar, Tensor};

use crate::checks::reduction_len;
use crate::nn::{LayerSession, NnSession, SessionCheck, close, on_session, values};
use crate::{CaseResult, Tol};

/// A classification case: logits (rows, classes) and labels in `0..classes`.
#[derive(Debug, Clone)]
pub struct CeCase {
    /// Logits.
    pub logits: Tensor<f64>,
    /// Labels.
    pub labels: Vec<usize>,
}

pub(crate) fn ce_cases() -> BoxedStrategy<CeCase> {
    (1usize..=4, 1usize..=5)
        .prop_flat_map(|(rows, classes)| {
            (
                values(vec![rows, classes], -2.0, 2.0),
                prop::collection::vec(0..classes, rows),
            )
        })
        .prop_map(|(logits, labels)| CeCase { logits, labels })
        .boxed()
}

/// `Var::cross_entropy` with `Labels` against `mean_r(logsumexp(x_r) − x_r[label_r])` written
/// with plain ops (log-softmax, a one-hot mask, sum, scale), value and gradient of the logits.
pub(crate) fn ce_case(case: &CeCase, on: NnSession) -> CaseResult {
    on_session(on, case).map_err(|e| format!("CrossEntropy {}: {e}", on.name()))
}

impl SessionCheck for CeCase {
    fn run<O: LayerSession + 'static>(&self, session: O) -> CaseResult {
        ce_run(self, session)
    }
}

fn ce_run<O: LayerSession + 'static>(case: &CeCase, session: O) -> CaseResult {
    let dims = case.logits.shape().dims().to_vec();
    let (rows, classes) = (dims[0], dims[1]);
    let labels = tl_nn::Labels::new(case.labels.clone(), classes).map_err(|e| e.to_string())?;
    let rt = Runtime::new(session);
    let xr: RefCell<Option<TensorRef>> = RefCell::new(None);
    let got = rt
        .record(
            &Vec::<Param>::new(),
            false,
            |g| {
                let x = g.input_grad(case.logits.cast())?;
                *xr.borrow_mut() = Some(x.tensor_ref().clone());
                x.cross_entropy(&labels)
            },
            |s, out| {
                let v = s.read(out)?;
                let x = xr.borrow().clone().into_iter().collect::<Vec<_>>();
                let g = s.seeded_grads(out, Tensor::scalar(O::T::lit(1.0)), &x)?;
                Ok((v, g))
            },
        )
        .map_err(|e| format!("the pass failed: {e}"))?;
    let mut b = GraphBuilder::new();
    let x = b.leaf([rows, classes], None).map_err(|e| e.to_string())?;
    let onehot = Tensor::from_fn([rows, classes], |i| {
        if case.labels[i / classes] == i % classes {
            1.0
        } else {
            0.0
        }
    });
    let build = |b: &mut GraphBuilder| -> tl_ir::Result<Id> {
        let ls = b.apply(Op::LogSoftmax, &[x])?;
        let oh = b.apply(Op::Constant(onehot), &[])?;
        let picked = b.apply(Op::Mul, &[ls, oh])?;
        let s = b.apply(Op::Sum, &[picked])?;
        b.apply(Op::Scale(-1.0 / rows as f64), &[s])
    };
    let out = build(&mut b).map_err(|e| e.to_string())?;
    let graph = b.finish();
    let leaves = [case.logits.clone()];
    let want_v = graph.eval(&leaves, &[]).map_err(|e| e.to_string())?;
    let want_g = graph
        .backprop_all(&leaves, &[], out, &Tensor::scalar(1.0))
        .map_err(|e| e.to_string())?;
    let tol = if O::T::NAME == "f64" {
        Tol::DEFAULT.f64
    } else {
        Tol::DEFAULT.f32_for(reduction_len(&graph))
    };
    let m = close(&got.0, &want_v[out], tol, "loss")?;
    let g = got.1.first().ok_or("no gradient of the logits")?;
    Ok(m.max(close(g, &want_g[0], tol, "gradient of the logits")?))
}
