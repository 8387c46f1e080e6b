//! Pure forward evaluation of a graph over tl-spec.

use smallvec::SmallVec;
use tl_spec::{Scalar, Tensor};

use crate::{Error, GraphData, Id, Result, rules};

impl GraphData {
    /// Evaluate every id: returns the leaf values followed by each node's value.
    ///
    /// `leaves` must match the graph's leaves in count and shape; `nats` is the Nat environment
    /// read by index ops (pass `&[]` when the graph has none).
    pub fn eval<T: Scalar>(&self, leaves: &[Tensor<T>], nats: &[usize]) -> Result<Vec<Tensor<T>>> {
        let mut values = Vec::new();
        self.eval_into(&mut values, leaves, nats)?;
        Ok(values)
    }

    /// Extend `values`, the values of this graph's first `values.len()` ids (as an earlier
    /// `eval` or `eval_into` of the graph, possibly before more nodes were appended, left
    /// them), to every id, evaluating only the ids not yet there. `values` must start empty
    /// or hold at least the leaves; a longer prefix than the graph is an error. So a graph
    /// that grows node by node is evaluated once in all.
    pub fn eval_into<T: Scalar>(
        &self,
        values: &mut Vec<Tensor<T>>,
        leaves: &[Tensor<T>],
        nats: &[usize],
    ) -> Result<()> {
        self.eval_more_releasing(values, leaves, nats, &|_| false, &[])
    }

    /// [`eval_into`](Self::eval_into) that lets go of the values nothing will read, as
    /// [`replay_more_releasing`](Self::replay_more_releasing) does on a tape: the value of a
    /// node (never a leaf) for which `dead(id)` says no handle refers to it any more becomes
    /// the empty vector as soon as its last reader has been evaluated (at once when nothing
    /// reads it). `dropped` lists the nodes whose last handle went since the previous call:
    /// those already evaluated whose readers all were go first. Every value kept is the one
    /// `eval_into` gives; the work is proportional to the new nodes and the ids dropped.
    pub fn eval_more_releasing<T: Scalar>(
        &self,
        values: &mut Vec<Tensor<T>>,
        leaves: &[Tensor<T>],
        nats: &[usize],
        dead: &dyn Fn(Id) -> bool,
        dropped: &[Id],
    ) -> Result<()> {
        self.check_leaf_values("eval", leaves)?;
        let first = self.leaves().len();
        if values.len() > self.len() || (!values.is_empty() && values.len() < first) {
            return Err(Error::Count {
                what: "eval_into: values already evaluated",
                expected: self.len(),
                got: values.len(),
            });
        }
        let release = |values: &mut Vec<Tensor<T>>, id: Id| {
            if id >= first && self.read_until(id) <= values.len() && dead(id) {
                values[id] = Tensor::vector(Vec::new());
            }
        };
        let evaluated = values.len();
        for &id in dropped.iter().filter(|&&id| id < evaluated) {
            release(values, id);
        }
        if values.is_empty() {
            values.reserve(self.len());
            values.extend(leaves.iter().cloned());
        }
        for k in values.len() - first..self.nodes().len() {
            let node = &self.nodes()[k];
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
            for id in self.reads_ending(k, k + 1) {
                release(values, id);
            }
        }
        Ok(())
    }
}
