//! `GraphData` (typed by construction) and `GraphBuilder` (the only way to append).

use smallvec::SmallVec;
use tl_spec::{Scalar, Shape, Tensor};

use crate::{Error, Op, Result};

/// A tensor id: leaves are `0..num_leaves()`, op nodes follow in creation order.
pub type Id = usize;

/// A leaf of the graph's context: an input or parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Leaf {
    /// The leaf's shape.
    pub shape: Shape,
    /// An optional name (parameter names, for printing).
    pub name: Option<String>,
    /// Whether gradients are accumulated into this leaf.
    pub requires_grad: bool,
}

/// An op node: the op, its operand ids (all smaller than its own id) and its inferred shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    op: Op,
    args: SmallVec<[Id; 3]>,
    shape: Shape,
}

impl Node {
    /// The op.
    pub fn op(&self) -> &Op {
        &self.op
    }
    /// Operand ids, in the op's operand order.
    pub fn args(&self) -> &[Id] {
        &self.args
    }
    /// The output shape (inferred by the op's shape rule when the node was added).
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
}

/// A well-typed graph: leaves (inputs and parameters) then op nodes, each node's shape inferred from its operands.
///
/// Fields are private and only [`GraphBuilder`] appends, after the shape rule succeeds, so every
/// `GraphData` value is well typed by construction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphData {
    leaves: Vec<Leaf>,
    nodes: Vec<Node>,
    /// Id → one past the id of the last node that reads it (0: nothing reads it yet).
    read_until: Vec<Id>,
}

impl GraphData {
    /// The leaves, in creation order (ids `0..num_leaves()`).
    pub fn leaves(&self) -> &[Leaf] {
        &self.leaves
    }
    /// One past the id of the last node that reads `id` (0 when nothing reads it, or for an
    /// unknown id): once the nodes below it have run, nothing in the graph reads `id` again.
    pub fn read_until(&self, id: Id) -> Id {
        self.read_until.get(id).copied().unwrap_or(0)
    }
    /// The ids a pass that has just run nodes `from..to` (op-node indices, not ids) may let
    /// go of: each operand whose last reader is among those nodes (once), then each of those
    /// nodes that nothing reads. Leaves among them too; the caller decides what it frees.
    pub(crate) fn reads_ending(&self, from: usize, to: usize) -> impl Iterator<Item = Id> + '_ {
        let leaves = self.leaves.len();
        let operands = (from..to).flat_map(move |j| {
            let args = self.nodes[j].args();
            let last = leaves + j + 1;
            args.iter()
                .enumerate()
                .filter(move |&(i, &a)| self.read_until(a) == last && !args[..i].contains(&a))
                .map(|(_, &a)| a)
        });
        let unread = (leaves + from..leaves + to).filter(move |&id| self.read_until(id) == 0);
        operands.chain(unread)
    }
    /// The op nodes, in creation order (ids `num_leaves()..len()`).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    /// Number of leaves.
    pub fn num_leaves(&self) -> usize {
        self.leaves.len()
    }
    /// Number of ids (leaves plus nodes).
    pub fn len(&self) -> usize {
        self.leaves.len() + self.nodes.len()
    }
    /// Whether the graph has no ids at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The shape of any id.
    pub fn shape(&self, id: Id) -> Result<&Shape> {
        self.check_id("shape", id)?;
        Ok(if id < self.leaves.len() {
            &self.leaves[id].shape
        } else {
            &self.nodes[id - self.leaves.len()].shape
        })
    }
    /// The node behind an op id (`None` for leaves or unknown ids).
    pub fn node(&self, id: Id) -> Option<&Node> {
        id.checked_sub(self.leaves.len())
            .and_then(|k| self.nodes.get(k))
    }

    /// Whether gradient flows into `id`, for every id: leaves by their flag, nodes when their op
    /// is differentiable and some operand requires grad. Tapes use the same rule.
    pub fn requires_grad(&self) -> Vec<bool> {
        let mut rg: Vec<bool> = self.leaves.iter().map(|l| l.requires_grad).collect();
        for n in &self.nodes {
            let r = n.op.is_differentiable() && n.args.iter().any(|&a| rg[a]);
            rg.push(r);
        }
        rg
    }

    pub(crate) fn check_id(&self, op: &'static str, id: Id) -> Result<()> {
        if id < self.len() {
            Ok(())
        } else {
            Err(Error::UnknownId {
                op,
                id,
                len: self.len(),
            })
        }
    }

    /// Check that `leaves` match the graph's leaves in count and shape.
    pub(crate) fn check_leaf_values<T: Scalar>(
        &self,
        what: &'static str,
        leaves: &[Tensor<T>],
    ) -> Result<()> {
        if leaves.len() != self.leaves.len() {
            return Err(Error::Count {
                what,
                expected: self.leaves.len(),
                got: leaves.len(),
            });
        }
        for (id, (v, l)) in leaves.iter().zip(&self.leaves).enumerate() {
            if v.shape() != &l.shape {
                return Err(Error::ShapeMismatch {
                    what,
                    id,
                    expected: l.shape.clone(),
                    got: v.shape().clone(),
                });
            }
        }
        Ok(())
    }
}

/// Builds a [`GraphData`] op by op: leaves first, then nodes, each checked by its shape rule.
#[derive(Debug, Clone, Default)]
pub struct GraphBuilder {
    graph: GraphData,
}

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a leaf that requires grad. Errors once an op node exists.
    pub fn leaf(&mut self, shape: impl Into<Shape>, name: Option<&str>) -> Result<Id> {
        self.leaf_with(shape, name, true)
    }

    /// Add a leaf with an explicit `requires_grad`. Errors once an op node exists, and when the
    /// shape's element count overflows (see [`Shape::check_size`]).
    pub fn leaf_with(
        &mut self,
        shape: impl Into<Shape>,
        name: Option<&str>,
        requires_grad: bool,
    ) -> Result<Id> {
        if !self.graph.nodes.is_empty() {
            return Err(Error::LeafAfterNode {
                name: name.map(str::to_owned),
            });
        }
        let shape = shape.into();
        shape.check_size("leaf")?;
        self.graph.leaves.push(Leaf {
            shape,
            name: name.map(str::to_owned),
            requires_grad,
        });
        self.graph.read_until.push(0);
        Ok(self.graph.leaves.len() - 1)
    }

    /// Append `op` applied to `args`. The node is added only if every id exists and the op's
    /// shape rule accepts the operand shapes; otherwise the graph is unchanged.
    pub fn apply(&mut self, op: Op, args: &[Id]) -> Result<Id> {
        let shape = {
            let shapes = args
                .iter()
                .map(|&a| self.graph.shape(a).map_err(|_| self.unknown(&op, a)))
                .collect::<Result<SmallVec<[&Shape; 3]>>>()?;
            op.infer_shape(&shapes)?
        };
        let id = self.graph.len();
        for &a in args {
            self.graph.read_until[a] = id + 1;
        }
        self.graph.read_until.push(0);
        self.graph.nodes.push(Node {
            op,
            args: SmallVec::from_slice(args),
            shape,
        });
        Ok(id)
    }

    fn unknown(&self, op: &Op, id: Id) -> Error {
        Error::UnknownId {
            op: op.name(),
            id,
            len: self.graph.len(),
        }
    }

    /// The graph built so far.
    pub fn graph(&self) -> &GraphData {
        &self.graph
    }

    /// Finish building.
    pub fn finish(self) -> GraphData {
        self.graph
    }
}
