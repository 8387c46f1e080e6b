//! Reverse accumulation on the CUDA tape: dense (every node), from an explicit
//! gradient array, over the first n nodes, and the sparse parameter-gradient map of TorchLean.
//!
//! Gradients are device buffers the caller owns afterwards; release them with
//! [`CudaTape::release_grads`] / [`CudaTape::release_grad_map`] once consumed (TorchLean:
//! "Release a dense CUDA gradient array after an optimizer has consumed it"). Every backward
//! ends by releasing the nodes' workspaces. On error, every gradient buffer the call holds
//! (including a `grads0` array handed in) is released.

use std::collections::{HashMap, HashSet};

use smallvec::SmallVec;

use crate::device::{Buffer, Device};
use crate::ops::Cotangent;
use crate::tape::{CudaTape, Id};
use crate::{AnyBuffer, Error, Result, ops};

/// Gradient slots during accumulation: `None` = no contribution yet (reads as zeros).
type Slots = Vec<Option<AnyBuffer>>;

impl<D: Device> CudaTape<D> {
    /// Dense reverse accumulation: the gradient of `out` (cotangent `seed`, copied) for every
    /// node id. Nodes that receive no contribution get zeros — the result of a zero-initialized
    /// array seeded at `out`, as in TorchLean.
    pub fn backward_dense(&mut self, out: Id, seed: &AnyBuffer) -> Result<Vec<AnyBuffer>> {
        let copy = self.seed_copy("backward_dense", out, seed)?;
        self.backward_dense_owned(out, copy)
    }

    /// [`backward_dense`](Self::backward_dense) taking ownership of `seed`: its buffer becomes
    /// `out`'s gradient slot, so it is not copied (one launch and buffer fewer; a buffer made
    /// for this call, such as the 1 of a scalar loss). Released on error.
    pub fn backward_dense_owned(&mut self, out: Id, seed: AnyBuffer) -> Result<Vec<AnyBuffer>> {
        let slots = self.seeded_owned("backward_dense", out, seed)?;
        let slots = self.run(slots, out + 1, None, false)?;
        self.densify(slots)
    }

    /// Reverse accumulation over the whole tape from an explicit dense gradient array (one
    /// distinct buffer per node, shapes matching), e.g. to seed several outputs at once. The
    /// tape takes ownership of `grads0`: its buffers are accumulated into and returned.
    pub fn backward_dense_from(&mut self, grads0: Vec<AnyBuffer>) -> Result<Vec<AnyBuffer>> {
        self.backward_first_n(self.len(), grads0)
    }

    /// Reverse accumulation visiting only nodes n−1, …, 0, from `grads0` (as
    /// [`backward_dense_from`](Self::backward_dense_from)).
    pub fn backward_first_n(&mut self, n: usize, grads0: Vec<AnyBuffer>) -> Result<Vec<AnyBuffer>> {
        let check = self.check_grads0(n, &grads0);
        if let Err(e) = check {
            self.dev.release_all(grads0.iter().map(AnyBuffer::buffer));
            return Err(e);
        }
        let slots = grads0.into_iter().map(Some).collect();
        let slots = self.run(slots, n, None, false)?;
        self.densify(slots)
    }

    fn check_grads0(&self, n: usize, grads0: &[AnyBuffer]) -> Result<()> {
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
        let mut seen = HashSet::new();
        for (id, (g, node)) in grads0.iter().zip(&self.nodes).enumerate() {
            if g.shape() != node.value.shape() {
                return Err(Error::shape(
                    "backward_dense_from",
                    id,
                    node.value.shape(),
                    g.shape(),
                ));
            }
            if !seen.insert(g.buffer().id()) {
                return Err(Error::kernel(
                    "backward_dense_from",
                    format!("gradient of id {id} shares its buffer with another id"),
                ));
            }
        }
        Ok(())
    }

    /// Sparse gradients for chosen ids only (the training-loop path): a map from each id of
    /// `wanted` to its gradient (zeros if nothing flowed into it). Gradients of other nodes are
    /// released as soon as the reverse sweep has passed them, so peak memory stays near one
    /// forward pass.
    pub fn backward_params(
        &mut self,
        out: Id,
        seed: &AnyBuffer,
        wanted: &[Id],
    ) -> Result<HashMap<Id, AnyBuffer>> {
        for &w in wanted {
            self.check_id("backward_params", w)?;
        }
        let copy = self.seed_copy("backward_params", out, seed)?;
        self.backward_params_owned(out, copy, wanted)
    }

