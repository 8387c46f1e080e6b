//! A model of your own under the harness: [`check_model`] runs it on every session and holds
//! each one's output and gradients to the f64 reference, and that reference to finite
//! differences (PyTorch's `torch.autograd.gradcheck`, for a whole tl-nn model and on every
//! session the model may train on).
//!
//! Each case draws the inputs (uniform in ±2, f32-representable) and a seed, builds the model
//! on a `LinkedSession<f64>` from that seed, rounds its parameters to f32 and gives every
//! session those values. The output of one pass ([`UserModel::forward`], in training mode
//! unless [`UserModel::training`] says otherwise) is reduced to a scalar with a random
//! cotangent `c` (`L = ⟨c, output⟩`), and its gradients with respect to every trainable
//! parameter and every input are taken. The reference is the pass recorded on a
//! `LinkedSession<f64>`, its graph evaluated and differentiated by the IR (`GraphData::eval`,
//! `backward_dense_all`: the ops' own value and VJP rules, not the kernels a session compiles
//! to). The checks:
//!
//! - `model fd <name>`: the f64 reference's gradients against central differences of `L`, at
//!   [`FD_COORDS`] coordinates of each parameter and input (step [`FD_STEP`] relative to the
//!   value); a coordinate where the differences with step h and h/4 disagree sits on a kink
//!   (a ReLU at 0, a max's tie) and is passed over (a case whose every probed coordinate
//!   does fails). Tolerance [`Tol::DEFAULT`]'s `fd`.
//! - `model <name> <session>`: each of the eager CPU (f64, f32), eager CUDA simulation (f32),
//!   linked f32 and linked CUDA simulation (f32) sessions gives the reference's output and
//!   gradients, within [`Tol::DEFAULT`]'s f64 tolerance, or its f32 tolerance scaled by the
//!   pass's longest reduction ([`reduction_len`] of its graph, as checks 1 and 2 scale theirs).
//! - `model step <name> <session>`: [`STEPS`] training steps (`Runtime::step`, the path a
//!   training loop takes: its backward that keeps the parameters' gradients only and lets go of
//!   the forward's buffers as it passes them, the update in place, what a linked session keeps
//!   from one step to the next) of momentum SGD ([`STEP_LR`], [`STEP_MOMENTUM`]) on the loss
//!   `⟨c, output⟩`, on each of those sessions and the linked f64 one, against the same steps
//!   taken here in f64 with the reference's gradients (PyTorch's rule, written out: `b ← μ·b +
//!   g`, `b = g` at the first step, `w ← w − lr·b`). The rule is linear in the gradients, so
//!   each trainable parameter's total update divided by the rate, `(w₀ − w)/lr`, is held to the
//!   gradients' tolerance. The steps are training passes whatever [`UserModel::training`] says,
//!   as `Runtime::step`'s are.
//!
//! Where an f32 session misses the tolerance in a pass or step row, the comparison is made
//! again with each tensor's tolerance at least [`crate::checks::REFERENCE_ERROR_FACTOR`] times
//! the reference's own error there in f32 (`floors`: a drawn case can pass within f32's
//! rounding of a ReLU's or a max pool's kink, where every f32 computation takes the other
//! branch); away from a kink the floors are far under the tolerance.
//!
//! With tl-conformance's feature `cuda-emu` (or `cuda` and a GPU) both kinds of row also run
//! on the CUDA device, eager and linked (on the emulator twice: each block's threads forward
//! and reversed); without it [`check_model`] lists those rows as skipped, saying why.
//!
//! Dropout draws the same masks on every session and in every pass of a case (the random
//! counter is set before each pass and step); batch norm uses the batch's statistics in
//! training mode.

mod floors;

use std::cell::RefCell;

use proptest::prelude::*;
use tl_nn::{Parameters, Runtime, Scope, Var, Vars};
use tl_session::{Backend, LinkedSession, Ops, Optimizer, Param, TensorRef, Train};
use tl_spec::{Scalar, Shape, Tensor};

use crate::checks::reduction_len;
use crate::generate::tensor;
use crate::nn::{LayerSession, NN_SEED, NnSession, SessionCheck, close, on_session};
use crate::user::SuiteReport;
use crate::{ANY, CaseResult, Measured, Report, RunConfig, Tol, run_check};
use floors::Arith;

