//! The sessions' state between reads: random sequences of writes — a Nat block write
//! (`NatVecRef`: gather ids, class labels), a Nat write (`NatRef`: a row index), a parameter
//! written from the host, an optimizer step (leaving the pass open, or ending it, which writes
//! the CPU parameters in place), a new input mid-pass (with a Nat of its own, recorded after
//! the reads before it), a reset — each followed by a
//! read of every tensor recorded in the pass and of the parameter, in the eager session and the
//! linked session side by side. Every read must equal a fresh recomputation: the pass's program
//! built anew as a `GraphData` and evaluated (or differentiated) by the IR in f64 on the
//! values the session documents:
//!
//! - the linked session evaluates its graph on the *current* Nat environment (a read after a
//!   Nat write re-evaluates: its value cache must be invalidated by the write);
//! - the eager session ran each op when it was recorded, on the Nat values of that moment;
//! - both keep the parameter value a pass recorded (a host write or a step shows from the
//!   next pass on), and `param_value` returns the newest value.
//!
//! Nodes recorded after the last Nat write therefore read the same in both sessions, and so
//! do the parameters after every step. Two pairs run: eager CPU f64 with linked f64 (CPU
//! tape), and eager CUDA-sim f32 with linked f32 compiled onto the CUDA-sim tape (parameters
//! resident on the device between steps).

use proptest::prelude::*;
use tl_ir::{GraphBuilder, Op};
use tl_session::{
    Backend, LinkedSession, NatRef, NatVecRef, Optimizer, Options, Param, Session, TensorRef, Train,
};
use tl_spec::{Scalar, Tensor};

use crate::metric::tensor_err;
use crate::{CaseResult, Measured, Report, RunConfig, Tol, run_check};

/// The default number of sequences per pair when `TL_CASES` is not set (each drives two
/// sessions through up to 8 writes; 64 take well under a second in the test profile).
pub const STATE_CASES: u32 = 64;

/// One write (or read) of a sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum StateOp {
    /// Only read.
    Read,
    /// Overwrite the gather ids (`write_nat_vec`).
    WriteIds(Vec<usize>),
    /// Overwrite the class labels (`write_nat_vec`).
    WriteLabels(Vec<usize>),
    /// Overwrite the row index (`write_nat`).
    WriteRow(usize),
    /// Write the parameter from the host (`set_param`).
    SetParam(Tensor<f64>),
    /// One SGD step with this learning rate on a fresh pass's loss (`backward_step`), then a
    /// fresh pass.
    Step(f64),
    /// The same step as the pass's last act (`backward_step_reduced_then_reset`, which writes
    /// the CPU parameters in place), then a fresh pass.
    StepThenReset(f64),
    /// A new input recorded mid-pass (`constant`), and the program again on it.
    NewInput(Tensor<f64>),
    /// `reset`, then the program recorded again on the current values.
    Reset,
}

/// A sequence: sizes, initial values and the writes.
#[derive(Debug, Clone)]
pub struct StateCase {
    /// The parameter W (rows, dim).
    pub w: Tensor<f64>,
    /// The input x (k, dim).
    pub x: Tensor<f64>,
    /// k gather ids in `0..rows`.
    pub ids: Vec<usize>,
    /// k labels in `0..dim`.
    pub labels: Vec<usize>,
    /// A row index in `0..k`.
    pub row: usize,
    /// The writes, in order.
    pub ops: Vec<StateOp>,
}

fn values(dims: [usize; 2], lo: f64, hi: f64) -> BoxedStrategy<Tensor<f64>> {
    prop::collection::vec(lo..=hi, dims[0] * dims[1])
        .prop_map(move |v| {
            let v = v.into_iter().map(|x| x as f32 as f64).collect();
            Tensor::new(dims, v).expect("n elements")
        })
        .boxed()
}

