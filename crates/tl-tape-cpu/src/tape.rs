//! The CPU tape: a grow-only array of nodes; ids are indices. Each node holds its op,
//! parent ids, forward value and `requires_grad`; backward dispatches on the op with `match`
//! (see [`crate::ops`]), so the tape is plain data.
//!
//! **Buffers.** The tape owns a [`Pool`] of spare buffers and installs it while its kernels run
//! (forward and backward), so they draw their outputs and workspaces from it. It fills up from
//! what the tape no longer needs: the values of a [`Tape::clear`]ed pass, the cotangents
//! reverse accumulation has consumed (the sparse path), gradients handed back with
//! [`Tape::recycle`]. A training loop that clears the tape each step therefore runs every step
//! after the first in the previous step's buffers (docs/performance.md, "Buffer reuse").

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;
use tl_ir::{Op, Recorder};
use tl_spec::pool::{self, Pool, PoolStats};
use tl_spec::{Scalar, Shape, Tensor};

use crate::precision::Precision;
use crate::{Error, Result, ops};

/// A node id on the tape.
pub type Id = usize;

/// What produced a node's value.
#[derive(Clone, Debug)]
pub enum NodeKind {
    /// A leaf (input or parameter).
    Leaf,
    /// An op of [`tl_ir::Op`], user ops ([`Op::User`]) included.
    Op(Op),
}

impl NodeKind {
    /// The op's name (`"leaf"` for leaves).
    pub fn name(&self) -> &str {
        match self {
            NodeKind::Leaf => "leaf",
            NodeKind::Op(op) => op.name(),
        }
    }
}

/// One recorded computation step.
#[derive(Clone)]
pub struct Node<T: Scalar> {
    kind: NodeKind,
    parents: SmallVec<[Id; 3]>,
    value: Tensor<T>,
    requires_grad: bool,
    name: Option<String>,
    /// The Nat environment this node read (only for ops that read it).
    nats: Option<Arc<Vec<usize>>>,
    /// What the op's forward kept for its backward ([`ops::forward_saving`]); only for nodes
    /// that require grad, given to the pool by [`Tape::clear`].
    saved: Option<Arc<Vec<Vec<T>>>>,
    /// The value's shape once [`Tape::release`] gave the value to the pool (`value` is then
    /// an empty placeholder).
    released: Option<Box<Shape>>,
    /// Whether a node that requires grad reads this one: its backward may read this value,
    /// so [`Tape::release`] keeps it.
    pinned: bool,
}

impl<T: Scalar> Node<T> {
    /// What produced the node.
    pub fn kind(&self) -> &NodeKind {
        &self.kind
    }
    /// Parent ids, in operand order.
    pub fn parents(&self) -> &[Id] {
        &self.parents
    }
    /// The forward value; `None` once [`Tape::release`] has given it back.
    pub fn value(&self) -> Option<&Tensor<T>> {
        match self.released {
            None => Some(&self.value),
            Some(_) => None,
        }
    }
    /// The value's shape (also after a release).
    pub fn shape(&self) -> &Shape {
        self.released
            .as_deref()
            .unwrap_or_else(|| self.value.shape())
    }
    /// Whether [`Tape::release`] has given the value back.
    pub fn is_released(&self) -> bool {
        self.released.is_some()
    }
    /// Take the value out, leaving the node released (its shape kept): the one place a
    /// release ([`Tape::release`], a releasing backward) marks a node.
    fn take_value(&mut self) -> Tensor<T> {
        self.released = Some(Box::new(self.value.shape().clone()));
        std::mem::replace(&mut self.value, Tensor::vector(Vec::new()))
    }
    /// Whether reverse accumulation visits this node and accepts contributions into it.
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }
    /// Optional debugging name.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
    /// What the forward kept for the backward ([`ops::forward_saving`]); empty for most ops
    /// and for every node that does not require grad.
    pub fn saved(&self) -> &[Vec<T>] {
        self.saved.as_deref().map_or(&[], Vec::as_slice)
    }
}