/// Coordinates of each parameter and input that finite differences probe per case.
pub const FD_COORDS: usize = 4;

/// The finite-difference step, relative to the coordinate's magnitude (at least this much).
pub const FD_STEP: f64 = 1e-6;

/// The model's random counter at the start of every pass of a case.
const COUNTER: u64 = 0;

/// The step check's learning rate (momentum SGD).
pub const STEP_LR: f64 = 0.1;

/// The step check's momentum.
pub const STEP_MOMENTUM: f64 = 0.9;

/// The steps the step check takes per case: the second reads the first's momentum buffers and
/// what a linked session keeps between steps (its device's pools and the parameters resident
/// there, its CPU tape's buffer pool).
pub const STEPS: usize = 2;

/// Your model as [`check_model`] takes it: how to build it on any session, and one pass.
///
/// ```
/// use tl_conformance::RunConfig;
/// use tl_conformance::model::{UserModel, check_model};
/// use tl_nn::{Activation, Linear, Module, Scope, Sequential, Var, Vars};
/// use tl_session::Train;
/// use tl_spec::Shape;
///
/// struct Mlp;
///
/// impl UserModel for Mlp {
///     type Model<O: Train> = Sequential<O>;
///
///     fn name(&self) -> String {
///         "mlp".into()
///     }
///     fn build<O: Train>(&self, v: &Vars<'_, O>) -> tl_nn::Result<Sequential<O>> {
///         Ok(Sequential::new()
///             .add(Linear::new(&v.pp(0), 4, 8)?)
///             .add(Activation::Tanh)
///             .add(Linear::new(&v.pp(2), 8, 3)?))
///     }
///     fn inputs(&self) -> Vec<Shape> {
///         vec![Shape::new(&[5, 4])]
///     }
///     fn forward<'g, O: Train>(
///         &self,
///         m: &Sequential<O>,
///         _g: &Scope<'g, O>,
///         x: &[Var<'g, O>],
///     ) -> tl_nn::Result<Var<'g, O>> {
///         m.forward(&x[0])
///     }
/// }
///
/// let report = check_model(&Mlp, &RunConfig { cases: 8, ..RunConfig::default() });
/// assert!(report.passed(), "{report}");
/// // Without tl-conformance's cuda-emu feature the CUDA device's rows (eager and linked, a
/// // pass and the steps) are skipped, and said.
/// # #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
/// assert_eq!(report.summary(), "mlp: 12 passed, 0 failed, 4 skipped");
/// ```
pub trait UserModel {
    /// The model on a session of type `O`: a tl-nn layer, a `Sequential`, or a struct of your
    /// own (`#[derive(Parameters)]`).
    type Model<O: Train>: Parameters;

    /// The name in the reports.
    fn name(&self) -> String;