/// Random sequences of up to 8 writes on a program of random sizes.
pub fn state_cases() -> BoxedStrategy<StateCase> {
    (1usize..=4, 1usize..=4, 1usize..=3)
        .prop_flat_map(|(rows, dim, k)| {
            let op = prop_oneof![
                Just(StateOp::Read),
                prop::collection::vec(0..rows, k).prop_map(StateOp::WriteIds),
                prop::collection::vec(0..dim, k).prop_map(StateOp::WriteLabels),
                (0..k).prop_map(StateOp::WriteRow),
                values([rows, dim], -1.0, 1.0).prop_map(StateOp::SetParam),
                prop::sample::select(vec![0.5, 0.125]).prop_map(StateOp::Step),
                prop::sample::select(vec![0.5, 0.125]).prop_map(StateOp::StepThenReset),
                values([k, dim], -1.5, 1.5).prop_map(StateOp::NewInput),
                Just(StateOp::Reset),
            ];
            (
                values([rows, dim], -1.0, 1.0),
                values([k, dim], -1.5, 1.5),
                prop::collection::vec(0..rows, k),
                prop::collection::vec(0..dim, k),
                0..k,
                prop::collection::vec(op, 1..=8),
            )
        })
        .prop_map(|(w, x, ids, labels, row, ops)| StateCase {
            w,
            x,
            ids,
            labels,
            row,
            ops,
        })
        .boxed()
}

/// What the sequences need beyond [`Train`]: the Nat inputs of both sessions.
pub trait NatSession: Train {
    /// Record a Nat input.
    fn nat(&mut self, v: usize) -> NatRef;
    /// Overwrite a Nat input.
    fn set_nat(&mut self, r: NatRef, v: usize) -> tl_session::Result<()>;
    /// Overwrite a block of Nat inputs.
    fn set_nat_vec(&mut self, r: NatVecRef, vs: &[usize]) -> tl_session::Result<()>;
}

impl<T: Scalar> NatSession for Session<T> {
    fn nat(&mut self, v: usize) -> NatRef {
        self.record_nat(v)
    }
    fn set_nat(&mut self, r: NatRef, v: usize) -> tl_session::Result<()> {
        self.write_nat(r, v)
    }
    fn set_nat_vec(&mut self, r: NatVecRef, vs: &[usize]) -> tl_session::Result<()> {
        self.write_nat_vec(r, vs)
    }
}

impl<T: Scalar> NatSession for LinkedSession<T> {
    fn nat(&mut self, v: usize) -> NatRef {
        self.record_nat(v)
    }
    fn set_nat(&mut self, r: NatRef, v: usize) -> tl_session::Result<()> {
        self.write_nat(r, v)
    }
    fn set_nat_vec(&mut self, r: NatVecRef, vs: &[usize]) -> tl_session::Result<()> {
        self.write_nat_vec(r, vs)
    }
}

/// The Nat environment of a pass: ids, then labels, then the row (their recording order).
fn env(ids: &[usize], labels: &[usize], row: usize) -> Vec<usize> {
    ids.iter().chain(labels).copied().chain([row]).collect()
}

/// The program on (w, x) with the Nat environment `nats` (ids at 0, labels at k, row at 2k):
/// `g = W[ids]`, `z = g·x`, `loss = cross_entropy(z, labels)`, `r = z[row]`. Returns the four
/// values and the gradient of `loss` for w.
fn reference(
    w: &Tensor<f64>,
    x: &Tensor<f64>,
    nats: &[usize],
) -> Result<(Vec<Tensor<f64>>, Tensor<f64>), String> {
    let k = x.shape().dims()[0];
    let build = || -> tl_ir::Result<(tl_ir::GraphData, [usize; 4])> {
        let mut b = GraphBuilder::new();
        let wl = b.leaf(w.shape().clone(), None)?;
        let xl = b.leaf(x.shape().clone(), None)?;
        let g = b.apply(Op::GatherRowsNatVec { at: 0, k }, &[wl])?;
        let z = b.apply(Op::Mul, &[g, xl])?;
        let loss = b.apply(Op::CrossEntropy { labels_at: k }, &[z])?;
        let r = b.apply(Op::GatherRowNat { at: 2 * k }, &[z])?;
        Ok((b.finish(), [g, z, loss, r]))
    };
    let (graph, ids) = build().map_err(|e| format!("reference graph: {e}"))?;
    let leaves = [w.clone(), x.clone()];
    let v = graph
        .eval(&leaves, nats)
        .map_err(|e| format!("reference eval: {e}"))?;
    let g = graph
        .backprop_all(&leaves, nats, ids[2], &Tensor::scalar(1.0))
        .map_err(|e| format!("reference backprop_all: {e}"))?;
    Ok((ids.iter().map(|&i| v[i].clone()).collect(), g[0].clone()))
}

