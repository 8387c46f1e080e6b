//! Pure forward-mode differentiation (TorchLean's `jvpCtx`).

use smallvec::SmallVec;
use tl_spec::{Scalar, Tensor};

use crate::{Error, GraphData, Result, rules};

impl GraphData {
    /// Tangents of every id, given leaf values, the Nat environment and one tangent per leaf
    /// (in leaf order).
    pub fn jvp<T: Scalar>(
        &self,
        leaves: &[Tensor<T>],
        nats: &[usize],
        tangents: &[Tensor<T>],
    ) -> Result<Vec<Tensor<T>>> {
        let values = self.eval(leaves, nats)?;
        self.jvp_values(&values, nats, tangents)
    }

    /// Like [`GraphData::jvp`], from already evaluated `values` (one per id).
    pub fn jvp_values<T: Scalar>(
        &self,
        values: &[Tensor<T>],
        nats: &[usize],
        tangents: &[Tensor<T>],
    ) -> Result<Vec<Tensor<T>>> {
        if values.len() != self.len() {
            return Err(Error::Count {
                what: "jvp",
                expected: self.len(),
                got: values.len(),
            });
        }
        self.check_leaf_values("jvp tangents", tangents)?;
        let mut dots: Vec<Tensor<T>> = Vec::with_capacity(self.len());
        dots.extend(tangents.iter().cloned());
        for node in self.nodes() {
            let t = {
                let x: SmallVec<[&Tensor<T>; 3]> =
                    node.args().iter().map(|&a| &values[a]).collect();
                let dx: SmallVec<[&Tensor<T>; 3]> = node.args().iter().map(|&a| &dots[a]).collect();
                rules::jvp(node.op(), &x, &dx, nats)?
            };
            dots.push(t);
        }
        Ok(dots)
    }
}