    /// Build the model, its parameters under `vars` (initialised from the session's seed:
    /// [`check_model`] then sets their values itself).
    fn build<O: Train>(&self, vars: &Vars<'_, O>) -> tl_nn::Result<Self::Model<O>>;

    /// The shapes of the pass's inputs, in the order [`UserModel::forward`] takes them (each
    /// drawn uniform in ±2 and differentiated). Integer inputs (token ids, labels) belong in
    /// the implementing struct.
    fn inputs(&self) -> Vec<Shape>;

    /// One pass: the model's output on the inputs `x` (any shape; a loss is a scalar).
    fn forward<'g, O: Train>(
        &self,
        model: &Self::Model<O>,
        g: &Scope<'g, O>,
        x: &[Var<'g, O>],
    ) -> tl_nn::Result<Var<'g, O>>;

    /// Whether the pass is a training one (dropout on, batch norm on the batch's statistics):
    /// `true` unless said otherwise.
    fn training(&self) -> bool {
        true
    }
}

/// One case: the inputs and the seed of the model's parameters and the cotangent.
#[derive(Debug, Clone)]
pub struct ModelCase {
    /// The inputs, f32-representable.
    pub inputs: Vec<Tensor<f64>>,
    /// The seed the model is built from and the cotangent drawn from.
    pub seed: u64,
}

/// What one pass gave on a session: the output, the trainable parameters' gradients then the
/// inputs', and (the reference's) the length of the pass's longest reduction, forward or
/// backward ([`reduction_len`] of its graph), which scales the f32 tolerance.
struct Pass<T: Scalar> {
    value: Tensor<T>,
    grads: Vec<Tensor<T>>,
    reduction: usize,
}

/// The cases of `model`: its inputs drawn uniform in ±2 and rounded to f32, and a seed.
pub fn model_cases<M: UserModel>(model: &M) -> BoxedStrategy<ModelCase> {
    let inputs: Vec<BoxedStrategy<Tensor<f64>>> = model
        .inputs()
        .into_iter()
        .map(|s| tensor(s, ANY).prop_map(|t| t.cast::<f32>().cast()).boxed())
        .collect();
    (inputs, any::<u64>())
        .prop_map(|(inputs, seed)| ModelCase { inputs, seed })
        .boxed()
}

/// The cotangent `c` of a case for an output of `shape`: standard normal, rounded to f32.
fn cotangent(shape: &Shape, seed: u64) -> Tensor<f64> {
    Tensor::<f64>::randn(shape.clone(), seed ^ 0x5EED)
        .cast::<f32>()
        .cast()
}

/// The initial parameter values of `model` built on a session seeded with `seed`, rounded to
/// f32: every session of a case gets these.
fn initial_values<M: UserModel>(model: &M, seed: u64) -> Result<Vec<Tensor<f64>>, String> {
    let rt = Runtime::new(LinkedSession::<f64>::with_seed(seed));
    let m = model
        .build(&rt.vars())
        .map_err(|e| format!("building the model: {e}"))?;
    let mut params = Vec::new();
    m.visit_params(&mut |p| params.push(p.clone()));
    params
        .iter()
        .map(|p| rt.value_of(p).map(|t| t.cast::<f32>().cast()))
        .collect::<tl_nn::Result<_>>()
        .map_err(|e| e.to_string())
}

/// A model built on a session with given parameter values.
struct Built<M: UserModel, O: Train> {
    model: M::Model<O>,
    /// Every parameter, in `visit_params` order (the order of the values).
    params: Vec<Param>,
    /// The trainable ones.
    trainable: Vec<Param>,
    /// Where each trainable one sits in `params`.
    at: Vec<usize>,
}

/// The model built on `rt` with its parameters set to `values`.
fn built<M: UserModel, O: Train>(
    model: &M,
    rt: &Runtime<O>,
    values: &[Tensor<f64>],
) -> Result<Built<M, O>, String> {
    let m = model
        .build(&rt.vars())
        .map_err(|e| format!("building the model: {e}"))?;
    let mut params = Vec::new();
    m.visit_params(&mut |p| params.push(p.clone()));
    if params.len() != values.len() {
        return Err(format!(
            "the model has {} parameters on this session, {} on the reference",
            params.len(),
            values.len()
        ));
    }
    let (mut trainable, mut at) = (Vec::new(), Vec::new());
    for (k, (p, v)) in params.iter().zip(values).enumerate() {
        rt.set_value(p, v.cast())
            .map_err(|e| format!("set_value: {e}"))?;
        if rt.session().requires_grad(p).map_err(|e| e.to_string())? {
            trainable.push(p.clone());
            at.push(k);
        }
    }
    Ok(Built {
        model: m,
        params,
        trainable,
        at,
    })
}

/// How a recorded pass is read: `(session, output, [trainable, inputs], cotangent seed)`.
type Read<O> = fn(&mut O, &TensorRef, &[TensorRef], u64) -> tl_nn::Result<Pass<<O as Ops>::T>>;

/// The session's own output and gradients of `⟨c, output⟩` (`c` from `seed`).
fn session_read<O: LayerSession>(
    s: &mut O,
    out: &TensorRef,
    wrt: &[TensorRef],
    seed: u64,
) -> tl_nn::Result<Pass<O::T>> {
    let value = s.read(out)?;
    let c = cotangent(value.shape(), seed).cast();
    let grads = s.seeded_grads(out, c, wrt)?;
    Ok(Pass {
        value,
        grads,
        reduction: 0,
    })
}

/// The reference: the linked session's graph evaluated by the IR (`GraphData::eval`, the ops'
/// own values, not the kernels the session compiles to) and differentiated by it
/// (`backward_dense_all`, their VJPs).
fn ir_read(
    s: &mut LinkedSession<f64>,
    out: &TensorRef,
    wrt: &[TensorRef],
    seed: u64,
) -> tl_nn::Result<Pass<f64>> {
    let value = ir_value(s, out)?;
    let c = cotangent(value.shape(), seed);
    let grads = s.seeded_grads(out, c, wrt)?;
    Ok(Pass {
        value,
        grads,
        reduction: reduction_len(s.graph()),
    })
}

/// The IR's value of `out` in the linked session's graph.
fn ir_value(s: &mut LinkedSession<f64>, out: &TensorRef) -> tl_nn::Result<Tensor<f64>> {
    let leaves = s.leaf_values()?.to_vec();
    let nats = s.nats().to_vec();
    let mut all = s.graph().eval(&leaves, &nats)?;
    if out.id() >= all.len() {
        return Err(tl_nn::Error::Usage {
            what: "check_model",
            detail: format!("the output's id {} is not in the pass's graph", out.id()),
        });
    }
    Ok(all.swap_remove(out.id()))
}

/// One pass of `model` (`b` on `rt`) with `inputs`, a training one when `training`: the output
/// and the gradients of `⟨c, output⟩` with respect to the trainable parameters then the inputs,
/// as `read` gives them.
fn pass<M: UserModel, O: LayerSession>(
    model: &M,
    rt: &mut Runtime<O>,
    b: &Built<M, O>,
    inputs: &[Tensor<f64>],
    seed: u64,
    training: bool,
    read: Read<O>,
) -> Result<Pass<O::T>, String> {
    let (m, trainable) = (&b.model, &b.trainable);
    rt.session_mut().set_random_counter(COUNTER);
    let refs: RefCell<Vec<TensorRef>> = RefCell::new(Vec::new());
    let out = rt.record(
        m,
        training,
        |g| {
            let xs = inputs
                .iter()
                .map(|x| g.input_grad(x.cast()))
                .collect::<tl_nn::Result<Vec<_>>>()?;
            let mut r = refs.borrow_mut();
            for p in trainable {
                r.push(g.param(p)?.tensor_ref().clone());
            }
            r.extend(xs.iter().map(|x| x.tensor_ref().clone()));
            drop(r);
            model.forward(m, g, &xs)
        },
        |s, out| read(s, out, &refs.borrow(), seed),
    );
    out.map_err(|e| format!("the pass failed: {e}"))
}

/// The reference pass of a case and the parameter values every session gets.
struct Reference {
    run: Pass<f64>,
    values: Vec<Tensor<f64>>,
}

/// The f64 reference of a case: a linked session's pass.
fn reference<M: UserModel>(model: &M, case: &ModelCase) -> Result<Reference, String> {
    let values = initial_values(model, case.seed)?;
    let (run, _) = reference_pass(model, case, &values, model.training(), Arith::F64)?;
    Ok(Reference { run, values })
}

/// The reference's pass of `case` with the parameters at `values` (a training pass when
/// `training`), its graph evaluated and differentiated in `arith`, and where each trainable
/// parameter sits among the values.
fn reference_pass<M: UserModel>(
    model: &M,
    case: &ModelCase,
    values: &[Tensor<f64>],
    training: bool,
    arith: Arith,
) -> Result<(Pass<f64>, Vec<usize>), String> {
    let mut rt = Runtime::new(LinkedSession::<f64>::with_seed(NN_SEED));
    let b = built(model, &rt, values)?;
    let run = pass(
        model,
        &mut rt,
        &b,
        &case.inputs,
        case.seed,
        training,
        arith.read(),
    )?;
    Ok((run, b.at))
}

/// `⟨c, output⟩` of a pass.
fn loss(value: &Tensor<f64>, seed: u64) -> f64 {
    let c = cotangent(value.shape(), seed);
    value.data().iter().zip(c.data()).map(|(v, c)| v * c).sum()
}

/// The reference's session with the trainable parameters' and the inputs' values, one of
/// which finite differences move at a time.
struct Probe<'a, M: UserModel> {
    model: &'a M,
    rt: Runtime<LinkedSession<f64>>,
    b: Built<M, LinkedSession<f64>>,
    /// The trainable parameters' values, then the inputs.
    tensors: Vec<Tensor<f64>>,
    seed: u64,
}

