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

    /// Record `op` applied to `args`, then the one-operand op `next` applied to its result;
    /// returns both ids. A recorder that can run the pair as one step overrides this (the CUDA
    /// tape fuses a bias epilogue with the activation after it: one launch for `linear` + `relu`);
    /// the values must be the ones the two [`apply`](Self::apply) calls give, which is this
    /// default. [`GraphData::replay`] calls it wherever a node's only operand is the node
    /// recorded just before it.
    fn apply_then(
        &mut self,
        op: &Op,
        args: &[usize],
        next: &Op,
    ) -> Result<(usize, usize), Self::Error> {
        let first = self.apply(op, args)?;
        let second = self.apply(next, &[first])?;
        Ok((first, second))
    }
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
        let nodes = self.nodes();
        let mut k = 0;
        while k < nodes.len() {
            let node = &nodes[k];
            args.clear();
            args.extend(node.args().iter().map(|&a| map[a]));
            // The graph id node k receives is `map.len()`; a next node reading only it is a
            // pair the recorder may fuse.
            match nodes.get(k + 1) {
                Some(next) if next.args() == [map.len()] => {
                    let (a, b) = rec.apply_then(node.op(), &args, next.op())?;
                    map.push(a);
                    map.push(b);
                    k += 2;
                }
                _ => {
                    map.push(rec.apply(node.op(), &args)?);
                    k += 1;
                }
            }
        }
        Ok(map)
    }
}