/// One recording of the program in a pass.
struct Segment {
    /// g, z, loss, r.
    refs: [TensorRef; 4],
    /// The input it used.
    x: Tensor<f64>,
    /// The Nat environment when it was recorded.
    nats: Vec<usize>,
}

/// A session driven through a sequence, with what it recorded in the open pass.
struct Driven<S: NatSession> {
    name: &'static str,
    s: S,
    /// Whether reads follow the current Nat environment (linked) or the one at recording
    /// (eager).
    follows_writes: bool,
    p: Param,
    w: Option<TensorRef>,
    ids: Option<NatVecRef>,
    labels: Option<NatVecRef>,
    /// The row index Nats of the pass, each holding the current row: one per recording of the
    /// program (a new input records its own after the reads before it, so the linked
    /// session's kept pass tape must take the grown Nat environment).
    rows: Vec<NatRef>,
    segs: Vec<Segment>,
}

/// The model both sessions must follow.
struct Model {
    /// The parameter's newest value.
    w: Tensor<f64>,
    /// The value the open pass recorded the parameter with.
    w_pass: Tensor<f64>,
    /// The newest input.
    x: Tensor<f64>,
    ids: Vec<usize>,
    labels: Vec<usize>,
    row: usize,
}

impl Model {
    fn nats(&self) -> Vec<usize> {
        env(&self.ids, &self.labels, self.row)
    }
}

type Res<T> = Result<T, String>;