impl<M: UserModel> Probe<'_, M> {
    /// `⟨c, output⟩` with element `at` of tensor `k` set to `x` (then set back).
    fn loss_at(&mut self, k: usize, at: usize, x: f64) -> Result<f64, String> {
        let old = self.tensors[k].data()[at];
        self.tensors[k].data_mut()[at] = x;
        self.sync(k)?;
        let params = self.b.trainable.len();
        let r = pass(
            self.model,
            &mut self.rt,
            &self.b,
            &self.tensors[params..],
            self.seed,
            self.model.training(),
            |s, out, _, _| {
                Ok(Pass {
                    value: ir_value(s, out)?,
                    grads: Vec::new(),
                    reduction: 0,
                })
            },
        );
        self.tensors[k].data_mut()[at] = old;
        self.sync(k)?;
        Ok(loss(&r?.value, self.seed))
    }

    /// Tensor `k`'s value into the session, where it is a parameter.
    fn sync(&mut self, k: usize) -> Result<(), String> {
        match self.b.trainable.get(k) {
            Some(p) => self
                .rt
                .set_value(p, self.tensors[k].clone())
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// The finite-difference check of one case on the f64 reference (see the module docs).
fn fd_case<M: UserModel>(model: &M, case: &ModelCase) -> CaseResult {
    let Reference { run, values } = reference(model, case)?;
    let rt = Runtime::new(LinkedSession::<f64>::with_seed(NN_SEED));
    let b = built(model, &rt, &values)?;
    let mut tensors = b
        .trainable
        .iter()
        .map(|p| rt.value_of(p).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    tensors.extend(case.inputs.iter().cloned());
    let mut probe = Probe {
        model,
        rt,
        b,
        tensors,
        seed: case.seed,
    };
    let params = probe.b.trainable.len();
    if run.grads.iter().all(|g| g.shape().numel() == 0) {
        return Err(format!(
            "{}: no trainable parameter and no input element: nothing to differentiate",
            model.name()
        ));
    }
    let mut worst = Measured::ZERO;
    let (mut probed, mut kinks) = (0usize, 0usize);
    for (k, grad) in run.grads.iter().enumerate() {
        let len = grad.shape().numel();
        let coords = FD_COORDS.min(len);
        for j in 0..coords {
            // Spread over the tensor, from the case's seed.
            let at = ((case.seed as usize).wrapping_add(j * len / coords.max(1))) % len;
            let v = probe.tensors[k].data()[at];
            let mut fd = |h: f64| -> Result<f64, String> {
                Ok((probe.loss_at(k, at, v + h)? - probe.loss_at(k, at, v - h)?) / (2.0 * h))
            };
            let h = FD_STEP * v.abs().max(1.0);
            let (wide, narrow) = (fd(h)?, fd(h / 4.0)?);
            let analytic = grad.data()[at];
            let scale = analytic.abs().max(1.0);
            probed += 1;
            if (wide - narrow).abs() / scale > Tol::DEFAULT.fd {
                kinks += 1; // a kink within h of the coordinate
                continue;
            }
            let what = match k < params {
                true => format!("parameter {k}"),
                false => format!("input {}", k - params),
            };
            worst = worst.max(Measured::check(
                (analytic - narrow).abs() / scale,
                Tol::DEFAULT.fd,
                || {
                    format!(
                        "{}: the gradient of {what} at flat index {at} is {analytic}, central differences give {narrow}",
                        model.name()
                    )
                },
            )?);
        }
    }
    if probed > 0 && kinks == probed {
        return Err(format!(
            "{}: all {probed} probed coordinates sat on kinks (the differences with steps h and \
             h/4 disagree): nothing was compared",
            model.name()
        ));
    }
    Ok(worst)
}

/// A case on one session, against the reference.
struct Against<'a, M> {
    model: &'a M,
    case: &'a ModelCase,
    reference: &'a Reference,
}

impl<M: UserModel> SessionCheck for Against<'_, M> {
    fn run<O: LayerSession + 'static>(&self, session: O) -> CaseResult {
        let mut rt = Runtime::new(session);
        let b = built(self.model, &rt, &self.reference.values)?;
        let got = pass(
            self.model,
            &mut rt,
            &b,
            &self.case.inputs,
            self.case.seed,
            self.model.training(),
            session_read::<O>,
        )?;
        let want = &self.reference.run;
        if got.grads.len() != want.grads.len() {
            return Err(format!(
                "{} gradients, the reference has {}",
                got.grads.len(),
                want.grads.len()
            ));
        }
        let tol = tolerance::<O::T>(want.reduction);
        let params = b.trainable.len();
        // Each tensor's tolerance, at least its floor (the output's first).
        let compare = |floors: &[f64]| {
            let tol = |i: usize| floors.get(i).map_or(tol, |&f| tol.max(f));
            let mut m = close(&got.value, &want.value, tol(0), "the output")?;
            for (k, (g, w)) in got.grads.iter().zip(&want.grads).enumerate() {
                let what = match k < params {
                    true => format!("the gradient of parameter {k}"),
                    false => format!("the gradient of input {}", k - params),
                };
                m = m.max(close(g, w, tol(k + 1), &what)?);
            }
            Ok(m)
        };
        floors::judged(compare, || {
            let values = &self.reference.values;
            floors::pass_floors::<M, O::T>(self.model, self.case, values, want)
        })
    }
}

