//! Pure reverse-mode accumulation over every id (TorchLean's `backpropAll`).

use smallvec::SmallVec;
use tl_spec::{Scalar, Tensor};

use crate::{Error, GraphData, Id, Result, rules};

impl GraphData {
    /// Dense gradients of `out` (with cotangent `seed`) for every id, evaluating the graph first
    /// with leaf values `leaves` and Nat environment `nats`.
    ///
    /// Ids that do not require grad (see [`GraphData::requires_grad`]) receive no contributions
    /// (their entry stays zero, except `out` itself, which holds `seed`), exactly as on the tapes.
    /// Nodes that no contribution reaches (not on a path to `out`) are skipped, as on the tapes:
    /// their VJP is not evaluated, so a zero cotangent never meets an infinite local derivative
    /// (`0 · ∞ = NaN`) off the path.
    pub fn backprop_all<T: Scalar>(
        &self,
        leaves: &[Tensor<T>],
        nats: &[usize],
        out: Id,
        seed: &Tensor<T>,
    ) -> Result<Vec<Tensor<T>>> {
        let values = self.eval(leaves, nats)?;
        self.backprop_values(&values, nats, out, seed)
    }

    /// Like [`GraphData::backprop_all`], from already evaluated `values` (one per id).
    pub fn backprop_values<T: Scalar>(
        &self,
        values: &[Tensor<T>],
        nats: &[usize],
        out: Id,
        seed: &Tensor<T>,
    ) -> Result<Vec<Tensor<T>>> {
        if values.len() != self.len() {
            return Err(Error::Count {
                what: "backprop_all",
                expected: self.len(),
                got: values.len(),
            });
        }
        self.check_id("backprop_all", out)?;
        let out_shape = self.shape(out)?;
        if seed.shape() != out_shape {
            return Err(Error::ShapeMismatch {
                what: "backprop_all seed",
                id: out,
                expected: out_shape.clone(),
                got: seed.shape().clone(),
            });
        }
        let rg = self.requires_grad();
        let mut grads: Vec<Tensor<T>> = (0..self.len())
            .map(|id| Ok(Tensor::try_zeros("backprop", self.shape(id)?.clone())?))
            .collect::<Result<_>>()?;
        grads[out] = seed.clone();
        // Whether some cotangent has reached the id (the seed reaches `out`).
        let mut reached = vec![false; self.len()];
        reached[out] = true;
        let nl = self.num_leaves();
        for (k, node) in self.nodes().iter().enumerate().rev() {
            let id = nl + k;
            // An empty value sends nothing to its operands: a VJP is linear in the cotangent, which
            // has no element here (and the rule's loops over the operands' dims could run for
            // hours on an empty [2⁶², 0]).
            if id > out || !rg[id] || !reached[id] || grads[id].numel() == 0 {
                continue;
            }
            let args: SmallVec<[&Tensor<T>; 3]> = node.args().iter().map(|&a| &values[a]).collect();
            let contribs = rules::vjp(node.op(), &args, &grads[id], nats)?;
            for (&a, c) in node.args().iter().zip(contribs) {
                if let Some(c) = c
                    && rg[a]
                {
                    grads[a].add_assign(&c)?;
                    reached[a] = true;
                }
            }
        }
        Ok(grads)
    }
}
