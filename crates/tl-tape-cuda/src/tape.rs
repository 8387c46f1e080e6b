//! The CUDA tape: a grow-only array of nodes over float32 device buffers; ids are
//! indices. Each node holds its name, value, `requires_grad`, parents, workspace (the cleanup
//! list) and its [`Op`]; backward dispatches on the op with `match` ([`crate::ops`]), so the tape
//! is plain data. Reverse accumulation lives in [`crate::backward`].
//!
//! Ownership: the tape owns the buffers of values it created (uploaded leaves, op results) and
//! of node workspaces; it does not own [`CudaTape::leaf_borrowed`] leaves (parameter mirrors)
//! or views (`reshape`, `flatten`, `detach` share their operand's buffer). [`CudaTape::reset`]
//! releases exactly what it owns.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;
use tl_ir::{Op, Recorder, Then};
use tl_spec::{Scalar, Shape, Tensor};

use crate::device::{Buffer, Device};
use crate::{AnyBuffer, Error, Precision, Result, ops, user};

/// A node id on the tape.
pub type Id = usize;

/// One recorded computation step.
#[derive(Clone)]
pub struct Node {
    pub(crate) name: Option<String>,
    pub(crate) value: AnyBuffer,
    pub(crate) owned: bool,
    pub(crate) requires_grad: bool,
    pub(crate) parents: SmallVec<[Id; 3]>,
    pub(crate) op: Option<Op>,
    pub(crate) cleanup: Vec<Buffer>,
    /// The Nat environment at record time, for ops that read it ([`Op::reads_nats`]).
    pub(crate) nats: Option<Arc<Vec<usize>>>,
    /// Whether [`CudaTape::release`] has let go of the value.
    pub(crate) released: bool,
    /// Whether a node that requires grad reads this one (its backward may read the value, so
    /// [`CudaTape::release`] keeps it).
    pub(crate) pinned: bool,
    /// The node whose buffer this value is: itself, or for a view (`reshape`, `flatten`,
    /// `detach`: a value the tape does not own) the node it views, followed to its end.
    pub(crate) root: Id,
    /// For a root: how many unreleased nodes hold its buffer (itself and its views); an owned
    /// buffer goes back to the device when this reaches 0.
    pub(crate) holders: u32,
}

impl Node {
    /// Optional debugging name.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
    /// The forward value; `None` once [`CudaTape::release`] has let go of it.
    pub fn value(&self) -> Option<&AnyBuffer> {
        (!self.released).then_some(&self.value)
    }
    /// The value's shape (also after a release).
    pub fn shape(&self) -> &Shape {
        self.value.shape()
    }
    /// Whether [`CudaTape::release`] has let go of the value.
    pub fn is_released(&self) -> bool {
        self.released
    }
    /// Whether the tape owns (and [`CudaTape::reset`] releases) the value's buffer.
    pub fn owns_value(&self) -> bool {
        self.owned
    }
    /// Whether reverse accumulation visits this node and accepts contributions into it.
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }
    /// Parent ids, in operand order.
    pub fn parents(&self) -> &[Id] {
        &self.parents
    }
    /// The op that produced the node (`None` for a leaf).
    pub fn op(&self) -> Option<&Op> {
        self.op.as_ref()
    }
    /// Workspace buffers kept for the backward, released after backprop.
    pub fn cleanup(&self) -> &[Buffer] {
        &self.cleanup
    }
    /// The Nat environment the node was recorded with (empty for ops that do not read it).
    pub fn nats(&self) -> &[usize] {
        self.nats.as_deref().map_or(&[][..], Vec::as_slice)
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.op.as_ref().map_or("leaf", Op::name);
        write!(f, "{op}{:?} <- {:?}", self.value, self.parents.as_slice())?;
        if let Some(n) = &self.name {
            write!(f, " {n:?}")?;
        }
        if !self.requires_grad {
            write!(f, " (no grad)")?;
        }
        if !self.owned {
            write!(f, " (borrowed)")?;
        }
        if self.released {
            write!(f, " (released)")?;
        }
        Ok(())
    }
}

/// The CUDA autograd tape over any [`Device`] (the simulation device in tests and CI, the real
/// one behind feature `cuda`). Values are float32 device buffers with runtime shapes.
///
/// PyTorch comparison: the autograd graph of a forward pass on `device="cuda"`;
/// `backward_dense` is `torch.autograd.grad` for every node, `backward_params` is
/// `loss.backward()` followed by reading `.grad` of the parameters.
pub struct CudaTape<D: Device> {
    pub(crate) dev: D,
    pub(crate) nodes: Vec<Node>,
    /// The Nat environment (runtime indices, labels) read by index ops; host-side, shared with
    /// the nodes that snapshot it.
    pub(crate) nats: Arc<Vec<usize>>,
    /// The arithmetic of its matrix products ([`crate::precision`]), forward and backward.
    pub(crate) precision: Precision,
}