impl<T: Scalar> fmt::Debug for Node<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{:?} <- {:?}",
            self.kind.name(),
            self.shape(),
            self.parents.as_slice()
        )?;
        if let Some(n) = &self.name {
            write!(f, " {n:?}")?;
        }
        if !self.requires_grad {
            write!(f, " (no grad)")?;
        }
        if self.released.is_some() {
            write!(f, " (released)")?;
        }
        Ok(())
    }
}

/// The CPU autograd tape, generic over `f32` and `f64`.
///
/// PyTorch comparison: the autograd graph recorded during a forward pass; `backward_dense` is
/// `torch.autograd.grad` for every node at once, `backward_params` is `loss.backward()` followed
/// by reading `.grad` of chosen leaves.
#[derive(Default)]
pub struct Tape<T: Scalar> {
    nodes: Vec<Node<T>>,
    /// The Nat environment; shared copy-on-write with the nodes that snapshot it.
    nats: Arc<Vec<usize>>,
    /// Spare buffers for the kernels (module documentation). Behind a lock because reverse
    /// accumulation borrows the tape shared.
    pool: Mutex<Pool<T>>,
    /// The arithmetic of its matrix products ([`crate::precision`]), forward and backward.
    precision: Precision,
}

/// A clone has the same nodes (sharing their values) and an empty pool.
impl<T: Scalar> Clone for Tape<T> {
    fn clone(&self) -> Self {
        Tape {
            nodes: self.nodes.clone(),
            nats: Arc::clone(&self.nats),
            pool: Mutex::default(),
            precision: self.precision,
        }
    }
}

impl<T: Scalar> fmt::Debug for Tape<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.nodes.iter().enumerate())
            .finish()
    }
}

impl<T: Scalar> Tape<T> {
    /// An empty tape.
    pub fn new() -> Self {
        Tape {
            nodes: Vec::new(),
            nats: Arc::new(Vec::new()),
            pool: Mutex::default(),
            precision: Precision::F32,
        }
    }

    /// The arithmetic of this tape's matrix products from now on ([`crate::precision`]):
    /// [`Precision::Bf16`] is bf16 autocast (operands rounded to bf16, f32 sums) for the
    /// products of the ops applied and of the backward passes run afterwards;
    /// [`Precision::F32`] (the default) is the plain f32 path, bit for bit. An `f64` tape
    /// computes in f64 whatever the setting.
    pub fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// The arithmetic of this tape's matrix products ([`Tape::set_precision`]).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The buffer pool (a poisoned lock is taken over: the pool holds only spare buffers).
    fn pool(&self) -> MutexGuard<'_, Pool<T>> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hand a tensor this tape made back to its pool, for its kernels to reuse (kept only if
    /// nothing else shares its storage). The eager session returns its last gradients this way.
    pub fn recycle(&self, t: Tensor<T>) {
        self.pool().recycle(t);
    }

    /// Run `f` with the tape's pool installed, so the buffers it allocates through
    /// [`tl_spec::pool`] (kernels, a host optimizer step) come from the tape's spares.
    pub fn with_pool<R>(&self, f: impl FnOnce() -> R) -> R {
        let mut pool = self.pool();
        let _installed = pool::install(&mut pool);
        f()
    }

