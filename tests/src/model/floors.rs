//! Tolerance floors of [`super::check_model`]'s f32 rows: what f32 cannot hold whoever
//! computes it, as [`crate::checks::floors`] gives them on random DAGs.
//!
//! A model with a ReLU or a max pool has kinks, and a drawn case can pass within f32's
//! rounding of one: a pre-activation of about 10⁻⁸ that f32 arithmetic makes 0 or negative,
//! a max-pool window whose two largest values f32 orders the other way. There every f32
//! computation, the sessions' and the IR's alike, takes the other branch, and the gradient
//! through it differs from the f64 reference's by the size of the gradient (under
//! `TL_SEED=606 TL_CASES=64` tl-nn's cnn stepped on the eager CPU, the linked CPU and both
//! CUDA-sim sessions to one update, 20% off the reference's at one weight; the f64 reference
//! from parameters moved by one ulp took the same update). So where an f32 session misses the
//! tolerance, each compared tensor's tolerance is raised to at least
//! [`REFERENCE_ERROR_FACTOR`] times the reference's own error there in f32, measured twice:
//! the reference's graphs evaluated and differentiated by the IR in f32 (its steps' updates
//! rounded to f32 too), and the same with every op's value moved by about an ulp
//! ([`Perturbed`]: another rounding of the same ops). Away from a kink the floor stays far
//! under the tolerance, so the check is as tight as before; a session that is wrong fails
//! whatever the floors (a planted VJP off by one part in 10⁴ fails the step rows: the
//! conformance suite's `model::`).

use tl_ir::GraphData;
use tl_session::{LinkedSession, TensorRef};
use tl_spec::{Scalar, Tensor};

use super::{
    ModelCase, Pass, Read, StepReference, UserModel, cotangent, ir_read, reference_pass,
    reference_steps_in, update,
};
use crate::CaseResult;
use crate::checks::{Perturbed, REFERENCE_ERROR_FACTOR, floor_of, reduction_len};

/// The arithmetic the reference's graphs are evaluated and differentiated in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arith {
    /// f64: the reference.
    F64,
    /// f32.
    F32,
    /// f32, every op's value moved by about an ulp ([`Perturbed`]).
    F32Perturbed,
}

impl Arith {
    /// How a pass in this arithmetic is read from the reference's linked session.
    pub(super) fn read(self) -> Read<LinkedSession<f64>> {
        match self {
            Arith::F64 => ir_read,
            Arith::F32 => |s, out, wrt, seed| read_f32(s, out, wrt, seed, false),
            Arith::F32Perturbed => |s, out, wrt, seed| read_f32(s, out, wrt, seed, true),
        }
    }

    /// `x` rounded to this arithmetic.
    pub(super) fn round(self, x: f64) -> f64 {
        match self {
            Arith::F64 => x,
            Arith::F32 | Arith::F32Perturbed => f64::from(x as f32),
        }
    }
}

/// The pass recorded on `s` evaluated and differentiated by the IR in f32 (every op's value
/// moved by about an ulp when `perturb`), cast back to f64.
fn read_f32(
    s: &mut LinkedSession<f64>,
    out: &TensorRef,
    wrt: &[TensorRef],
    seed: u64,
    perturb: bool,
) -> tl_nn::Result<Pass<f64>> {
    let leaves: Vec<Tensor<f32>> = s.leaf_values()?.iter().map(Tensor::cast).collect();
    let nats = s.nats().to_vec();
    let graph = s.graph();
    let moved = match perturb {
        true => Some(
            Perturbed::new(graph, &leaves).ok_or_else(|| tl_nn::Error::Usage {
                what: "check_model",
                detail: "the pass's graph does not rebuild with perturbed values".into(),
            })?,
        ),
        false => None,
    };
    let (g, l): (&GraphData, &[Tensor<f32>]) = match &moved {
        Some(p) => (&p.graph, &p.leaves),
        None => (graph, &leaves),
    };
    let at = |id: usize| moved.as_ref().map_or(id, |p| p.map[id]);
    let values = g.eval(l, &nats)?;
    let value = values
        .get(at(out.id()))
        .ok_or_else(|| tl_nn::Error::Usage {
            what: "check_model",
            detail: format!("the output's id {} is not in the pass's graph", out.id()),
        })?;
    let c: Tensor<f32> = cotangent(value.shape(), seed).cast();
    let grads = g.backprop_values(&values, &nats, at(out.id()), &c)?;
    Ok(Pass {
        value: value.cast(),
        grads: wrt.iter().map(|r| grads[at(r.id())].cast()).collect(),
        reduction: reduction_len(graph),
    })
}