impl<D: Device> fmt::Debug for CudaTape<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaTape<{}> ", self.dev.name())?;
        f.debug_map()
            .entries(self.nodes.iter().enumerate())
            .finish()
    }
}

impl<D: Device> CudaTape<D> {
    /// An empty tape on `dev`.
    pub fn new(dev: D) -> Self {
        CudaTape {
            dev,
            nodes: Vec::new(),
            nats: Arc::new(Vec::new()),
            precision: Precision::F32,
        }
    }

    /// The arithmetic of this tape's matrix products from now on ([`crate::precision`]):
    /// [`Precision::Bf16`] / [`Precision::Tf32`] are autocast (operands rounded, f32 sums, on
    /// the tensor-core GEMM) for the products of the ops applied and of the backward passes
    /// run afterwards; [`Precision::F32`] (the default) is the plain f32 path, bit for bit.
    pub fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// The arithmetic of this tape's matrix products ([`CudaTape::set_precision`]).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The Nat environment (runtime indices and labels) read by index ops.
    pub fn nats(&self) -> &[usize] {
        &self.nats
    }

    /// Replace the Nat environment.
    pub fn set_nats(&mut self, nats: Vec<usize>) {
        self.nats = Arc::new(nats);
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The device, mutably (to upload parameters, run an optimizer step, read telemetry).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.dev
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tape has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node behind `id`, if any.
    pub fn node(&self, id: Id) -> Option<&Node> {
        self.nodes.get(id)
    }

    fn push_leaf(&mut self, value: AnyBuffer, name: Option<&str>, rg: bool, owned: bool) -> Id {
        self.nodes.push(Node {
            name: name.map(str::to_owned),
            value,
            owned,
            requires_grad: rg,
            parents: SmallVec::new(),
            op: None,
            cleanup: Vec::new(),
            nats: None,
            released: false,
            pinned: false,
            root: self.nodes.len(),
            holders: 1,
        });
        self.nodes.len() - 1
    }

    /// Add a leaf whose buffer the tape takes over (released by [`reset`](Self::reset)).
    /// Returns its id (the pre-append size of the tape).
    pub fn leaf(&mut self, value: AnyBuffer, name: Option<&str>, requires_grad: bool) -> Id {
        self.push_leaf(value, name, requires_grad, true)
    }

    /// Add a leaf whose buffer stays owned by the caller (a persistent parameter mirror):
    /// [`reset`](Self::reset) leaves it alone. PyTorch: using an `nn.Parameter` in a forward.
    pub fn leaf_borrowed(
        &mut self,
        value: AnyBuffer,
        name: Option<&str>,
        requires_grad: bool,
    ) -> Id {
        self.push_leaf(value, name, requires_grad, false)
    }

    /// Upload a host tensor (converted to f32; see [`crate::wire`]) and add it as an owned leaf.
    pub fn upload_leaf<T: Scalar>(
        &mut self,
        value: &Tensor<T>,
        name: Option<&str>,
        requires_grad: bool,
    ) -> Result<Id> {
        let v = AnyBuffer::upload(&mut self.dev, value)?;
        Ok(self.leaf(v, name, requires_grad))
    }

    pub(crate) fn check_id(&self, what: &str, id: Id) -> Result<&Node> {
        self.nodes.get(id).ok_or_else(|| Error::UnknownId {
            what: what.to_owned(),
            id,
            len: self.nodes.len(),
        })
    }

    /// The value of node `id` for `what`: an error for an unknown id or a released value.
    fn value_of(&self, what: &str, id: Id) -> Result<&AnyBuffer> {
        value_of(&self.nodes, what, id)
    }

    /// Let go of the value of node `id` if no backward can read it: an op node (not a leaf)
    /// that does not require grad and that no node requiring grad reads. Its buffer goes back
    /// to the device once no view of it (`reshape`, `flatten`, `detach`) is left either. The
    /// session calls this when the last handle to a node is dropped (an evaluation pass frees
    /// its intermediate values as it goes, as PyTorch does under `torch.no_grad()`). Returns
    /// whether the value was released; `false` for a node that must keep it or was released
    /// before. Reading a released value, or applying an op to it, is an error naming the node.
    pub fn release(&mut self, id: Id) -> Result<bool> {
        let node = self.check_id("release", id)?;
        if node.op.is_none() || node.requires_grad || node.pinned || node.released {
            return Ok(false);
        }
        self.let_go(id);
        Ok(true)
    }

    /// Let go of op node `id`'s value and workspace, unchecked (the caller knows nothing reads
    /// them: [`release`](Self::release), or a step's backward that has passed the node): the
    /// buffer goes back to the device once no view of it is left. Leaves, and nodes let go of
    /// before, are left alone.
    pub(crate) fn let_go(&mut self, id: Id) {
        let Some(node) = self.nodes.get_mut(id) else {
            return;
        };
        if node.op.is_none() || node.released {
            return;
        }
        node.released = true;
        self.dev.release_all(node.cleanup.drain(..));
        let root = node.root;
        let r = &mut self.nodes[root];
        r.holders -= 1;
        if r.holders == 0 && r.owned {
            self.dev.release(r.value.buffer());
        }
    }

    /// The value at `id`, checked against the shape the caller expects.
    pub fn value(&self, id: Id, expected: &Shape) -> Result<&AnyBuffer> {
        let v = self.value_of("value", id)?;
        if v.shape() != expected {
            return Err(Error::shape("value", id, v.shape(), expected));
        }
        Ok(v)
    }

    /// The value at `id`, whatever its shape.
    pub fn get(&self, id: Id) -> Result<&AnyBuffer> {
        self.value_of("get", id)
    }

    /// Download the value at `id` into a host tensor of `T` (widened from f32 exactly).
    pub fn read<T: Scalar>(&self, id: Id) -> Result<Tensor<T>> {
        self.value_of("read", id)?.download(&self.dev)
    }

    /// Apply a built-in op to `parents`: the shape rule first, then the output's size against
    /// the allocation cap ([`tl_spec::alloc`]), then the device formula. On error the tape is
    /// unchanged and nothing is left allocated.
    pub fn apply(&mut self, op: &Op, parents: &[Id]) -> Result<Id> {
        let fwd = {
            let _precision = crate::precision::install(self.precision);
            let _needs = crate::needs_backward::install(self.requires_grad(op, parents));
            let (nodes, dev, nats) = (&self.nodes, &mut self.dev, &self.nats);
            let inputs = operands(nodes, op, parents)?;
            let shape = output_shape(op, &inputs)?;
            ops::forward(dev, op, &inputs, &shape, nats)?
        };
        Ok(self.push(op, parents, fwd))
    }

    /// TorchLean's `Tape.unary`: record the op `name` on `x` with operand shape `sigma` and
    /// output shape `tau` (both checked dynamically: an error naming the op otherwise),
    /// `forward` on the operand buffer and `backward` (its VJP) on the operand and the output
    /// cotangent. The op is [`user::unary_op`]; build that once to record it many times.
    pub fn unary(
        &mut self,
        name: &'static str,
        x: Id,
        (sigma, tau): (Shape, Shape),
        forward: impl Fn(&mut dyn Device, Buffer) -> Result<Buffer> + Send + Sync + 'static,
        backward: impl Fn(&mut dyn Device, Buffer, Buffer) -> Result<Buffer> + Send + Sync + 'static,
    ) -> Result<Id> {
        let op = user::unary_op(name, sigma, tau, forward, backward);
        self.apply(&Op::User(op), &[x])
    }

    /// TorchLean's `Tape.binary`: [`unary`](Self::unary) for two operands, whose `backward`
    /// gives both cotangents. The op is [`user::binary_op`].
    #[allow(clippy::type_complexity)]
    pub fn binary(
        &mut self,
        name: &'static str,
        (a, b): (Id, Id),
        (sigma1, sigma2, tau): (Shape, Shape, Shape),
        forward: impl Fn(&mut dyn Device, Buffer, Buffer) -> Result<Buffer> + Send + Sync + 'static,
        backward: impl Fn(&mut dyn Device, Buffer, Buffer, Buffer) -> Result<(Buffer, Buffer)>
        + Send
        + Sync
        + 'static,
    ) -> Result<Id> {
        let op = user::binary_op(name, (sigma1, sigma2), tau, forward, backward);
        self.apply(&Op::User(op), &[a, b])
    }

    /// [`apply`](Self::apply) `op` to `parents`, then `next` to `next_args` (among them `op`'s
    /// result, [`Then::First`]); returns both ids. Where `op` ends in a bias add (`linear`,
    /// `conv`, `convTranspose`) and `next` is `relu` or `gelu` of its result, or an `add` of
    /// its result and a value of the same shape (a residual), both values come from one fused
    /// launch ([`Device::add_bias_act`], [`Device::add_bias_residual`]) with the bits of the
    /// separate ones; any other pair is two [`apply`](Self::apply) calls. The compiled
    /// (linked) path reaches it through [`Recorder::apply_then`]. On error the tape is
    /// unchanged and nothing is left allocated, fused or not (an unfused pair whose second
    /// `apply` fails takes its first node back off).
    pub fn apply_then(
        &mut self,
        op: &Op,
        parents: &[Id],
        next: &Op,
        next_args: &[Then],
    ) -> Result<(Id, Id)> {
        let fused = {
            let _precision = crate::precision::install(self.precision);
            let (nodes, dev) = (&self.nodes, &mut self.dev);
            let inputs = operands(nodes, op, parents)?;
            let shape = output_shape(op, &inputs)?;
            let others = next_args
                .iter()
                .filter_map(|a| match *a {
                    Then::Id(id) => Some(id),
                    Then::First => None,
                })
                .collect::<SmallVec<[Id; 3]>>();
            let others = operands(nodes, next, &others)?;
            match ops::fusion(op, next, next_args, &others, &shape) {
                Some(fusion) => {
                    // `next`'s operand shapes in order: `op`'s output where it reads it.
                    let mut k = 0;
                    let in_next: SmallVec<[&Shape; 3]> = next_args
                        .iter()
                        .map(|a| match a {
                            Then::First => &shape,
                            Then::Id(_) => {
                                k += 1;
                                others[k - 1].shape()
                            }
                        })
                        .collect();
                    let next_shape = next.infer_shape(&in_next)?;
                    tl_spec::alloc::check_shape::<f32>(next.name(), &next_shape)?;
                    let shapes = [&shape, &next_shape];
                    Some(ops::forward_then(dev, [op, next], fusion, &inputs, shapes)?)
                }
                None => None,
            }
        };
        let Some((first, second)) = fused else {
            let a = self.apply(op, parents)?;
            let args = Then::resolve(next_args, a);
            return match self.apply(next, &args) {
                Ok(b) => Ok((a, b)),
                Err(e) => {
                    self.pop_last();
                    Err(e)
                }
            };
        };
        let a = self.push(op, parents, first);
        let b = self.push(next, &Then::resolve(next_args, a), second);
        Ok((a, b))
    }

    /// Remove the last node (no node refers to it yet), releasing its workspace and the
    /// value it owns: what an `apply` that must be undone leaves behind.
    fn pop_last(&mut self) {
        if let Some(n) = self.nodes.pop() {
            self.dev.release_all(n.cleanup);
            if n.owned {
                self.dev.release(n.value.buffer());
            } else if let Some(r) = self.nodes.get_mut(n.root) {
                r.holders -= 1;
            }
        }
    }

    /// Record the node `op(parents)` with its forward result; returns its id.
    /// Whether a node of `op` on `parents` requires grad: the op is differentiable and a
    /// parent requires grad (an unknown parent does not: `operands` refuses it).
    fn requires_grad(&self, op: &Op, parents: &[Id]) -> bool {
        op.is_differentiable()
            && parents
                .iter()
                .any(|&p| self.nodes.get(p).is_some_and(|n| n.requires_grad))
    }

    fn push(&mut self, op: &Op, parents: &[Id], fwd: ops::Forward) -> Id {
        let requires_grad = self.requires_grad(op, parents);
        if requires_grad {
            // This node's backward reads its operands' values.
            parents.iter().for_each(|&p| self.nodes[p].pinned = true);
        }
        let id = self.nodes.len();
        // A value the tape does not own is a view of an operand's buffer: it holds that
        // buffer's root until it is released itself.
        let root = match fwd.owned {
            true => id,
            false => parents
                .iter()
                .map(|&p| self.nodes[p].root)
                .find(|&r| self.nodes[r].value.buffer() == fwd.value.buffer())
                .unwrap_or(id),
        };
        if root != id {
            self.nodes[root].holders += 1;
        }
        let mut cleanup = fwd.workspace;
        if !requires_grad {
            // No backward will run through this node: its workspace is dead already.
            self.dev.release_all(cleanup.drain(..));
        }
        self.nodes.push(Node {
            name: None,
            value: fwd.value,
            owned: fwd.owned,
            requires_grad,
            parents: SmallVec::from_slice(parents),
            op: Some(op.clone()),
            cleanup,
            nats: op.reads_nats().then(|| Arc::clone(&self.nats)),
            released: false,
            pinned: false,
            root,
            holders: 1,
        });
        id
    }

    /// Give node `id` a debugging name.
    pub fn set_name(&mut self, id: Id, name: &str) -> Result<()> {
        self.check_id("set_name", id)?;
        self.nodes[id].name = Some(name.to_owned());
        Ok(())
    }

    /// Release every node's workspace (done automatically at the end of each backward).
    /// Returns how many live allocations were freed.
    pub fn release_workspace(&mut self) -> usize {
        let dev = &mut self.dev;
        self.nodes
            .iter_mut()
            .map(|n| dev.release_all(n.cleanup.drain(..)))
            .sum()
    }

    /// Discard every node, releasing the values the tape owns and all workspaces; borrowed
    /// leaves (parameter mirrors) stay live. Returns how many allocations were freed.
    /// PyTorch comparison: dropping the autograd graph before the next forward pass.
    pub fn reset(&mut self) -> usize {
        let mut freed = self.release_workspace();
        let dev = &mut self.dev;
        for n in self.nodes.drain(..) {
            // An owned buffer no holder is left on went back at its release.
            if n.owned && n.holders > 0 && dev.release(n.value.buffer()) {
                freed += 1;
            }
        }
        self.nats = Arc::new(Vec::new());
        freed
    }

    /// [`reset`](Self::reset) the tape and hand back its device, whose caching allocator keeps
    /// the released blocks: the next tape built on it reuses them instead of allocating.
    pub fn into_device(mut self) -> D {
        self.reset();
        self.dev
    }

    /// [`reset`](Self::reset) under the CPU tape's name.
    pub fn clear(&mut self) -> usize {
        self.reset()
    }

    /// Bytes of the values the tape owns and has not let go of, for reports.
    pub fn owned_bytes(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.owned && n.holders > 0)
            .map(|n| n.value.bytes())
            .sum()
    }
}