/// The tolerance of a session of element type `T` against the reference, whose pass's
/// longest reduction sums `reduction` terms.
fn tolerance<T: Scalar>(reduction: usize) -> f64 {
    match T::NAME {
        "f64" => Tol::DEFAULT.f64,
        _ => Tol::DEFAULT.f32_for(reduction),
    }
}

/// The step check's reference of a case: the parameters before and after [`STEPS`] steps.
struct StepReference {
    /// Every parameter's value before the steps (what every session starts from).
    values: Vec<Tensor<f64>>,
    /// Every parameter's value after them (the trainable ones moved).
    after: Vec<Tensor<f64>>,
    /// The longest reduction of the steps' passes.
    reduction: usize,
}

/// The steps of `case` taken here in f64: each step's gradients the reference's (a training
/// pass at the values the step starts from), the update momentum SGD's as PyTorch documents it
/// (`b ← μ·b + g`, `b = g` at the first step; `w ← w − lr·b`).
fn reference_steps<M: UserModel>(model: &M, case: &ModelCase) -> Result<StepReference, String> {
    reference_steps_in(model, case, initial_values(model, case.seed)?, Arith::F64)
}

/// [`reference_steps`] from the parameter values `values`, in `arith` (its passes, and each
/// operation of the update rounded to it).
fn reference_steps_in<M: UserModel>(
    model: &M,
    case: &ModelCase,
    values: Vec<Tensor<f64>>,
    arith: Arith,
) -> Result<StepReference, String> {
    let r = |x: f64| arith.round(x);
    let mut after = values.clone();
    let mut buffers: Vec<Tensor<f64>> = Vec::new();
    let mut reduction = 0;
    let err = |e: tl_spec::Error| e.to_string();
    for _ in 0..STEPS {
        let (run, at) = reference_pass(model, case, &after, true, arith)?;
        reduction = reduction.max(run.reduction);
        for (j, (&k, g)) in at.iter().zip(&run.grads).enumerate() {
            let b = match buffers.get(j) {
                None => g.clone(),
                Some(b) => b
                    .zip_map("momentum", g, |b, g| r(r(STEP_MOMENTUM * b) + g))
                    .map_err(err)?,
            };
            after[k] =
                (after[k].zip_map("momentum", &b, |w, b| r(w - r(STEP_LR * b)))).map_err(err)?;
            match buffers.get_mut(j) {
                Some(slot) => *slot = b,
                None => buffers.push(b),
            }
        }
    }
    Ok(StepReference {
        values,
        after,
        reduction,
    })
}