impl<S: NatSession> Driven<S> {
    fn new(name: &'static str, mut s: S, follows_writes: bool, m: &Model) -> Res<Self> {
        let p = s
            .param(m.w.cast(), Some("w"), true)
            .map_err(|e| format!("{name}: param: {e}"))?;
        let mut d = Driven {
            name,
            s,
            follows_writes,
            p,
            w: None,
            ids: None,
            labels: None,
            rows: Vec::new(),
            segs: Vec::new(),
        };
        d.begin(m)?;
        Ok(d)
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> String {
        format!("{}: {what}: {e}", self.name)
    }

    /// A fresh pass: reset, the parameter, the input, the Nat inputs, the program.
    fn begin(&mut self, m: &Model) -> Res<()> {
        self.s.reset();
        self.segs.clear();
        let w = self
            .s
            .use_param(&self.p)
            .map_err(|e| self.err("use_param", e))?;
        let x = self
            .s
            .input(m.x.cast(), false)
            .map_err(|e| self.err("input", e))?;
        self.w = Some(w);
        self.ids = Some(self.s.record_nat_vec(&m.ids));
        self.labels = Some(self.s.record_nat_vec(&m.labels));
        self.rows = vec![self.s.nat(m.row)];
        self.segment(&x, m)
    }

    /// Record the program on input `x`.
    fn segment(&mut self, x: &TensorRef, m: &Model) -> Res<()> {
        let k = m.ids.len();
        let (Some(w), Some(ids), Some(labels), Some(row)) = (
            self.w.clone(),
            self.ids,
            self.labels,
            self.rows.last().copied(),
        ) else {
            return Err(format!("{}: no open pass", self.name));
        };
        let s = &mut self.s;
        let rec = (|| {
            let g = s.gather_rows_nat_vec(&w, ids.pos(), k)?;
            let z = s.mul(&g, x)?;
            let loss = s.cross_entropy(&z, labels.pos())?;
            let r = s.gather_row_nat(&z, row.pos())?;
            Ok::<_, tl_session::Error>([g, z, loss, r])
        })();
        let refs = rec.map_err(|e| self.err("recording the program", e))?;
        self.segs.push(Segment {
            refs,
            x: m.x.clone(),
            nats: m.nats(),
        });
        Ok(())
    }

    /// Apply one write.
    fn apply(&mut self, op: &StateOp, m: &Model) -> Res<()> {
        match op {
            StateOp::Read => Ok(()),
            StateOp::WriteIds(v) => {
                let r = self.ids.ok_or("no pass")?;
                self.s
                    .set_nat_vec(r, v)
                    .map_err(|e| self.err("write ids", e))
            }
            StateOp::WriteLabels(v) => {
                let r = self.labels.ok_or("no pass")?;
                self.s
                    .set_nat_vec(r, v)
                    .map_err(|e| self.err("write labels", e))
            }
            StateOp::WriteRow(v) => {
                if self.rows.is_empty() {
                    return Err("no pass".into());
                }
                for r in self.rows.clone() {
                    self.s
                        .set_nat(r, *v)
                        .map_err(|e| self.err("write row", e))?;
                }
                Ok(())
            }
            StateOp::SetParam(v) => {
                let p = self.p.clone();
                self.s
                    .set_param(&p, v.cast())
                    .map_err(|e| self.err("set_param", e))
            }
            StateOp::NewInput(v) => {
                let x = self
                    .s
                    .constant(v.cast())
                    .map_err(|e| self.err("constant", e))?;
                let row = self.s.nat(m.row);
                self.rows.push(row);
                self.segment(&x, m)
            }
            StateOp::Reset => self.begin(m),
            StateOp::Step(lr) | StateOp::StepThenReset(lr) => {
                Err(format!("step {lr} is driven by run_state_case"))
            }
        }
    }

    /// One SGD step on a fresh pass's loss, ending the pass with it when `ends_pass`; returns
    /// the loss.
    fn step(&mut self, lr: f64, ends_pass: bool, m: &Model) -> Res<f64> {
        self.begin(m)?;
        let loss = self.segs[0].refs[2].clone();
        let mut opt = Optimizer::sgd(lr).map_err(|e| self.err("sgd", e))?;
        match ends_pass {
            false => {
                (self.s.backward_step(&loss, &mut opt)).map_err(|e| self.err("backward_step", e))
            }
            true => (self
                .s
                .backward_step_reduced_then_reset(&loss, &mut opt, None))
            .map_err(|e| self.err("backward_step_reduced_then_reset", e)),
        }
    }

    /// Read every tensor of the pass and the parameter, and compare with the model.
    fn check(&mut self, m: &Model, tol: f64, after: &str) -> CaseResult {
        let mut worst = Measured::ZERO;
        let current = m.nats();
        for (i, seg) in self.segs.iter().enumerate() {
            let nats = if self.follows_writes {
                &current
            } else {
                &seg.nats
            };
            let (want, _) = reference(&m.w_pass, &seg.x, nats)?;
            for (j, (r, w)) in seg.refs.iter().zip(&want).enumerate() {
                // Both reads: `Ops::value` (the linked session's cached pure evaluation) and
                // `Train::read` (the linked session's compiled tape).
                for how in ["value", "read"] {
                    let got = match how {
                        "value" => self.s.value(r),
                        _ => self.s.read(r),
                    };
                    let got =
                        got.map_err(|e| format!("{}: {how} after {after}: {e}", self.name))?;
                    let name = ["g = W[ids]", "z = g·x", "loss", "r = z[row]"][j];
                    worst = worst.max(Measured::check(tensor_err(&got, w), tol, || {
                        format!(
                            "{}: after {after}, recording {i}'s {name} ({how}) is {:?}, a fresh recomputation gives {:?}",
                            self.name,
                            got.data(),
                            w.data()
                        )
                    })?);
                }
            }
        }
        let p = self.p.clone();
        let got = self
            .s
            .param_value(&p)
            .map_err(|e| format!("{}: param_value after {after}: {e}", self.name))?;
        worst = worst.max(Measured::check(tensor_err(&got, &m.w), tol, || {
            format!(
                "{}: after {after}, param_value reads {:?}, expected {:?}",
                self.name,
                got.data(),
                m.w.data()
            )
        })?);
        Ok(worst)
    }
}

/// Drive an eager and a linked session through `case` side by side; every read equals the
/// fresh recomputation (and so the two sessions agree wherever their documented semantics
/// coincide).
fn run_state_case<E: NatSession, L: NatSession>(
    case: &StateCase,
    eager: E,
    linked: L,
    tol: f64,
) -> CaseResult {
    let mut m = Model {
        w: case.w.clone(),
        w_pass: case.w.clone(),
        x: case.x.clone(),
        ids: case.ids.clone(),
        labels: case.labels.clone(),
        row: case.row,
    };
    let mut e = Driven::new("eager", eager, false, &m)?;
    let mut l = Driven::new("linked", linked, true, &m)?;
    let mut worst = e.check(&m, tol, "the first pass")?;
    worst = worst.max(l.check(&m, tol, "the first pass")?);
    for (i, op) in case.ops.iter().enumerate() {
        let after = format!("op {i} ({})", op_name(op));
        match op {
            StateOp::WriteIds(v) => m.ids = v.clone(),
            StateOp::WriteLabels(v) => m.labels = v.clone(),
            StateOp::WriteRow(v) => m.row = *v,
            StateOp::SetParam(v) => m.w = v.clone(),
            StateOp::NewInput(v) => m.x = v.clone(),
            StateOp::Reset => m.w_pass = m.w.clone(),
            StateOp::Read | StateOp::Step(_) | StateOp::StepThenReset(_) => {}
        }
        if let StateOp::Step(lr) | StateOp::StepThenReset(lr) = op {
            let ends_pass = matches!(op, StateOp::StepThenReset(_));
            m.w_pass = m.w.clone();
            let (want, grad) = reference(&m.w, &m.x, &m.nats())?;
            let want_loss = want[2].data()[0];
            for got in [e.step(*lr, ends_pass, &m)?, l.step(*lr, ends_pass, &m)?] {
                worst = worst.max(Measured::check(
                    crate::metric::scalar_err(got, want_loss),
                    tol,
                    || format!("after {after}: backward_step's loss {got}, a fresh recomputation gives {want_loss}"),
                )?);
            }
            m.w = Tensor::from_fn(m.w.shape().clone(), |i| m.w.data()[i] - lr * grad.data()[i]);
            // The next pass starts from the stepped value.
            m.w_pass = m.w.clone();
            e.begin(&m)?;
            l.begin(&m)?;
        } else {
            e.apply(op, &m)?;
            l.apply(op, &m)?;
        }
        worst = worst.max(e.check(&m, tol, &after)?);
        worst = worst.max(l.check(&m, tol, &after)?);
    }
    Ok(worst)
}

fn op_name(op: &StateOp) -> &'static str {
    match op {
        StateOp::Read => "read",
        StateOp::WriteIds(_) => "write_nat_vec ids",
        StateOp::WriteLabels(_) => "write_nat_vec labels",
        StateOp::WriteRow(_) => "write_nat row",
        StateOp::SetParam(_) => "set_param",
        StateOp::Step(_) => "sgd step",
        StateOp::StepThenReset(_) => "sgd step ending the pass",
        StateOp::NewInput(_) => "new input",
        StateOp::Reset => "reset",
    }
}