/// The values of `parents` as `op`'s operands (an unknown id is an error naming `op`).
fn operands<'a>(
    nodes: &'a [Node],
    op: &Op,
    parents: &[Id],
) -> Result<SmallVec<[&'a AnyBuffer; 3]>> {
    parents
        .iter()
        .map(|&p| value_of(nodes, op.name(), p))
        .collect()
}

/// The value of node `id` among `nodes`, for `what`: an error for an unknown id or a released
/// value.
pub(crate) fn value_of<'a>(nodes: &'a [Node], what: &str, id: Id) -> Result<&'a AnyBuffer> {
    let node = nodes.get(id).ok_or_else(|| Error::UnknownId {
        what: what.to_owned(),
        id,
        len: nodes.len(),
    })?;
    match node.released {
        false => Ok(&node.value),
        true => Err(Error::ReleasedValue {
            what: what.to_owned(),
            id,
            op: node.op.as_ref().map_or("leaf", Op::name).to_owned(),
        }),
    }
}

/// `op`'s output shape on `inputs` (its shape rule), refused if its f32 buffer would exceed
/// the allocation cap ([`tl_spec::alloc`]) before the device allocates it.
fn output_shape(op: &Op, inputs: &[&AnyBuffer]) -> Result<Shape> {
    let shapes: SmallVec<[&Shape; 3]> = inputs.iter().map(|v| v.shape()).collect();
    let shape = op.infer_shape(&shapes)?;
    tl_spec::alloc::check_shape::<f32>(op.name(), &shape)?;
    Ok(shape)
}

impl<T: Scalar, D: Device> Recorder<T> for CudaTape<D> {
    type Error = Error;

    fn leaf(&mut self, value: Tensor<T>, name: Option<&str>, requires_grad: bool) -> Result<usize> {
        self.upload_leaf(&value, name, requires_grad)
    }

    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize> {
        CudaTape::apply(self, op, args)
    }

    fn set_nats(&mut self, nats: &[usize]) -> Result<()> {
        CudaTape::set_nats(self, nats.to_vec());
        Ok(())
    }

    fn release(&mut self, id: usize) -> Result<bool> {
        CudaTape::release(self, id)
    }

    fn fuses(&self, op: &Op, next: &Op, next_args: &[Then]) -> bool {
        ops::fusable(op, next, next_args)
    }

    fn apply_then(
        &mut self,
        op: &Op,
        args: &[usize],
        next: &Op,
        next_args: &[Then],
    ) -> Result<(usize, usize)> {
        CudaTape::apply_then(self, op, args, next, next_args)
    }
}