/// `(w₀ − w)/lr` elementwise: a parameter's total update over the steps, divided by the rate.
fn update(before: &Tensor<f64>, after: &Tensor<f64>) -> Result<Tensor<f64>, String> {
    (before.zip_map("update", after, |w0, w| (w0 - w) / STEP_LR)).map_err(|e| e.to_string())
}

/// A case's steps on one session, against the reference's.
struct Stepped<'a, M> {
    model: &'a M,
    case: &'a ModelCase,
    reference: &'a StepReference,
}

impl<M: UserModel> SessionCheck for Stepped<'_, M> {
    fn run<O: LayerSession + 'static>(&self, session: O) -> CaseResult {
        let (model, case, want) = (self.model, self.case, self.reference);
        let mut rt = Runtime::new(session);
        let b = built(model, &rt, &want.values)?;
        let mut opt = Optimizer::momentum(STEP_LR, STEP_MOMENTUM).map_err(|e| e.to_string())?;
        for step in 1..=STEPS {
            rt.session_mut().set_random_counter(COUNTER);
            rt.step(&b.model, &mut opt, |g| {
                let xs = case
                    .inputs
                    .iter()
                    .map(|x| g.input(x.cast()))
                    .collect::<tl_nn::Result<Vec<_>>>()?;
                let out = model.forward(&b.model, g, &xs)?;
                let c = g.input(cotangent(out.shape(), case.seed).cast())?;
                (&out * &c)?.sum()
            })
            .map_err(|e| format!("step {step} failed: {e}"))?;
        }
        let tol = tolerance::<O::T>(want.reduction);
        let mut updates = Vec::new();
        for &k in &b.at {
            let got = rt.value_of(&b.params[k]).map_err(|e| e.to_string())?;
            let w0 = &want.values[k];
            updates.push((update(w0, &got.cast())?, update(w0, &want.after[k])?));
        }
        // Each update's tolerance, at least its floor.
        let compare = |floors: &[f64]| {
            let mut worst = Measured::ZERO;
            for (j, (&k, (got, w))) in b.at.iter().zip(&updates).enumerate() {
                let tol = floors.get(j).map_or(tol, |&f| tol.max(f));
                let what = format!("parameter {k}'s update over {STEPS} steps, over the rate,");
                worst = worst.max(close(got, w, tol, &what)?);
            }
            Ok(worst)
        };
        floors::judged(compare, || {
            floors::step_floors::<M, O::T>(model, case, want, &b.at)
        })
    }
}

