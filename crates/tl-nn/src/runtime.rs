//! [`Runtime`]: a session with what a model needs around it — the named parameter store, one
//! training step for both sessions, evaluation passes, and checkpoints.
//!
//! Every forward pass runs inside [`Runtime::step`] or [`Runtime::eval`]. Each starts a fresh
//! pass (the session's reset happens there, before and after), records the model's parameters
//! first (the linked session needs every leaf before the first op), hands the closure a
//! [`Scope`] to create inputs in, and ends the pass whatever the closure returns. There is no
//! way to record tensors outside a pass, so a loop cannot forget the reset and grow.

use std::cell::{Cell, Ref, RefCell, RefMut};
use std::collections::HashMap;

use tl_session::{Optimizer, Param, TensorRef, Train};
use tl_spec::{Scalar, Tensor};

use crate::error::usage;
use crate::listed::Listing;
use crate::{Labels, Module, Parameters, Result, Var, Vars};

/// A session, its named parameters, and the passes run on it. Generic over the session: the
/// same model code runs on `Session` (eager; CPU, CUDA sim, CUDA) and `LinkedSession`.
///
/// PyTorch comparison: the device plus `model.named_parameters()`, with `train_step` written
/// once for you.
///
/// # Listed parameters
///
/// A parameter is *listed* by a model when the model's [`Parameters::visit_params`] visits it
/// (`#[derive(Parameters)]` visits every field). Each pass records the listed parameters
/// first; one the pass reads through [`Scope::param`] (every layer's `forward` does) that
/// the model did not list would train without being counted, saved or loaded. So:
/// - [`Runtime::step`] fails with [`crate::Error::Unlisted`] naming them, before the backward
///   pass (no parameter or optimizer state changes);
/// - [`Runtime::eval`], [`Runtime::forward_train`] and [`Runtime::record`] succeed, and the
///   runtime remembers the gap for that model (known by the set of parameters it lists);
/// - [`Runtime::num_params`], [`Runtime::save`] (`save_with`, `state_dict`),
///   [`Runtime::load`] and [`Runtime::summary`] fail with the same error for a model whose
///   passes, or the passes of a model inside it (whose listed set is a non-empty part of its
///   own), used parameters it still does not list.
///
/// Before a model's first pass there is nothing to compare with: the gap shows at its first
/// `step`.
pub struct Runtime<O: Train> {
    session: RefCell<O>,
    /// Every parameter created through [`Vars`], by full name, in creation order.
    names: RefCell<Vec<(String, Param)>>,
    /// Parameter index → its leaf in the open pass.
    leaves: RefCell<HashMap<usize, TensorRef>>,
    /// Whether the open pass trains (dropout on, batch norm on batch statistics).
    training: Cell<bool>,
    /// The parameters passes used that their model did not list (`crate::listed`).
    pub(crate) listing: RefCell<Listing>,
    /// The data-parallel group this runtime is a rank of (`Runtime::data_parallel`).
    pub(crate) group: Option<crate::dist::Group>,
    /// The optimizer steps this runtime has taken (`Runtime::step`, `step_accumulated`: those
    /// that succeeded); `Runtime::data_parallel` is refused after the first.
    pub(crate) steps_taken: u64,
    /// The running-statistics updates of a training step's forward, while it runs
    /// (`crate::running`); `None` outside a step's forward.
    pub(crate) deferred: RefCell<Option<Vec<crate::running::Deferred>>>,
}

impl<O: Train> Runtime<O> {
    /// A runtime over `session`. Parameters are created through [`Runtime::vars`].
    pub fn new(session: O) -> Self {
        Runtime {
            session: RefCell::new(session),
            names: RefCell::new(Vec::new()),
            leaves: RefCell::new(HashMap::new()),
            training: Cell::new(false),
            listing: RefCell::new(Listing::default()),
            group: None,
            steps_taken: 0,
            deferred: RefCell::new(None),
        }
    }