    /// The pool's counters: buffers reused, fresh allocations its kernels made while it was
    /// installed, buffers held.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool().stats()
    }

    /// The Nat environment (runtime indices and labels) read by index ops.
    pub fn nats(&self) -> &[usize] {
        &self.nats
    }

    /// Replace the Nat environment. Nodes already recorded keep the environment they read.
    pub fn set_nats(&mut self, nats: Vec<usize>) {
        self.nats = Arc::new(nats);
    }

    /// Append `values` to the Nat environment; returns the position of the first one.
    pub fn push_nats(&mut self, values: &[usize]) -> usize {
        let env = Arc::make_mut(&mut self.nats);
        env.extend_from_slice(values);
        env.len() - values.len()
    }

    /// Overwrite Nat environment entries from position `pos`. Nodes already recorded keep the
    /// values they read (their snapshot is unaffected).
    pub fn write_nats(&mut self, pos: usize, values: &[usize]) -> Result<()> {
        let (len, n) = (self.nats.len(), values.len());
        let end = pos.checked_add(n);
        let Some(end) = end.filter(|&end| end <= len) else {
            let what = match end {
                Some(end) => format!("write_nats: positions {pos}..{end} of a Nat environment"),
                None => format!(
                    "write_nats: {n} position(s) from {pos} (past usize::MAX) of a Nat environment"
                ),
            };
            return Err(Error::Count {
                what,
                expected: len,
                got: pos.saturating_add(n),
            });
        };
        Arc::make_mut(&mut self.nats)[pos..end].copy_from_slice(values);
        Ok(())
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tape has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Discard every node and the Nat environment (a fresh forward pass). The values go to the
    /// tape's pool for the next pass; the pool first counts the pass that ends ([`Pool::trim`]:
    /// what sat unused for a few passes is dropped). Clearing an empty tape counts no pass.
    pub fn clear(&mut self) {
        let pool = self.pool.get_mut().unwrap_or_else(|e| e.into_inner());
        if !self.nodes.is_empty() {
            pool.trim();
        }
        for node in self.nodes.drain(..) {
            pool.recycle(node.value);
            if let Some(saved) = node.saved.and_then(|s| Arc::try_unwrap(s).ok()) {
                saved.into_iter().for_each(|b| pool.put(b));
            }
        }
        self.nats = Arc::new(Vec::new());
    }

    /// The node behind `id`, if any.
    pub fn node(&self, id: Id) -> Option<&Node<T>> {
        self.nodes.get(id)
    }

    /// Add a leaf; returns its id (the pre-append size of the tape).
    pub fn leaf(&mut self, value: Tensor<T>, name: Option<&str>, requires_grad: bool) -> Id {
        self.nodes.push(Node {
            kind: NodeKind::Leaf,
            parents: SmallVec::new(),
            value,
            requires_grad,
            name: name.map(str::to_owned),
            nats: None,
            saved: None,
            released: None,
            pinned: false,
        });
        self.nodes.len() - 1
    }

    fn check_id(&self, what: &str, id: Id) -> Result<&Node<T>> {
        self.nodes.get(id).ok_or_else(|| Error::UnknownId {
            what: what.to_owned(),
            id,
            len: self.nodes.len(),
        })
    }

    /// The value of node `id` for `what`: an error for an unknown id or a released value.
    fn value_of(&self, what: &str, id: Id) -> Result<&Tensor<T>> {
        value_in(&self.nodes, what, id)
    }

    /// Give the value of node `id` to the tape's pool if no backward can read it: an op node
    /// (not a leaf) that does not require grad and that no node requiring grad reads. The
    /// session calls this when the last handle to a node is dropped (an evaluation pass frees
    /// its intermediate values as it goes, as PyTorch does under `torch.no_grad()`). Returns
    /// whether the value was released; `false` for a node that must keep it or was released
    /// before. Reading a released value, or applying an op to it, is an error naming the node.
    pub fn release(&mut self, id: Id) -> Result<bool> {
        let node = self.check_id("release", id)?;
        if matches!(node.kind, NodeKind::Leaf)
            || node.requires_grad
            || node.pinned
            || node.released.is_some()
        {
            return Ok(false);
        }
        let pool = self.pool.get_mut().unwrap_or_else(|e| e.into_inner());
        pool.recycle(self.nodes[id].take_value());
        Ok(true)
    }

    /// The value at `id`, checked against the shape the caller expects.
    pub fn value(&self, id: Id, expected: &Shape) -> Result<&Tensor<T>> {
        let v = self.value_of("value", id)?;
        if v.shape() != expected {
            return Err(Error::Shape {
                what: "value".into(),
                id,
                expected: v.shape().clone(),
                got: expected.clone(),
            });
        }
        Ok(v)
    }

    /// The value at `id`, whatever its shape.
    pub fn get(&self, id: Id) -> Result<&Tensor<T>> {
        self.value_of("get", id)
    }

    fn inputs(&self, what: &str, parents: &[Id]) -> Result<SmallVec<[&Tensor<T>; 3]>> {
        parents.iter().map(|&p| self.value_of(what, p)).collect()
    }

    fn push(
        &mut self,
        kind: NodeKind,
        parents: &[Id],
        value: Tensor<T>,
        differentiable: bool,
        saved: Vec<Vec<T>>,
    ) -> Id {
        let requires_grad = self.grad_flows(differentiable, parents);
        if requires_grad {
            // This node's backward reads its operands' values.
            parents.iter().for_each(|&p| self.nodes[p].pinned = true);
        }
        let nats = match &kind {
            NodeKind::Op(op) if op.reads_nats() => Some(Arc::clone(&self.nats)),
            _ => None,
        };
        self.nodes.push(Node {
            kind,
            parents: SmallVec::from_slice(parents),
            value,
            requires_grad,
            name: None,
            nats,
            saved: (!saved.is_empty()).then(|| Arc::new(saved)),
            released: None,
            pinned: false,
        });
        self.nodes.len() - 1
    }

    /// Whether a node on `parents` will require grad: its op is `differentiable` and a parent
    /// requires grad.
    fn grad_flows(&self, differentiable: bool, parents: &[Id]) -> bool {
        differentiable && parents.iter().any(|&p| self.nodes[p].requires_grad)
    }

    /// Apply a built-in op to `parents`: the shape rule is checked first, then the output's size
    /// against the allocation cap ([`tl_spec::alloc`]), then the CPU kernel runs. A node that
    /// will require grad keeps what its backward reads ([`ops::forward_saving`]: attention's
    /// intermediates, gelu's tanh term, the norms' and cross-entropy's row statistics) until
    /// [`Tape::clear`]. On error the tape is unchanged.
    pub fn apply(&mut self, op: &Op, parents: &[Id]) -> Result<Id> {
        let (value, saved) = {
            let inputs = self.inputs(op.name(), parents)?;
            let shapes: SmallVec<[&Shape; 3]> = inputs.iter().map(|t| t.shape()).collect();
            let shape = op.infer_shape(&shapes)?;
            // The output is refused before any kernel allocates it (tl_spec::alloc's cap).
            tl_spec::alloc::check_shape::<T>(op.name(), &shape)?;
            let mut pool = self.pool();
            let _installed = pool::install(&mut pool);
            let _precision = crate::precision::install(self.precision);
            let (value, saved) = if self.grad_flows(op.is_differentiable(), parents) {
                ops::forward_saving(op, &inputs, &self.nats)?
            } else {
                (ops::forward(op, &inputs, &self.nats)?, Vec::new())
            };
            if value.shape() != &shape {
                return Err(Error::Shape {
                    what: format!("{} kernel output", op.name()),
                    id: self.nodes.len(),
                    expected: shape,
                    got: value.shape().clone(),
                });
            }
            (value, saved)
        };
        Ok(self.push(
            NodeKind::Op(op.clone()),
            parents,
            value,
            op.is_differentiable(),
            saved,
        ))
    }

    /// Dense reverse accumulation: gradients of `out` (cotangent `seed`) for every node id.
    /// Nodes that receive no contribution get zeros.
    pub fn backward_dense(&self, out: Id, seed: &Tensor<T>) -> Result<Vec<Tensor<T>>> {
        let grads = self.seeded("backward_dense", out, seed)?;
        self.densify(self.accumulate(grads, out + 1, None)?)
    }

    /// Reverse accumulation over the whole tape from an explicit dense gradient array
    /// (one per node, shapes matching), e.g. to seed several outputs at once.
    pub fn backward_dense_from(&self, grads0: Vec<Tensor<T>>) -> Result<Vec<Tensor<T>>> {
        self.backward_first_n(self.len(), grads0)
    }

    /// Reverse accumulation over the first `n` nodes only (visiting n−1, …, 0), from `grads0`.
    pub fn backward_first_n(&self, n: usize, grads0: Vec<Tensor<T>>) -> Result<Vec<Tensor<T>>> {
        if grads0.len() != self.len() {
            return Err(Error::Count {
                what: "backward_dense_from: gradient array length".into(),
                expected: self.len(),
                got: grads0.len(),
            });
        }
        if n > self.len() {
            return Err(Error::Count {
                what: "backward_first_n: node count".into(),
                expected: self.len(),
                got: n,
            });
        }
        for (id, (g, node)) in grads0.iter().zip(&self.nodes).enumerate() {
            if g.shape() != node.shape() {
                return Err(Error::Shape {
                    what: "backward_dense_from".into(),
                    id,
                    expected: node.shape().clone(),
                    got: g.shape().clone(),
                });
            }
        }
        let grads = grads0.into_iter().map(Some).collect();
        self.densify(self.accumulate(grads, n, None)?)
    }

    /// Sparse gradients for chosen leaves only (the training-loop path): a map from each id in
    /// `wanted` to its gradient (zeros if nothing flowed into it).
    pub fn backward_params(
        &self,
        out: Id,
        seed: &Tensor<T>,
        wanted: &[Id],
    ) -> Result<HashMap<Id, Tensor<T>>> {
        let grads = self.sparse_seeded(out, seed, wanted)?;
        let grads = self.accumulate(grads, out + 1, Some(wanted))?;
        self.wanted_grads(grads, wanted)
    }

    /// [`backward_params`](Self::backward_params) for a pass that ends with it (a training
    /// step): each op node's forward value, and what its forward kept, goes to the tape's pool
    /// as soon as the sweep has passed it, so the backward's own buffers reuse them and the
    /// step's peak holds the values not yet passed, not all of them (PyTorch frees saved
    /// tensors the same way unless `retain_graph=True`). The same gradients, bit for bit.
    /// Afterwards the op nodes up to `out` are released (reading one is an error naming it);
    /// leaves keep their values. Read the loss before.
    pub fn backward_params_releasing(
        &mut self,
        out: Id,
        seed: &Tensor<T>,
        wanted: &[Id],
    ) -> Result<HashMap<Id, Tensor<T>>> {
        let grads = self.sparse_seeded(out, seed, wanted)?;
        let grads = self.accumulate_releasing(grads, out + 1, Some(wanted))?;
        self.wanted_grads(grads, wanted)
    }

    /// The cotangent slots of a sparse backward from `out` (every id of `wanted` checked).
    fn sparse_seeded(
        &self,
        out: Id,
        seed: &Tensor<T>,
        wanted: &[Id],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        for &w in wanted {
            self.check_id("backward_params", w)?;
        }
        self.seeded("backward_params", out, seed)
    }

    /// The gradients of `wanted` from the sweep's `grads` (zeros where none flowed); the
    /// rest go to the pool.
    fn wanted_grads(
        &self,
        mut grads: Vec<Option<Tensor<T>>>,
        wanted: &[Id],
    ) -> Result<HashMap<Id, Tensor<T>>> {
        // Clone (an Arc bump), not take: an id listed twice must get its gradient both times.
        let found = wanted
            .iter()
            .map(|&w| {
                let g = match &grads[w] {
                    Some(g) => g.clone(),
                    None => {
                        let shape = self.nodes[w].shape().clone();
                        Tensor::try_zeros("backward_params", shape)?
                    }
                };
                Ok((w, g))
            })
            .collect::<Result<_>>()?;
        // What was not asked for (leaves that require grad, ids past `out`) goes to the pool.
        let mut pool = self.pool();
        grads.drain(..).flatten().for_each(|g| pool.recycle(g));
        Ok(found)
    }

    fn seeded(&self, what: &str, out: Id, seed: &Tensor<T>) -> Result<Vec<Option<Tensor<T>>>> {
        let node = self.check_id(what, out)?;
        if seed.shape() != node.shape() {
            return Err(Error::Shape {
                what: format!("{what} seed"),
                id: out,
                expected: node.shape().clone(),
                got: seed.shape().clone(),
            });
        }
        let mut grads: Vec<Option<Tensor<T>>> = vec![None; self.len()];
        grads[out] = Some(seed.clone());
        Ok(grads)
    }

    /// Every node's gradient, zeros (in the tape's pool buffers) where none flowed.
    fn densify(&self, grads: Vec<Option<Tensor<T>>>) -> Result<Vec<Tensor<T>>> {
        self.with_pool(|| {
            grads
                .into_iter()
                .zip(&self.nodes)
                .map(|(g, n)| match g {
                    Some(g) => Ok(g),
                    None => {
                        let zeros = tl_spec::alloc::try_zeroed(
                            "backward",
                            "zero gradient",
                            n.shape().numel(),
                        )?;
                        Ok(Tensor::new(n.shape().clone(), zeros)?)
                    }
                })
                .collect()
        })
    }

    /// The reverse loop: visit ids n−1 … 0 ([`visit`]). With `keep = Some(ids)` only those
    /// ids' cotangents are wanted: every other one goes to the pool once its VJP has run (and a
    /// contribution once it has been added), so the backward pass reuses its own buffers;
    /// `None` keeps them all.
    fn accumulate(
        &self,
        mut grads: Vec<Option<Tensor<T>>>,
        n: usize,
        keep: Option<&[Id]>,
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let mut pool = self.pool();
        let _installed = pool::install(&mut pool);
        let _precision = crate::precision::install(self.precision);
        for id in (0..n).rev() {
            visit(&self.nodes, id, &mut grads, keep)?;
        }
        Ok(grads)
    }

    /// [`accumulate`](Self::accumulate) that gives each node's forward value (and what its
    /// forward kept) to the pool once the loop has passed it: every node that reads it has a
    /// higher id, so nothing after reads it. Leaves keep theirs.
    fn accumulate_releasing(
        &mut self,
        mut grads: Vec<Option<Tensor<T>>>,
        n: usize,
        keep: Option<&[Id]>,
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let pool = self.pool.get_mut().unwrap_or_else(|e| e.into_inner());
        let _installed = pool::install(pool);
        let _precision = crate::precision::install(self.precision);
        for id in (0..n).rev() {
            visit(&self.nodes, id, &mut grads, keep)?;
            let node = &mut self.nodes[id];
            if matches!(node.kind, NodeKind::Op(_)) && node.released.is_none() {
                pool::recycle(node.take_value());
                if let Some(saved) = node.saved.take().and_then(|s| Arc::try_unwrap(s).ok()) {
                    saved.into_iter().for_each(pool::give);
                }
            }
        }
        Ok(grads)
    }
}