    /// [`backward_params`](Self::backward_params) taking ownership of `seed`, which becomes
    /// `out`'s gradient slot instead of being copied (as
    /// [`backward_dense_owned`](Self::backward_dense_owned)). Released on error.
    pub fn backward_params_owned(
        &mut self,
        out: Id,
        seed: AnyBuffer,
        wanted: &[Id],
    ) -> Result<HashMap<Id, AnyBuffer>> {
        self.sparse(out, seed, wanted, false)
    }

    /// [`backward_params_owned`](Self::backward_params_owned) for a pass that ends with it (a
    /// training step): each op node's value and workspace go back to the device as soon as the
    /// sweep has passed it (a view's buffer once the view is passed too), so the backward's
    /// cotangents reuse them (PyTorch frees saved tensors the same way unless
    /// `retain_graph=True`). The same gradients, bit for bit. Afterwards the op nodes up to
    /// `out` are released (reading one is an error naming it); leaves keep their values. Read
    /// the loss before.
    pub fn backward_params_releasing(
        &mut self,
        out: Id,
        seed: AnyBuffer,
        wanted: &[Id],
    ) -> Result<HashMap<Id, AnyBuffer>> {
        self.sparse(out, seed, wanted, true)
    }

    /// The sparse backward of [`backward_params_owned`](Self::backward_params_owned), letting
    /// go of the values as it passes them when `release`.
    fn sparse(
        &mut self,
        out: Id,
        seed: AnyBuffer,
        wanted: &[Id],
        release: bool,
    ) -> Result<HashMap<Id, AnyBuffer>> {
        if let Some(e) = wanted
            .iter()
            .find_map(|&w| self.check_id("backward_params", w).err())
        {
            self.dev.release(seed.buffer());
            return Err(e);
        }
        let slots = self.seeded_owned("backward_params", out, seed)?;
        let mut keep = vec![false; self.len()];
        for &w in wanted {
            keep[w] = true;
        }
        let mut slots = self.run(slots, out + 1, Some(&keep), release)?;
        let mut map = HashMap::with_capacity(wanted.len());
        // The sweep may leave one buffer in several slots (a shared identity cotangent): each
        // gradient handed out is a buffer of its own, and no slot released below frees one.
        let mut given = HashSet::with_capacity(wanted.len());
        for &w in wanted {
            // An id listed twice keeps the gradient taken the first time (its slot is empty now).
            if map.contains_key(&w) {
                continue;
            }
            let g = match slots[w].take() {
                Some(g) if given.contains(&g.buffer().id()) => g.copy(&mut self.dev),
                Some(g) => Ok(g),
                None => AnyBuffer::zeros(&mut self.dev, self.nodes[w].value.shape()),
            };
            match g {
                Ok(g) => {
                    given.insert(g.buffer().id());
                    map.insert(w, g);
                }
                Err(e) => {
                    self.release_grad_map(map);
                    self.release_slots(slots);
                    return Err(e);
                }
            }
        }
        let left = slots
            .into_iter()
            .flatten()
            .map(|g| g.buffer())
            .filter(|b| !given.contains(&b.id()));
        self.dev.release_all(left);
        Ok(map)
    }

    /// Release a dense gradient array; returns how many allocations were freed.
    pub fn release_grads(&mut self, grads: Vec<AnyBuffer>) -> usize {
        self.dev.release_all(grads.iter().map(AnyBuffer::buffer))
    }

    /// Release a sparse gradient map; returns how many allocations were freed.
    pub fn release_grad_map(&mut self, grads: HashMap<Id, AnyBuffer>) -> usize {
        self.dev.release_all(grads.values().map(AnyBuffer::buffer))
    }

    fn release_slots(&mut self, slots: Slots) {
        self.dev
            .release_all(slots.into_iter().flatten().map(|g| g.buffer()));
    }

    fn check_seed(&self, what: &str, out: Id, seed: &AnyBuffer) -> Result<()> {
        let node = self.check_id(what, out)?;
        if seed.shape() != node.value.shape() {
            return Err(Error::shape(
                format!("{what} seed"),
                out,
                node.value.shape(),
                seed.shape(),
            ));
        }
        Ok(())
    }