/// Where a row of [`check_model`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// One of the layer checks' sessions.
    Nn(NnSession),
    /// A `LinkedSession<f32>` compiling onto the CUDA simulation device.
    LinkedSim,
    /// An eager `Session<f32>` on the CUDA device (a GPU, or the kernel emulator).
    EagerCuda,
    /// A `LinkedSession<f32>` compiling onto the CUDA device.
    LinkedCuda,
}

impl Target {
    /// The CPU and simulation sessions of the pass rows, in report order (a pass on the linked
    /// f64 session is the reference itself).
    const PASS_HOST: [Target; 5] = [
        Target::Nn(NnSession::CpuF64),
        Target::Nn(NnSession::CpuF32),
        Target::Nn(NnSession::SimF32),
        Target::Nn(NnSession::LinkedF32),
        Target::LinkedSim,
    ];

    /// Those of the step rows: the linked f64 session's steps run its compiled tape, not the
    /// reference.
    const STEP_HOST: [Target; 6] = [
        Target::Nn(NnSession::CpuF64),
        Target::Nn(NnSession::CpuF32),
        Target::Nn(NnSession::SimF32),
        Target::Nn(NnSession::LinkedF64),
        Target::Nn(NnSession::LinkedF32),
        Target::LinkedSim,
    ];

    /// The name in labels, the CUDA device called `device`.
    fn name(self, device: &str) -> String {
        match self {
            Target::Nn(on) => on.name().into(),
            Target::LinkedSim => "linked cuda-sim-f32".into(),
            Target::EagerCuda => format!("eager {device}-f32"),
            Target::LinkedCuda => format!("linked {device}-f32"),
        }
    }

    /// `check` on a fresh session of this kind.
    fn run(self, check: &impl SessionCheck) -> CaseResult {
        match self {
            Target::Nn(on) => on_session(on, check),
            Target::LinkedSim => check.run(linked_on(Backend::CudaSim)?),
            Target::EagerCuda => on_cuda(check),
            Target::LinkedCuda => check.run(linked_on(Backend::Cuda)?),
        }
    }
}

/// A `LinkedSession<f32>` compiling onto `backend`.
fn linked_on(backend: Backend) -> Result<LinkedSession<f32>, String> {
    let mut s = LinkedSession::<f32>::with_seed(NN_SEED);
    s.set_backend(backend).map_err(|e| e.to_string())?;
    Ok(s)
}

/// What a row of [`check_model`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    /// One pass's output and gradients (`model <name> <session>`).
    Pass,
    /// [`STEPS`] optimizer steps (`model step <name> <session>`).
    Step,
}

impl Row {
    /// The row's label for `name` on the session named `session`.
    fn label(self, name: &str, session: &str) -> String {
        match self {
            Row::Pass => format!("model {name} {session}"),
            Row::Step => format!("model step {name} {session}"),
        }
    }
}