    /// The root of the parameter namespace: layers take a [`Vars`] (`vars().pp("encoder")`) and
    /// create their parameters under its prefix.
    pub fn vars(&self) -> Vars<'_, O> {
        Vars::root(self)
    }

    /// The session, for calls tl-nn does not wrap.
    pub fn session(&self) -> Ref<'_, O> {
        self.session.borrow()
    }

    /// The session, mutably.
    pub fn session_mut(&mut self) -> &mut O {
        self.session.get_mut()
    }

    /// The session back, with the parameters' values in it.
    pub fn into_session(self) -> O {
        self.session.into_inner()
    }

    pub(crate) fn borrow_mut(&self) -> RefMut<'_, O> {
        self.session.borrow_mut()
    }

    pub(crate) fn training(&self) -> bool {
        self.training.get()
    }

    /// Register a new parameter named `name` (full path); a name used twice is an error.
    pub(crate) fn create(
        &self,
        name: String,
        init: Tensor<O::T>,
        requires_grad: bool,
    ) -> Result<Param> {
        if self.names.borrow().iter().any(|(n, _)| *n == name) {
            return Err(usage(
                "Vars::param",
                format!(
                    "a parameter named {name:?} exists already; give each layer its own prefix (vars.pp(\"…\"))"
                ),
            ));
        }
        let p = self
            .session
            .borrow_mut()
            .param(init, Some(&name), requires_grad)?;
        self.names.borrow_mut().push((name, p.clone()));
        Ok(p)
    }

    /// The next key of the session's counter RNG (seeded by the session's seed).
    pub(crate) fn next_key(&self) -> Result<u64> {
        let (seed, counter) = self.session.borrow_mut().next_random_key()?;
        Ok(tl_spec::rng::key(seed, counter))
    }

    /// Every parameter created in this runtime, with its full name, in creation order.
    pub fn named_params(&self) -> Vec<(String, Param)> {
        self.names.borrow().clone()
    }

    /// The full name of `p` (`blocks.0.attn.wq`), or `param<index>` for a parameter not
    /// created through this runtime's [`Vars`].
    pub(crate) fn name_of(&self, p: &Param) -> String {
        self.names
            .borrow()
            .iter()
            .find(|(_, q)| q == p)
            .map_or_else(|| format!("param{}", p.index()), |(n, _)| n.clone())
    }

    /// `model`'s parameters with their full names, in the model's order. PyTorch:
    /// `model.named_parameters()` plus its buffers (batch norm's running statistics).
    pub fn named_params_of<M: Parameters + ?Sized>(&self, model: &M) -> Vec<(String, Param)> {
        let mut out = Vec::new();
        model.visit_params(&mut |p| out.push((self.name_of(p), p.clone())));
        out
    }

    /// The number of scalar values in `model`'s trainable parameters. PyTorch:
    /// `sum(p.numel() for p in model.parameters() if p.requires_grad)`. An error naming them
    /// when `model` does not list parameters its passes used (see "Listed parameters").
    pub fn num_params<M: Parameters + ?Sized>(&self, model: &M) -> Result<usize> {
        self.check_listed("Runtime::num_params", model)?;
        let s = self.session.borrow();
        let mut n = 0;
        for (_, p) in self.named_params_of(model) {
            if s.requires_grad(&p)? {
                n += p.shape().numel();
            }
        }
        Ok(n)
    }

    /// Freeze (or unfreeze) every parameter of `model` whose full name starts with `prefix`
    /// (`""` for all); returns how many changed. PyTorch: `p.requires_grad_(False)` for each.
    pub fn set_trainable<M: Parameters + ?Sized>(
        &mut self,
        model: &M,
        prefix: &str,
        trainable: bool,
    ) -> Result<usize> {
        let mut n = 0;
        for (name, p) in self.named_params_of(model) {
            if name.starts_with(prefix) && !is_buffer(&name) {
                self.session.get_mut().set_requires_grad(&p, trainable)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// A parameter's current value.
    pub fn value_of(&self, p: &Param) -> Result<Tensor<O::T>> {
        Ok(self.session.borrow_mut().param_value(p)?)
    }

    /// Overwrite a parameter's value (same shape).
    pub fn set_value(&self, p: &Param, value: Tensor<O::T>) -> Result<()> {
        Ok(self.session.borrow_mut().set_param(p, value)?)
    }

    /// Open a pass: a fresh recording with `model`'s parameters recorded first; without
    /// gradients (`grad` false: [`tl_session::Ops::set_grad_enabled`]) for an evaluation.
    pub(crate) fn begin<M: Parameters + ?Sized>(
        &self,
        model: &M,
        training: bool,
        grad: bool,
    ) -> Result<()> {
        // A step whose closure panicked left its deferral open: this pass applies its own.
        self.deferred.borrow_mut().take();
        let mut s = self.session.borrow_mut();
        s.reset();
        s.set_grad_enabled(grad);
        let mut leaves = self.leaves.borrow_mut();
        leaves.clear();
        self.training.set(training);
        let mut params = Vec::new();
        model.visit_params(&mut |p| params.push(p.clone()));
        self.listing
            .borrow_mut()
            .begin(params.iter().map(Param::index));
        for p in params {
            if let std::collections::hash_map::Entry::Vacant(e) = leaves.entry(p.index()) {
                e.insert(s.use_param(&p)?);
            }
        }
        Ok(())
    }

    /// Close the pass: every handle of it becomes invalid and its buffers are released.
    pub(crate) fn end(&self) {
        self.listing.borrow_mut().end();
        self.leaves.borrow_mut().clear();
        let mut s = self.session.borrow_mut();
        s.reset();
        s.set_grad_enabled(true);
        self.training.set(false);
    }

    /// The leaf of `p` in the open pass (recorded on first use if the model did not list it).
    pub(crate) fn param_leaf(&self, p: &Param) -> Result<TensorRef> {
        if let Some(r) = self.leaves.borrow().get(&p.index()) {
            return Ok(r.clone());
        }
        self.listing.borrow_mut().note(p.index());
        let r = self.session.borrow_mut().use_param(p).map_err(|e| {
            usage(
                "Scope::param",
                format!(
                    "parameter {:?} is not listed by the model given to step/eval (its visit_params), and could not be recorded now: {e}",
                    self.name_of(p)
                ),
            )
        })?;
        self.leaves.borrow_mut().insert(p.index(), r.clone());
        Ok(r)
    }

    /// One training step: a fresh pass in training mode, `loss_fn`'s scalar loss, backward,
    /// one step of `opt` on `model`'s trainable parameters; returns the loss. The pass is ended
    /// (reset) before this returns, also on error.
    ///
    /// PyTorch: `model.train(); opt.zero_grad(); loss = loss_fn(); loss.backward(); opt.step();
    /// loss.item()`.
    ///
    /// Running statistics (BatchNorm's) move once the forward and its loss are through: a
    /// step that stops there (its closure fails, or `opt` refuses a non-finite loss:
    /// [`Optimizer::stop_on_non_finite_loss`]) changes nothing; one that fails later (an
    /// update refused by [`Optimizer::check_finite`]) has updated them.
    ///
    /// In a data-parallel group ([`Runtime::data_parallel`]) the ranks exchange their status
    /// and average their gradients between the backward and the update (clipping and the
    /// update see the mean); a rank's failure is every rank's error, and no rank updates. The
    /// loss returned is this rank's. A `model` with a parameter outside the one the group was
    /// set up with is such a failure (naming the parameter).
    pub fn step<M, F>(&mut self, model: &M, opt: &mut Optimizer, loss_fn: F) -> Result<f64>
    where
        M: Parameters + ?Sized,
        F: for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
    {
        let begun = self
            .check_group_model("Runtime::step", model)
            .and_then(|()| self.begin(model, true, true));
        let forward = begun.and_then(|()| self.training_loss("Runtime::step", opt, loss_fn));
        // In a data-parallel group every rank hears of this rank's outcome, also a failure.
        let r = if self.group.is_some() {
            self.dist_backward_step(forward, opt, None)
        } else {
            // The pass ends with the step: the CPU update writes the parameters in place.
            forward.and_then(|r| {
                let mut s = self.session.borrow_mut();
                Ok(s.backward_step_reduced_then_reset(&r, opt, None)?)
            })
        };
        self.end();
        if r.is_ok() {
            self.steps_taken += 1;
        }
        r
    }

    /// The scalar loss `loss_fn` records in the open training pass, for `call` (`Runtime::step`
    /// and its kin): an error for a parameter the model does not list (also when the pass
    /// failed because of it: a linked session cannot record it after the first op), a tensor
    /// of another pass or a loss that is not a scalar. The running statistics the forward
    /// updates change once it is through, unless `opt` stops the step at its loss
    /// (`crate::running`).
    pub(crate) fn training_loss<F>(
        &self,
        call: &'static str,
        opt: &Optimizer,
        loss_fn: F,
    ) -> Result<TensorRef>
    where
        F: for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
    {
        self.deferring_running(opt, || self.scalar_loss(call, loss_fn))
    }

    /// [`training_loss`](Self::training_loss)'s forward and checks.
    fn scalar_loss<F>(&self, call: &'static str, loss_fn: F) -> Result<TensorRef>
    where
        F: for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
    {
        let scope = Scope { rt: self };
        let loss = loss_fn(&scope);
        self.check_pass_listed(call)?;
        let loss = loss?;
        loss.check_here(call)?;
        if !loss.shape().is_scalar() {
            return Err(usage(
                call,
                format!(
                    "the closure must return a scalar loss, got shape {}",
                    loss.shape()
                ),
            ));
        }
        Ok(loss.tensor_ref().clone())
    }

    /// An evaluation pass: a fresh pass in eval mode (no dropout; batch norm on its running
    /// statistics), `f`'s output read back as a host tensor; no parameter change, and no
    /// gradients: the pass is recorded with gradients off
    /// ([`tl_session::Ops::set_grad_enabled`]), so no op keeps what only a backward reads
    /// (gelu's tanh term, attention's probabilities, the norms' row statistics), and the values
    /// are the bits a pass with gradients gives. Each intermediate value goes when its last
    /// [`Var`] is dropped (the session releases it: nothing that requires grad reads it), so
    /// the pass holds about one layer's values at a time. PyTorch: `model.eval(); with
    /// torch.no_grad(): f().cpu()`.
    pub fn eval<M, F>(&self, model: &M, f: F) -> Result<Tensor<O::T>>
    where
        M: Parameters + ?Sized,
        F: for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
    {
        self.pass(model, false, false, f)
    }

    /// A forward pass in training mode without a step (dropout on, batch norm on batch
    /// statistics and updating its running statistics). PyTorch: `model.train(); f()`.
    pub fn forward_train<M, F>(&self, model: &M, f: F) -> Result<Tensor<O::T>>
    where
        M: Parameters + ?Sized,
        F: for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
    {
        self.pass(model, true, true, f)
    }

    /// Record one forward pass of `f` (in training mode when `training`) and hand the session
    /// and the output's handle to `inspect` before the pass ends: to read a linked session's
    /// graph, compile it, check its gradients against the pure IR backprop, or take a JVP.
    /// Nothing is stepped; the pass is reset afterwards, also on error.
    pub fn record<M, F, G, R>(&self, model: &M, training: bool, f: F, inspect: G) -> Result<R>
    where
        M: Parameters + ?Sized,
        F: for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
        G: FnOnce(&mut O, &TensorRef) -> Result<R>,
    {
        self.begin(model, training, true)?;
        let r = (|| {
            let scope = Scope { rt: self };
            let out = f(&scope)?;
            out.check_here("Runtime::record")?;
            let r = out.tensor_ref().clone();
            inspect(&mut self.session.borrow_mut(), &r)
        })();
        self.end();
        r
    }

    /// A pass whose output is read back (in training mode when `training`, with gradients
    /// when `grad`).
    fn pass<M, F>(&self, model: &M, training: bool, grad: bool, f: F) -> Result<Tensor<O::T>>
    where
        M: Parameters + ?Sized,
        F: for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
    {
        self.begin(model, training, grad)?;
        let r = (|| {
            let scope = Scope { rt: self };
            let out = f(&scope)?;
            out.check_here("Runtime::eval")?;
            let r = out.tensor_ref().clone();
            Ok(self.session.borrow_mut().read(&r)?)
        })();
        self.end();
        r
    }

    /// Classification accuracy of `model` on `(x, labels)` in batches of `batch` rows of `x`'s
    /// leading axis: the share of rows whose largest logit is the label. Labels of more classes
    /// than the model has logits are an error naming both numbers.
    pub fn accuracy<M>(
        &self,
        model: &M,
        x: &Tensor<O::T>,
        labels: &Labels,
        batch: usize,
    ) -> Result<f64>
    where
        M: Module<O> + ?Sized,
    {
        let rows = x.shape().dims().first().copied().unwrap_or(0);
        if rows != labels.len() || rows == 0 || batch == 0 {
            return Err(usage(
                "Runtime::accuracy",
                format!(
                    "need one label per row of x and batch ≥ 1, got x {}, {} labels, batch {batch}",
                    x.shape(),
                    labels.len()
                ),
            ));
        }
        let mut correct = 0usize;
        let mut start = 0;
        while start < rows {
            let n = batch.min(rows - start);
            let xb = crate::data::rows(x, start, n)?;
            let logits = self.eval(model, |g| model.forward(&g.input(xb)?))?;
            let classes = logits.shape().dims().last().copied().unwrap_or(1);
            if labels.classes() > classes {
                return Err(usage(
                    "Runtime::accuracy",
                    format!(
                        "the labels have {} classes but the model gives {classes} logits per row (logits {})",
                        labels.classes(),
                        logits.shape()
                    ),
                ));
            }
            let pred = logits.argmax(logits.shape().rank().saturating_sub(1))?;
            correct += pred
                .iter()
                .zip(&labels.values()[start..start + n])
                .filter(|(p, l)| p == l)
                .count();
            start += n;
        }
        Ok(correct as f64 / rows as f64)
    }
}

/// Whether a parameter name is a buffer (batch norm's running statistics), never trained.
pub(crate) fn is_buffer(name: &str) -> bool {
    name.ends_with("running_mean") || name.ends_with("running_var")
}

/// An open pass: where a forward pass creates its inputs and constants. Only
/// [`Runtime::step`] and [`Runtime::eval`] make one, and the pass ends when they return.
pub struct Scope<'g, O: Train> {
    pub(crate) rt: &'g Runtime<O>,
}

impl<'g, O: Train> Clone for Scope<'g, O> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<'g, O: Train> Copy for Scope<'g, O> {}

impl<'g, O: Train> Scope<'g, O> {
    /// An input (no gradient), created at any point of the pass: a linked session records it
    /// as a leaf before the pass's first op and as a constant node after (its graph's leaves
    /// must come first). PyTorch: a plain tensor argument.
    pub fn input(&self, value: Tensor<O::T>) -> Result<Var<'g, O>> {
        let r = self.rt.borrow_mut().constant(value)?;
        Ok(Var::new(self.rt, r))
    }

    /// A named input (the name shows in the linked session's graph, where it is a leaf, so
    /// it must come before the pass's first op there). PyTorch: a named input.
    pub fn input_named(&self, value: Tensor<O::T>, name: &str) -> Result<Var<'g, O>> {
        let r = self.rt.borrow_mut().input_named(value, Some(name), false)?;
        Ok(Var::new(self.rt, r))
    }

    /// An input whose gradient is wanted (read it with `Var::grad` in eager sessions).
    /// PyTorch: `x.requires_grad_()`.
    pub fn input_grad(&self, value: Tensor<O::T>) -> Result<Var<'g, O>> {
        let r = self.rt.borrow_mut().input(value, true)?;
        Ok(Var::new(self.rt, r))
    }

    /// A constant. PyTorch: `torch.tensor(...)`.
    pub fn constant(&self, value: Tensor<O::T>) -> Result<Var<'g, O>> {
        let r = self.rt.borrow_mut().constant(value)?;
        Ok(Var::new(self.rt, r))
    }

    /// A constant scalar `v` broadcast to `shape`.
    pub fn full(&self, shape: &[usize], v: f64) -> Result<Var<'g, O>> {
        // The shape is input: checked against the allocation cap.
        self.constant(Tensor::try_full("Scope::full", shape, O::T::lit(v))?)
    }

    /// The parameter `p` in this pass.
    pub fn param(&self, p: &Param) -> Result<Var<'g, O>> {
        Ok(Var::new(self.rt, self.rt.param_leaf(p)?))
    }

    /// Whether this pass trains (dropout on, batch norm on batch statistics).
    pub fn training(&self) -> bool {
        self.rt.training()
    }
}