/// `REFERENCE_ERROR_FACTOR` times the larger of two errors of the f32 reference (plain and
/// perturbed) against the f64 one, per compared tensor: `compared(arith)` gives the tensors
/// in `arith`, `want` the f64 ones.
fn floors_of(
    want: &[Tensor<f64>],
    compared: impl Fn(Arith) -> Result<Vec<Tensor<f64>>, String>,
) -> Result<Vec<f64>, String> {
    let mut floors = vec![0.0f64; want.len()];
    for arith in [Arith::F32, Arith::F32Perturbed] {
        for (f, (own, w)) in floors.iter_mut().zip(compared(arith)?.iter().zip(want)) {
            if let Some(e) = floor_of(own, w) {
                *f = f.max(e);
            }
        }
    }
    Ok(floors)
}

/// The floors of a pass row: the output's, then each gradient's (trainable parameters, then
/// inputs), for a session of element type `T` (none for f64: its rounding does not reach a
/// kink the reference's does not).
pub(super) fn pass_floors<M: UserModel, T: Scalar>(
    model: &M,
    case: &ModelCase,
    values: &[Tensor<f64>],
    want: &Pass<f64>,
) -> Result<Vec<f64>, String> {
    if T::NAME == "f64" {
        return Ok(Vec::new());
    }
    let mut tensors = vec![want.value.clone()];
    tensors.extend(want.grads.iter().cloned());
    floors_of(&tensors, |arith| {
        let (run, _) = reference_pass(model, case, values, model.training(), arith)?;
        let mut t = vec![run.value];
        t.extend(run.grads);
        Ok(t)
    })
}

/// The floors of a step row, one per trainable parameter's update over the rate (`at`: where
/// each sits among the parameters), for a session of element type `T` (none for f64).
pub(super) fn step_floors<M: UserModel, T: Scalar>(
    model: &M,
    case: &ModelCase,
    want: &StepReference,
    at: &[usize],
) -> Result<Vec<f64>, String> {
    if T::NAME == "f64" {
        return Ok(Vec::new());
    }
    let updates = |after: &[Tensor<f64>]| {
        at.iter()
            .map(|&k| update(&want.values[k], &after[k]))
            .collect::<Result<Vec<_>, _>>()
    };
    floors_of(&updates(&want.after)?, |arith| {
        updates(&reference_steps_in(model, case, want.values.clone(), arith)?.after)
    })
}

/// `compare` at the row's tolerances (no floors); where it fails, again with each compared
/// tensor's tolerance at least its floor from `floors` (none for an f64 session: the first
/// failure stands).
pub(super) fn judged(
    compare: impl Fn(&[f64]) -> CaseResult,
    floors: impl FnOnce() -> Result<Vec<f64>, String>,
) -> CaseResult {
    let first = match compare(&[]) {
        Ok(m) => return Ok(m),
        Err(e) => e,
    };
    let floors = floors()?;
    if floors.is_empty() {
        return Err(first);
    }
    compare(&floors).map_err(|e| {
        format!(
            "{e}; the tolerance there is at least {REFERENCE_ERROR_FACTOR}× the reference's own \
             error in f32 (the case is not on a kink f32 cannot hold)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::judged;
    use crate::Measured;

    /// Fails where the tolerance, at least the first floor, is under 1.
    fn compare(floors: &[f64]) -> crate::CaseResult {
        let tol = floors.first().map_or(0.5, |&f| f.max(0.5));
        Measured::check(1.0, tol, || "the output differs".into())
    }

    #[test]
    fn floors_are_computed_only_where_the_row_fails_and_only_raise_its_tolerance() {
        let passing = |_: &[f64]| Ok(Measured::ZERO);
        assert!(judged(passing, || panic!("no floors for a passing row")).is_ok());
        assert!(judged(compare, || Ok(vec![2.0])).is_ok());
        let e = judged(compare, || Ok(vec![0.75])).unwrap_err();
        assert!(
            e.contains("the output differs") && e.contains("own error in f32"),
            "{e}"
        );
        // An f64 session has no floors: its first failure stands.
        let e = judged(compare, || Ok(Vec::new())).unwrap_err();
        assert!(!e.contains("own error in f32"), "{e}");
        assert_eq!(
            judged(compare, || Err("the f32 reference failed".into())),
            Err("the f32 reference failed".into())
        );
    }
}