/// The row `label`: `model` checked as `row` says on `target`, against the reference.
fn row<M: UserModel>(model: &M, cfg: &RunConfig, label: String, row: Row, on: Target) -> Report {
    run_check(label, cfg, model_cases(model), move |c| match row {
        Row::Pass => on.run(&Against {
            model,
            case: c,
            reference: &reference(model, c)?,
        }),
        Row::Step => on.run(&Stepped {
            model,
            case: c,
            reference: &reference_steps(model, c)?,
        }),
    })
}

/// `check` on an eager f32 session on the CUDA device: a GPU (feature `cuda`) or the kernel
/// emulator (`cuda-emu`).
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
fn on_cuda(check: &impl SessionCheck) -> CaseResult {
    use tl_session::{Options, Session};
    let opts = Options {
        backend: Backend::Cuda,
        deterministic: false,
        seed: NN_SEED,
        ..Options::default()
    };
    check.run(Session::<f32>::new(opts).map_err(|e| e.to_string())?)
}

/// Without the features there is no CUDA device ([`check_model`] skips its rows).
#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
fn on_cuda(_check: &impl SessionCheck) -> CaseResult {
    Err("tl-conformance is built without its cuda or cuda-emu feature".into())
}

/// Whether `model` has nothing to step: it builds and none of its parameters is trainable.
fn nothing_to_step<M: UserModel>(model: &M) -> bool {
    let rt = Runtime::new(LinkedSession::<f64>::with_seed(NN_SEED));
    initial_values(model, NN_SEED)
        .and_then(|values| built(model, &rt, &values))
        .is_ok_and(|b| b.trainable.is_empty())
}

/// Check `model` (see the module documentation) with `cfg`'s case count and seed: finite
/// differences on the f64 reference, then a pass and [`STEPS`] optimizer steps on every
/// session against it. With tl-conformance's feature `cuda-emu` (or `cuda` and a GPU) eager
/// and linked f32 sessions on the CUDA device too (on the emulator twice: with each block's
/// threads forward and reversed); otherwise the report lists those rows as skipped, naming
/// why. A model without a trainable parameter has its step rows skipped (nothing to step).
pub fn check_model<M: UserModel>(model: &M, cfg: &RunConfig) -> SuiteReport {
    let name = model.name();
    let mut reports = vec![run_check(
        format!("model fd {name}"),
        cfg,
        model_cases(model),
        |c| fd_case(model, c),
    )];
    let mut skipped = Vec::new();
    let mut rows = vec![Row::Pass];
    if nothing_to_step(model) {
        skipped.push(format!(
            "{}: no trainable parameter, nothing to step",
            Row::Step.label(&name, "*")
        ));
    } else {
        rows.push(Row::Step);
    }
    for &kind in &rows {
        let host: &[Target] = match kind {
            Row::Pass => &Target::PASS_HOST,
            Row::Step => &Target::STEP_HOST,
        };
        for &on in host {
            reports.push(row(model, cfg, kind.label(&name, &on.name("")), kind, on));
        }
    }
    let device = cuda_device();
    for &kind in &rows {
        for on in [Target::EagerCuda, Target::LinkedCuda] {
            match &device {
                Ok(device) => {
                    let label = kind.label(&name, &on.name(device));
                    reports.push(row(model, cfg, label.clone(), kind, on));
                    #[cfg(feature = "cuda-emu")]
                    reports.push(tl_tape_cuda::in_reverse_schedule(|| {
                        row(model, cfg, format!("{label} (threads reversed)"), kind, on)
                    }));
                }
                Err(why) => skipped.push(format!("{}: {why}", kind.label(&name, &on.name("cuda")))),
            }
        }
    }
    SuiteReport {
        name,
        reports,
        skipped,
        widened: Vec::new(),
    }
}

/// The CUDA device's name in reports (`cuda-emu`, `cuda`), or why there is none.
fn cuda_device() -> Result<&'static str, String> {
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    {
        tl_tape_cuda::CudaDevice::new().map_err(|e| format!("no CUDA device: {e}"))?;
        Ok(if cfg!(feature = "cuda-emu") {
            "cuda-emu"
        } else {
            "cuda"
        })
    }
    #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
    Err(
        "tl-conformance is built without its cuda or cuda-emu feature (the kernel emulator: \
         cuda-emu)"
            .into(),
    )
}
