//! `Recorder`: what a tape must offer to be compiled into, and `GraphData::replay` ("compile").

use tl_spec::{Scalar, Tensor};

use crate::{GraphData, Id, Op};

/// Anything that can record leaves and op applications: the CPU tape, the CUDA tape, and the
/// eager sessions built on them. Eager execution and compiled replay share this one interface.
pub trait Recorder<T: Scalar> {
    /// The recorder's error type; IR errors (bad leaf values) must convert into it.
    type Error: From<crate::Error>;

    /// Record a leaf holding `value`; returns its id on the recorder.
    fn leaf(
        &mut self,
        value: Tensor<T>,
        name: Option<&str>,
        requires_grad: bool,
    ) -> Result<usize, Self::Error>;

    /// Record `op` applied to the recorder ids `args`; returns the new id.
    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize, Self::Error>;

    /// Replace the Nat environment (runtime indices and labels) that later ops read.
    fn set_nats(&mut self, nats: &[usize]) -> Result<(), Self::Error>;
}

impl GraphData {
    /// Replay the graph into `rec` ("compile"): sets the Nat environment, records every leaf
    /// with its value, then every node. Returns, for each graph id, the id it received on the
    /// recorder.
    pub fn replay<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        leaves: &[Tensor<T>],
        nats: &[usize],
    ) -> Result<Vec<usize>, R::Error> {
        self.check_leaf_values("replay", leaves)?;
        rec.set_nats(nats)?;
        let mut map: Vec<Id> = Vec::with_capacity(self.len());
        for (leaf, value) in self.leaves().iter().zip(leaves) {
            map.push(rec.leaf(value.clone(), leaf.name.as_deref(), leaf.requires_grad)?);
        }
        self.replay_nodes(rec, map)
    }

    /// The second half of [`replay`](Self::replay): record every node onto `rec`, whose
    /// leaves the caller has recorded already (`leaf_ids[i]` is leaf `i`'s recorder id; e.g. a
    /// parameter kept resident on a device instead of uploaded from a host value). The Nat
    /// environment must be set. Returns, for each graph id, its recorder id.
    pub fn replay_nodes<T: Scalar, R: Recorder<T>>(
        &self,
        rec: &mut R,
        leaf_ids: Vec<usize>,
    ) -> Result<Vec<usize>, R::Error> {
        if leaf_ids.len() != self.leaves().len() {
            return Err(crate::Error::Count {
                what: "replay_nodes: leaf ids",
                expected: self.leaves().len(),
                got: leaf_ids.len(),
            }
            .into());
        }
        let mut map: Vec<Id> = leaf_ids;
        map.reserve(self.nodes().len());
        let mut args = Vec::with_capacity(3);
        for node in self.nodes() {
            args.clear();
            args.extend(node.args().iter().map(|&a| map[a]));
            map.push(rec.apply(node.op(), &args)?);
        }
        Ok(map)
    }
}
