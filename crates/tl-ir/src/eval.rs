//! Pure forward evaluation of a graph over tl-spec.

use smallvec::SmallVec;
use tl_spec::{Scalar, Tensor};

use crate::{GraphData, Result, rules};

impl GraphData {
    /// Evaluate every id: returns the leaf values followed by each node's value.
    ///
    /// `leaves` must match the graph's leaves in count and shape; `nats` is the Nat environment
    /// read by index ops (pass `&[]` when the graph has none).
    pub fn eval<T: Scalar>(&self, leaves: &[Tensor<T>], nats: &[usize]) -> Result<Vec<Tensor<T>>> {
        self.check_leaf_values("eval", leaves)?;
        let mut values: Vec<Tensor<T>> = Vec::with_capacity(self.len());
        values.extend(leaves.iter().cloned());
        for node in self.nodes() {
            let y = {
                let args: SmallVec<[&Tensor<T>; 3]> =
                    node.args().iter().map(|&a| &values[a]).collect();
                rules::value(node.op(), &args, nats)?
            };
            debug_assert_eq!(
                y.shape(),
                node.shape(),
                "{}: shape rule and value disagree",
                node.op()
            );
            values.push(y);
        }
        Ok(values)
    }
}