/// One sequence on eager CPU f64 and linked f64 (held to `Tol::DEFAULT.f64`).
pub fn state_case_cpu(case: &StateCase) -> CaseResult {
    let eager = Session::<f64>::new(Options::backend(Backend::Cpu)).map_err(|e| e.to_string())?;
    run_state_case(case, eager, LinkedSession::<f64>::new(), Tol::DEFAULT.f64)
        .map_err(|e| format!("cpu-f64: {e}"))
}

/// One sequence on eager CUDA-sim f32 and linked f32 compiled onto the CUDA-sim tape (held to
/// `Tol::DEFAULT.f32`). Host parameter writes come in the middle of a pass too: a tensor
/// recorded before the write keeps the recorded value in every read, also where the linked
/// session compiles the pass with the parameters' resident device mirrors.
pub fn state_case_sim(case: &StateCase) -> CaseResult {
    let eager =
        Session::<f32>::new(Options::backend(Backend::CudaSim)).map_err(|e| e.to_string())?;
    let mut linked = LinkedSession::<f32>::new();
    linked
        .set_backend(Backend::CudaSim)
        .map_err(|e| e.to_string())?;
    run_state_case(case, eager, linked, Tol::DEFAULT.f32).map_err(|e| format!("cuda-sim-f32: {e}"))
}

/// The session-state check on both pairs, `cfg.cases` sequences each.
pub fn check_session_state(cfg: &RunConfig) -> Vec<Report> {
    vec![
        run_check(
            "session state cpu-f64".into(),
            cfg,
            state_cases(),
            state_case_cpu,
        ),
        run_check(
            "session state cuda-sim-f32".into(),
            cfg,
            state_cases(),
            state_case_sim,
        ),
    ]
}