    /// A copy of `seed`, checked against `out` first (nothing is copied for a wrong one).
    fn seed_copy(&mut self, what: &str, out: Id, seed: &AnyBuffer) -> Result<AnyBuffer> {
        self.check_seed(what, out, seed)?;
        seed.copy(&mut self.dev)
    }

    /// The slots with `seed` itself at `out` (released on error).
    fn seeded_owned(&mut self, what: &str, out: Id, seed: AnyBuffer) -> Result<Slots> {
        if let Err(e) = self.check_seed(what, out, &seed) {
            self.dev.release(seed.buffer());
            return Err(e);
        }
        let mut slots: Slots = vec![None; self.len()];
        slots[out] = Some(seed);
        Ok(slots)
    }

    fn densify(&mut self, slots: Slots) -> Result<Vec<AnyBuffer>> {
        let mut out = Vec::with_capacity(slots.len());
        let mut rest = slots.into_iter();
        for node in &self.nodes {
            let Some(slot) = rest.next() else { break };
            let g = match slot {
                Some(g) => Ok(g),
                None => AnyBuffer::zeros(&mut self.dev, node.value.shape()),
            };
            match g {
                Ok(g) => out.push(g),
                Err(e) => {
                    let left: Vec<_> = rest.flatten().map(|g| g.buffer()).collect();
                    self.dev
                        .release_all(out.iter().map(AnyBuffer::buffer).chain(left));
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// The reverse sweep over ids n−1 … 0, then the workspace release. With `release` each op
    /// node's value goes back as the sweep passes it. On error every slot is released.
    fn run(
        &mut self,
        mut slots: Slots,
        n: usize,
        keep: Option<&[bool]>,
        release: bool,
    ) -> Result<Slots> {
        let r = self.sweep(&mut slots, n, keep, release);
        self.release_workspace();
        match r {
            Ok(()) => Ok(slots),
            Err(e) => {
                self.release_slots(slots);
                Err(e)
            }
        }
    }

    /// For each node that requires grad and has a cotangent: run its backward formula and add
    /// each contribution into its parent's slot (in place). Contributions to parents that do
    /// not require grad are never computed (and released at once if a formula produced one).
    /// With `keep` (the sparse path), a node's own slot is released once it has been visited,
    /// or handed to the first parent that takes it as it is ([`Cotangent::Same`]: `add`, `sub`,
    /// `reshape`), which saves that parent a copy; a second such parent shares the buffer
    /// (a residual `x + f(x)` sends the same cotangent to both). A shared buffer is never
    /// written in place: a contribution to a slot whose buffer another slot holds is summed
    /// into a fresh buffer (`add`, the bits of `axpy_assign` with 1) that replaces it, and the
    /// buffer is released by its last holder.
    fn sweep(
        &mut self,
        slots: &mut Slots,
        n: usize,
        keep: Option<&[bool]>,
        release: bool,
    ) -> Result<()> {
        let _precision = crate::precision::install(self.precision);
        let mut shared = Shared::default();
        for id in (0..n).rev() {
            self.visit(id, slots, keep, &mut shared)?;
            if release {
                // Every node that reads it has a higher id: nothing after reads it.
                self.let_go(id);
            }
        }
        Ok(())
    }

    /// One step of [`sweep`](Self::sweep), at node `id`.
    fn visit(
        &mut self,
        id: Id,
        slots: &mut Slots,
        keep: Option<&[bool]>,
        shared: &mut Shared,
    ) -> Result<()> {
        let (nodes, dev) = (&self.nodes, &mut self.dev);
        let node = &nodes[id];
        let Some(op) = node.op.as_ref() else {
            return Ok(());
        };
        if !node.requires_grad {
            return Ok(());
        }
        let Some(g) = slots[id].clone() else {
            return Ok(());
        };
        if g.shape().checked_numel() == Some(0) {
            // An empty value sends nothing to its parents: a backward formula is linear in
            // the cotangent, which has no element (and its loops over the parents' dims
            // could run for hours on an empty [2⁶², 0]). Parents left without a cotangent
            // get zeros.
            if keep.is_some_and(|k| !k[id])
                && let Some(g) = slots[id].take()
            {
                dev.release(g.buffer());
            }
            return Ok(());
        }
        // Never released: this node requires grad, so it pinned its parents.
        if let Some(&p) = node.parents.iter().find(|&&p| nodes[p].released) {
            crate::tape::value_of(nodes, "backward", p)?;
        }
        let inputs: SmallVec<[&AnyBuffer; 3]> =
            node.parents.iter().map(|&p| &nodes[p].value).collect();
        let needs: SmallVec<[bool; 3]> = node
            .parents
            .iter()
            .map(|&p| nodes[p].requires_grad)
            .collect();
        let contribs = ops::backward(
            dev,
            op,
            &inputs,
            &node.value,
            &g,
            &needs,
            &node.cleanup,
            node.nats(),
        )?;
        // The sparse path drops this node's cotangent after the visit, so an identity
        // contribution may take its buffer over (once) instead of copying it.
        let drop_after = keep.is_some_and(|k| !k[id]);
        let mut handed_over = false;
        let mut failed = None;
        for (&p, c) in node.parents.iter().zip(contribs) {
            let Some(c) = c else { continue };
            let parent = &nodes[p];
            let release = |dev: &mut D, c: &Cotangent| {
                if let Cotangent::Owned(a) = c {
                    dev.release(a.buffer());
                }
            };
            if failed.is_some() || !parent.requires_grad {
                release(dev, &c);
                continue;
            }
            if c.shape() != parent.value.shape() {
                release(dev, &c);
                failed = Some(Error::shape(
                    format!("{} backward: contribution to parent", op.name()),
                    p,
                    parent.value.shape(),
                    c.shape(),
                ));
                continue;
            }
            let r = match (c, slots[p].as_mut()) {
                (Cotangent::Owned(c), None) => {
                    slots[p] = Some(c);
                    Ok(())
                }
                (Cotangent::Owned(c), Some(acc)) => {
                    let r = shared.accumulate(dev, acc, c.buffer());
                    dev.release(c.buffer());
                    r
                }
                // Accumulated straight from the output cotangent (no copy first).
                (Cotangent::Same(_), Some(acc)) => shared.accumulate(dev, acc, g.buffer()),
                (Cotangent::Same(shape), None) if drop_after => g.reshaped(shape).map(|c| {
                    slots[p] = Some(c);
                    if handed_over {
                        shared.add_holder(g.buffer());
                    }
                    handed_over = true;
                }),
                (Cotangent::Same(shape), None) => g
                    .copy(dev)
                    .and_then(|c| {
                        c.reshaped(shape).inspect_err(|_| {
                            dev.release(c.buffer());
                        })
                    })
                    .map(|c| slots[p] = Some(c)),
            };
            if let Err(e) = r {
                failed = Some(e);
            }
        }
        if drop_after && let Some(g) = slots[id].take() {
            // Handed over: the buffer now lives in a parent's slot.
            if !handed_over {
                shared.drop_holder(dev, g.buffer());
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The sparse sweep's buffers held by more than one gradient slot: for each, the number of
/// holders beyond the first.
#[derive(Default)]
struct Shared(HashMap<u64, usize>);

impl Shared {
    /// One more slot holds `b`.
    fn add_holder(&mut self, b: Buffer) {
        *self.0.entry(b.id()).or_default() += 1;
    }

    /// Whether `b` left a shared set (another slot still holds it).
    fn leave(&mut self, b: Buffer) -> bool {
        match self.0.get_mut(&b.id()) {
            Some(extra) => {
                *extra -= 1;
                if *extra == 0 {
                    self.0.remove(&b.id());
                }
                true
            }
            None => false,
        }
    }

    /// A slot lets go of `b`: released unless another slot holds it.
    fn drop_holder<D: Device>(&mut self, dev: &mut D, b: Buffer) {
        if !self.leave(b) {
            dev.release(b);
        }
    }

    /// `acc ← acc + x`, `acc` being a slot's value: in place (`axpy_assign` with 1, which
    /// allows `x` to be `acc` itself) when the slot alone holds its buffer; otherwise into a
    /// fresh buffer (`add`: the same bits) that replaces the slot's, leaving the shared one to
    /// its other holders.
    fn accumulate<D: Device>(&mut self, dev: &mut D, acc: &mut AnyBuffer, x: Buffer) -> Result<()> {
        let held = acc.buffer();
        if !self.0.contains_key(&held.id()) {
            return dev.axpy_assign(held, 1.0, x);
        }
        let sum = dev.add(held, x)?;
        *acc = AnyBuffer::new("backward", acc.shape().clone(), sum).inspect_err(|_| {
            dev.release(sum);
        })?;
        self.leave(held);
        Ok(())
    }
}