/// The value of node `id` among `nodes`, for `what`: an error for an unknown id or a released
/// value.
fn value_in<'a, T: Scalar>(nodes: &'a [Node<T>], what: &str, id: Id) -> Result<&'a Tensor<T>> {
    let node = nodes.get(id).ok_or_else(|| Error::UnknownId {
        what: what.to_owned(),
        id,
        len: nodes.len(),
    })?;
    match node.released {
        None => Ok(&node.value),
        Some(_) => Err(Error::ReleasedValue {
            what: what.to_owned(),
            id,
            op: node.kind.name().to_owned(),
        }),
    }
}

/// One step of the reverse loop, at node `id`: if it requires grad and has a cotangent, run its
/// VJP and add each contribution into its parent. Contributions to parents that do not require
/// grad are dropped; a contribution of the wrong shape is an error naming the op. With `keep`
/// (see [`Tape::accumulate`]) the node's own cotangent goes to the pool afterwards unless
/// listed.
fn visit<T: Scalar>(
    nodes: &[Node<T>],
    id: Id,
    grads: &mut [Option<Tensor<T>>],
    keep: Option<&[Id]>,
) -> Result<()> {
    let node = &nodes[id];
    if !node.requires_grad || matches!(node.kind, NodeKind::Leaf) {
        return Ok(());
    }
    let (lower, upper) = grads.split_at_mut(id);
    let Some(g) = upper[0].as_ref() else {
        return Ok(());
    };
    if g.numel() == 0 {
        // An empty value sends nothing to its parents: a VJP is linear in the cotangent,
        // which has no element (and a kernel's loops over the parents' dims could run
        // for hours on an empty [2⁶², 0]). Parents left without a cotangent get zeros.
        return Ok(());
    }
    // Never released: this node requires grad, so it pinned its parents.
    if let Some(&p) = node.parents.iter().find(|&&p| nodes[p].released.is_some()) {
        value_in(nodes, "backward", p)?;
    }
    let inputs: SmallVec<[&Tensor<T>; 3]> = node.parents.iter().map(|&p| &nodes[p].value).collect();
    let contribs: SmallVec<[Option<Tensor<T>>; 3]> = match &node.kind {
        NodeKind::Op(op) => {
            // Only parents that accept contributions need their cotangent computed.
            let needed: SmallVec<[bool; 3]> = node
                .parents
                .iter()
                .map(|&p| nodes[p].requires_grad)
                .collect();
            {
                let nats = node.nats.as_deref().map_or(&[][..], Vec::as_slice);
                let saved = node.saved.as_deref().map_or(&[][..], Vec::as_slice);
                ops::backward_needed(op, &inputs, &node.value, g, &needed, nats, saved)?
            }
        }
        NodeKind::Leaf => unreachable!("leaves are skipped above"),
    };
    if contribs.len() > node.parents.len() {
        return Err(Error::Count {
            what: format!("{} backward: cotangents", node.kind.name()),
            expected: node.parents.len(),
            got: contribs.len(),
        });
    }
    for (&p, c) in node.parents.iter().zip(contribs) {
        let Some(c) = c else { continue };
        let parent = &nodes[p];
        if !parent.requires_grad {
            continue;
        }
        if c.shape() != parent.shape() {
            return Err(Error::Shape {
                what: format!("{} backward: contribution to parent", node.kind.name()),
                id: p,
                expected: parent.shape().clone(),
                got: c.shape().clone(),
            });
        }
        match &mut lower[p] {
            slot @ None => *slot = Some(c),
            Some(acc) => {
                ops::accumulate(acc, &c);
                pool::recycle(c);
            }
        }
    }
    if let Some(keep) = keep
        && !keep.contains(&id)
        && let Some(g) = upper[0].take()
    {
        pool::recycle(g);
    }
    Ok(())
}

impl<T: Scalar> Recorder<T> for Tape<T> {
    type Error = Error;

    fn leaf(&mut self, value: Tensor<T>, name: Option<&str>, requires_grad: bool) -> Result<usize> {
        Ok(Tape::leaf(self, value, name, requires_grad))
    }

    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize> {
        Tape::apply(self, op, args)
    }

    fn set_nats(&mut self, nats: &[usize]) -> Result<()> {
        Tape::set_nats(self, nats.to_vec());
        Ok(())
    }

    fn release(&mut self, id: usize) -> Result<bool> {
        Tape::release(self, id)
    }
}
