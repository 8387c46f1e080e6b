//! The inputs the checks run on: one op applied to operands ([`OpCase`]) and a whole graph with
//! leaf values and an output cotangent ([`GraphCase`]). Their `Debug` output prints everything
//! needed to reproduce a failure by hand: op and parameters, shapes, and every value.

use std::fmt;

use tl_ir::{GraphBuilder, GraphData, Id, Op};
use tl_spec::{Shape, Tensor};

/// One op with its static parameters and its operand values (f64, the reference precision).
#[derive(Clone, PartialEq)]
pub struct OpCase {
    /// The op, parameters included.
    pub op: Op,
    /// The operands, in the op's operand order.
    pub inputs: Vec<Tensor<f64>>,
    /// The Nat environment (runtime indices, labels) the op reads; empty for most ops.
    pub nats: Vec<usize>,
}

impl OpCase {
    /// `op` applied to `inputs`, with an empty Nat environment.
    pub fn new(op: Op, inputs: Vec<Tensor<f64>>) -> Self {
        OpCase {
            op,
            inputs,
            nats: Vec::new(),
        }
    }

    /// `op` applied to `inputs`, reading the Nat environment `nats`.
    pub fn with_nats(op: Op, inputs: Vec<Tensor<f64>>, nats: Vec<usize>) -> Self {
        OpCase { op, inputs, nats }
    }

    /// Operand references, in the form `tl_ir::rules` takes them.
    pub fn args(&self) -> Vec<&Tensor<f64>> {
        self.inputs.iter().collect()
    }

    /// The output shape by the op's shape rule (generated cases always satisfy it).
    pub fn out_shape(&self) -> Shape {
        let shapes: Vec<&Shape> = self.inputs.iter().map(|t| t.shape()).collect();
        self.op
            .infer_shape(&shapes)
            .unwrap_or_else(|e| panic!("{}", ill_typed(self, &e)))
    }

    /// The one-node graph `op(x0, x1, ...)` with one leaf per operand, leaf `k` requiring grad
    /// when `requires_grad[k]` (missing flags count as `true`). Returns the graph and the node id.
    pub fn graph(&self, requires_grad: &[bool]) -> (GraphData, Id) {
        let mut b = GraphBuilder::new();
        let leaves: Vec<Id> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let rg = requires_grad.get(k).copied().unwrap_or(true);
                b.leaf_with(t.shape().clone(), Some(&format!("x{k}")), rg)
                    .expect("leaves come first")
            })
            .collect();
        let out = b
            .apply(self.op.clone(), &leaves)
            .unwrap_or_else(|e| panic!("{}", ill_typed(self, &e)));
        (b.finish(), out)
    }
}

impl fmt::Debug for OpCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "op: {:?}", self.op)?;
        if let Op::Constant(c) = &self.op {
            writeln!(f, "  constant = {}", Values(c))?;
        }
        for (k, t) in self.inputs.iter().enumerate() {
            writeln!(f, "  x{k} = {}", Values(t))?;
        }
        Ok(())
    }
}

/// A graph with leaf values, an output id and a cotangent (seed) for it.
#[derive(Clone, PartialEq)]
pub struct GraphCase {
    /// The graph (leaves carry their `requires_grad` flags).
    pub graph: GraphData,
    /// One value per leaf, in leaf order.
    pub leaves: Vec<Tensor<f64>>,
    /// The id whose gradient is taken.
    pub out: Id,
    /// The cotangent of `out` (shape of `out`).
    pub seed: Tensor<f64>,
    /// The Nat environment the graph's index ops read.
    pub nats: Vec<usize>,
}

impl GraphCase {
    /// The one-node graph of an op case, with leaf `requires_grad` flags and a seed.
    pub fn from_op(case: &OpCase, requires_grad: &[bool], seed: Tensor<f64>) -> Self {
        let (graph, out) = case.graph(requires_grad);
        GraphCase {
            graph,
            leaves: case.inputs.clone(),
            out,
            seed,
            nats: case.nats.clone(),
        }
    }
}

impl fmt::Debug for GraphCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph ({} ids, out = %{}):", self.graph.len(), self.out)?;
        for (id, (leaf, v)) in self.graph.leaves().iter().zip(&self.leaves).enumerate() {
            let rg = if leaf.requires_grad { "" } else { " (no grad)" };
            writeln!(f, "  %{id} = leaf{rg} {}", Values(v))?;
        }
        let nl = self.graph.num_leaves();
        for (k, node) in self.graph.nodes().iter().enumerate() {
            let args: Vec<String> = node.args().iter().map(|a| format!("%{a}")).collect();
            writeln!(
                f,
                "  %{} = {:?}({}) : {}",
                nl + k,
                node.op(),
                args.join(", "),
                node.shape()
            )?;
            if let Op::Constant(c) = node.op() {
                writeln!(f, "      constant = {}", Values(c))?;
            }
        }
        writeln!(f, "  seed for %{} = {}", self.out, Values(&self.seed))
    }
}

/// Formats a tensor as its shape and its elements at full precision (all of them up to
/// [`PRINT_ALL_UP_TO`]).
pub struct Values<'a>(pub &'a Tensor<f64>);

/// Tensors up to this many elements are printed in full; larger ones are abbreviated (they are
/// generated from a seed, so `TL_SEED` and `TL_CASES` reproduce them exactly).
pub const PRINT_ALL_UP_TO: usize = 256;

impl fmt::Display for Values<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data = self.0.data();
        if data.len() <= PRINT_ALL_UP_TO {
            return write!(f, "{} {:?}", self.0.shape(), data);
        }
        let sum: f64 = data.iter().sum();
        write!(
            f,
            "{} {:?} … ({} more; sum {sum:e}; reproduce with the same TL_SEED and TL_CASES)",
            self.0.shape(),
            &data[..16],
            data.len() - 16
        )
    }
}

/// A labelled bundle of extra tensors (cotangents, tangents) that a check draws with a case.
#[derive(Clone, PartialEq)]
pub struct With<C> {
    /// The case.
    pub case: C,
    /// The extra tensors, named.
    pub extra: Vec<(&'static str, Tensor<f64>)>,
}

impl<C: fmt::Debug> fmt::Debug for With<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.case)?;
        for (name, t) in &self.extra {
            writeln!(f, "  {name} = {}", Values(t))?;
        }
        Ok(())
    }
}

/// The message of a generated case that its op's shape rule refuses: the generator (a registry
/// entry's, or a user entry's shape generator) drew shapes the op does not take.
fn ill_typed(case: &OpCase, e: &dyn fmt::Display) -> String {
    format!(
        "the case generator drew shapes the op's shape rule refuses ({e}); an entry's shape \
         generator must draw one shape per operand that the op takes:\n{case:?}"
    )
}
