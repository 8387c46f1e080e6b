//! Random DAGs composed of registry ops, built with `tl_ir::GraphBuilder`.
//!
//! A case is a *plan* (leaf shapes, a list of steps, the output) turned into a graph
//! deterministically, so proptest shrinks plans and leaf values together. Each step picks an op
//! from a menu covering every `Op` variant and operands from all earlier ids: the most recent one
//! half of the time, any earlier one otherwise, so ids are reused (fan-out) and gradients
//! accumulate. Operands of the wrong shape are adapted with registry ops (`reshape`,
//! `broadcastTo`, mean via `sum`+`scale`); ops with restricted domains get positive-ified inputs
//! (`softplus(x) + 0.5`, via `add` and a `constant`) and `exp` a `tanh`-squashed one, which keeps
//! `log`/`sqrt`/`inv`/`div` defined and values bounded. Cases whose f64 values exceed
//! [`VALUE_BOUND`] or pass within [`KINK_MARGIN`] of a kink (relu/abs at 0, clamp bounds, a
//! non-identical max/min tie) are filtered out, so f32-vs-f64 and finite-difference comparisons
//! are well posed.

use proptest::prelude::*;
use tl_ir::{GraphBuilder, GraphData, Id, Op};
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor, can_broadcast_to};

use crate::generate::{direction, regroup, tensors};
use crate::{GraphCase, Tol, kink_margin};

mod index_step;

/// Largest magnitude any value of an accepted DAG may reach.
pub const VALUE_BOUND: f64 = 100.0;
/// Smallest distance from a kink accepted at a kinked op's operands.
pub const KINK_MARGIN: f64 = 5e-3;
/// Tolerances on DAGs: like [`Tol::DEFAULT`], but finite differences of a composition are held
/// to 1e-5 (compositions have larger third derivatives).
pub const DAG_TOL: Tol = Tol {
    fd: 1e-5,
    ..Tol::DEFAULT
};
/// Number of entries of the step menu.
pub const MENU_LEN: u8 = 52;

/// What kind of DAGs to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DagOptions {
    /// Every leaf requires grad (needed by finite differences and the adjoint identity);
    /// otherwise each leaf does with probability 0.75.
    pub all_grad: bool,
    /// Whether `detach` may appear (not in finite-difference checks).
    pub detach: bool,
    /// Most steps per DAG (each step adds one to five nodes).
    pub max_steps: usize,
}

impl Default for DagOptions {
    fn default() -> Self {
        DagOptions {
            all_grad: false,
            detach: true,
            max_steps: 10,
        }
    }
}

/// One planned step: a menu entry, three operand picks and a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Menu entry (`kind % MENU_LEN`).
    pub kind: u8,
    /// Operand picks.
    pub picks: [u16; 3],
    /// A parameter (axis, constant, shape choice...).
    pub param: u16,
}

fn step() -> impl Strategy<Value = Step> {
    (0..MENU_LEN, any::<[u16; 3]>(), any::<u16>()).prop_map(|(kind, picks, param)| Step {
        kind,
        picks,
        param,
    })
}

/// A strategy for random DAG cases: graph, leaf values in `[-2, 2]`, output, seed in `[-1, 1]`.
pub fn dag_cases(opts: DagOptions) -> BoxedStrategy<GraphCase> {
    let plan = (
        1usize..=3,
        1usize..=3,
        prop::collection::vec(0u8..8, 2..=4),
        prop::collection::vec(step(), 1..=opts.max_steps),
        prop::option::weighted(0.3, any::<u16>()),
        prop::collection::vec(prop::bool::weighted(0.75), 4),
    );
    plan.prop_flat_map(move |(m, n, kinds, steps, out, rg)| {
        let shapes: Vec<Shape> = kinds.iter().map(|&k| leaf_shape(k, m, n)).collect();
        let rg: Vec<bool> = rg.iter().map(|&r| r || opts.all_grad).collect();
        (
            Just((shapes.clone(), steps, out, rg)),
            tensors(shapes, crate::ANY),
        )
    })
    .prop_filter_map(
        "DAG values out of bounds or too close to a kink",
        move |((shapes, steps, out, rg), leaves)| {
            let (graph, out, nats) = build_with_nats(&shapes, &rg, &steps, out, opts);
            well_conditioned_with(&graph, &leaves, &nats).then_some((graph, out, leaves, nats))
        },
    )
    .prop_flat_map(|(graph, out, leaves, nats)| {
        let shape = graph.shape(out).expect("out exists").clone();
        (Just((graph, out, leaves, nats)), direction(shape))
    })
    .prop_map(|((graph, out, leaves, nats), seed)| GraphCase {
        graph,
        leaves,
        out,
        seed,
        nats,
    })
    .boxed()
}

fn leaf_shape(kind: u8, m: usize, n: usize) -> Shape {
    match kind {
        0 | 1 => Shape::new(&[m, n]),
        2 => Shape::new(&[n]),
        3 => Shape::new(&[m]),
        4 => Shape::scalar(),
        5 => Shape::new(&[n, m]),
        6 => Shape::new(&[2, m, n]),
        _ => Shape::new(&[m, n, 2]),
    }
}

/// Whether every value is finite and within [`VALUE_BOUND`], and every kinked op's operands
/// keep [`KINK_MARGIN`] from its kinks (`max`/`min` of one id with itself is an exact tie on
/// every backend and allowed).
pub fn well_conditioned(graph: &GraphData, leaves: &[Tensor<f64>]) -> bool {
    well_conditioned_with(graph, leaves, &[])
}

/// [`well_conditioned`] for a graph whose index ops read the Nat environment `nats`.
pub fn well_conditioned_with(graph: &GraphData, leaves: &[Tensor<f64>], nats: &[usize]) -> bool {
    let Ok(values) = graph.eval(leaves, nats) else {
        return false;
    };
    let bounded = values.iter().all(|t| {
        t.data()
            .iter()
            .all(|v| v.is_finite() && v.abs() <= VALUE_BOUND)
    });
    bounded
        && graph.nodes().iter().all(|node| {
            let a = node.args();
            if matches!(node.op(), Op::Max | Op::Min) && a[0] == a[1] {
                return true;
            }
            let args: Vec<&Tensor<f64>> = a.iter().map(|&i| &values[i]).collect();
            kink_margin(node.op(), &args).is_none_or(|m| m >= KINK_MARGIN)
        })
}

/// Turn a plan into a graph; returns it and the output id (for plans whose steps read no Nat
/// environment; see [`build_with_nats`]).
pub fn build(
    shapes: &[Shape],
    requires_grad: &[bool],
    steps: &[Step],
    out: Option<u16>,
    opts: DagOptions,
) -> (GraphData, Id) {
    let (graph, out, _) = build_with_nats(shapes, requires_grad, steps, out, opts);
    (graph, out)
}

/// Turn a plan into a graph; returns it, the output id and the Nat environment its index steps
/// appended their indices and labels to.
pub fn build_with_nats(
    shapes: &[Shape],
    requires_grad: &[bool],
    steps: &[Step],
    out: Option<u16>,
    opts: DagOptions,
) -> (GraphData, Id, Vec<usize>) {
    let mut d = Dag {
        b: GraphBuilder::new(),
        nats: Vec::new(),
    };
    for (k, s) in shapes.iter().enumerate() {
        let rg = requires_grad.get(k).copied().unwrap_or(true);
        d.b.leaf_with(s.clone(), Some(&format!("l{k}")), rg)
            .expect("leaves first");
    }
    let first_node = shapes.len();
    for s in steps {
        d.step(s, opts);
    }
    let len = d.b.graph().len();
    let out = match out {
        Some(k) => first_node + usize::from(k) % (len - first_node),
        None => len - 1,
    };
    (d.b.finish(), out, d.nats)
}

struct Dag {
    b: GraphBuilder,
    /// The Nat environment: index steps append their indices here.
    nats: Vec<usize>,
}

impl Dag {
    fn shape(&self, id: Id) -> Shape {
        self.b.graph().shape(id).expect("known id").clone()
    }

    fn add(&mut self, op: Op, args: &[Id]) -> Id {
        let shapes: Vec<Shape> = args.iter().map(|&a| self.shape(a)).collect();
        self.b.apply(op.clone(), args).unwrap_or_else(|e| {
            panic!("DAG generator built an ill-typed node {op:?}{shapes:?}: {e}")
        })
    }

    fn pick(&self, p: u16, recent: bool) -> Id {
        let len = self.b.graph().len();
        if recent && p.is_multiple_of(2) {
            len - 1
        } else {
            usize::from(p) % len
        }
    }

    /// `x` as a tensor of shape `to`: itself, a reshape, a broadcast, or its broadcast mean.
    fn adapt(&mut self, x: Id, to: &Shape) -> Id {
        let s = self.shape(x);
        if &s == to {
            x
        } else if s.numel() == to.numel() {
            self.add(Op::Reshape(to.clone()), &[x])
        } else if can_broadcast_to(&s, to) {
            self.add(Op::BroadcastTo(to.clone()), &[x])
        } else {
            let sum = self.add(Op::Sum, &[x]);
            let mean = self.add(Op::Scale(1.0 / s.numel().max(1) as f64), &[sum]);
            self.add(Op::BroadcastTo(to.clone()), &[mean])
        }
    }

    /// `softplus(x) + 0.5`: a positive version of `x` (at least 0.5).
    fn positive(&mut self, x: Id) -> Id {
        let s = self.shape(x);
        let sp = self.add(Op::Softplus, &[x]);
        let half = self.add(Op::Constant(Tensor::full(s, 0.5)), &[]);
        self.add(Op::Add, &[sp, half])
    }

    fn step(&mut self, st: &Step, opts: DagOptions) {
        let x = self.pick(st.picks[0], true);
        let y = self.pick(st.picks[1], false);
        let z = self.pick(st.picks[2], false);
        let p = st.param;
        let sx = self.shape(x);
        let rank = sx.rank();
        match st.kind % MENU_LEN {
            k @ 0..=5 => {
                let y = self.adapt(y, &sx);
                let op =
                    [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Max, Op::Min][usize::from(k)].clone();
                let y = if op == Op::Div { self.positive(y) } else { y };
                self.add(op, &[x, y]);
            }
            6 => self.push(Op::Abs, &[x]),
            // relu, or (one time in three each) leakyRelu and elu with a parameter from p.
            7 => {
                let s = f64::from(p / 3 % 5) * 0.25 - 0.5;
                let op = match p % 3 {
                    0 => Op::Relu,
                    1 => Op::LeakyRelu { negative_slope: s },
                    _ => Op::Elu { alpha: s + 1.0 },
                };
                self.push(op, &[x]);
            }
            8 => self.push(Op::Sigmoid, &[x]),
            9 => self.push(Op::Tanh, &[x]),
            10 => self.push(Op::Softplus, &[x]),
            11 => self.push(Op::SafeLog { eps: 1e-6 }, &[x]),
            12 => self.push(Op::Scale(f64::from(p % 7) * 0.5 - 1.5), &[x]),
            13 => {
                let hi = 0.5 + f64::from(p % 3) * 0.5;
                self.add(Op::Clamp { lo: -0.5, hi }, &[x]);
            }
            14 => {
                let t = self.add(Op::Tanh, &[x]);
                self.add(Op::Exp, &[t]);
            }
            k @ 15..=17 => {
                let pos = self.positive(x);
                let op = [Op::Sqrt, Op::Log, Op::Inv][usize::from(k - 15)].clone();
                self.add(op, &[pos]);
            }
            18 if opts.detach => self.push(Op::Detach, &[x]),
            18 => self.push(Op::Tanh, &[x]),
            19 if p % 2 == 1 => self.push(Op::Flatten, &[x]),
            19 => {
                let to = regroup(sx.numel(), usize::from(p % 4), u64::from(p));
                self.add(Op::Reshape(to), &[x]);
            }
            20 => {
                // Rank 0-1 operands are lifted to rank 3 first, so every permutation sees data.
                let x = if rank < 2 { self.as_rank(x, 3) } else { x };
                let choice = usize::from(p % 4);
                let op = match (self.shape(x).rank(), choice) {
                    (2, 0 | 1) => Op::Transpose2d,
                    (3, 0) => Op::PermuteBca,
                    (3, 1) => Op::PermuteCab,
                    (3, 2) => Op::SwapLastTwo,
                    _ => Op::SwapAdjacent(usize::from(p / 4 % 3)),
                };
                self.add(op, &[x]);
            }
            21 if sx.numel() > 24 => self.push(Op::ReduceSum(0), &[x]),
            21 => {
                let to: Vec<usize> = if rank < 3 {
                    std::iter::once(2)
                        .chain(sx.dims().iter().copied())
                        .collect()
                } else {
                    sx.dims()
                        .iter()
                        .map(|&d| if d == 1 { 2 } else { d })
                        .collect()
                };
                self.add(Op::BroadcastTo(Shape::from(to)), &[x]);
            }
            22 => self.push(Op::Sum, &[x]),
            23 | 24 if rank == 0 => self.push(Op::Scale(0.5), &[x]),
            23 => self.push(Op::ReduceSum(usize::from(p) % rank), &[x]),
            24 => self.push(Op::ReduceMean(usize::from(p) % rank), &[x]),
            25 => {
                let a = self.as_rank(x, 2);
                let k = self.shape(a).dims()[1];
                let b = self.adapt(y, &Shape::new(&[k, 1 + usize::from(p % 3)]));
                self.add(Op::Matmul, &[a, b]);
            }
            26 => {
                let a = self.as_rank(x, 3);
                let d = self.shape(a);
                let to = Shape::new(&[d.dims()[0], d.dims()[2], 1 + usize::from(p % 2)]);
                let b = self.adapt(y, &to);
                self.add(Op::Bmm, &[a, b]);
            }
            27 => {
                let input = if rank == 1 || rank == 2 {
                    x
                } else {
                    self.as_rank(x, 1)
                };
                let inp = *self.shape(input).dims().last().expect("rank ≥ 1");
                let out = 1 + usize::from(p % 3);
                let w = self.adapt(y, &Shape::new(&[out, inp]));
                let bias = self.adapt(z, &Shape::new(&[out]));
                // Two linears in three are followed by a residual add (a transformer block's
                // pattern; one fused launch on the CUDA tape), the residual shaped first so
                // that the add comes right after the linear, on either side of it.
                let res = match p / 3 % 3 {
                    0 => None,
                    side => {
                        let mut to = self.shape(input).dims().to_vec();
                        *to.last_mut().expect("rank ≥ 1") = out;
                        Some((side, self.adapt(x, &Shape::from(to))))
                    }
                };
                let l = self.add(Op::Linear, &[w, bias, input]);
                match res {
                    Some((1, r)) => self.add(Op::Add, &[r, l]),
                    Some((_, r)) => self.add(Op::Add, &[l, r]),
                    None => l,
                };
            }
            28 => self.push(Op::Softmax, &[x]),
            29 => self.push(Op::LogSoftmax, &[x]),
            30 => {
                let y = self.adapt(y, &sx);
                self.add(Op::MseLoss, &[x, y]);
            }
            k @ 40..=47 => self.index_step(k, x, y, p),
            // Norms use ε = 0.05 so that near-constant groups stay well conditioned.
            36 => {
                let x = if rank == 0 { self.as_rank(x, 1) } else { x };
                let d = Shape::new(&[*self.shape(x).dims().last().expect("rank ≥ 1")]);
                let (g, b) = (self.adapt(y, &d), self.adapt(z, &d));
                match p % 2 {
                    0 => self.add(Op::LayerNorm { eps: 0.05 }, &[x, g, b]),
                    _ => self.add(Op::RmsNorm { eps: 0.05 }, &[x, g]),
                };
            }
            37 => {
                // (a, b, c) → batched (a, b, c, 1) when p is odd; (r, c) → (r, c, 1).
                let x = match (sx.dims(), p % 2) {
                    (&[a, b, c], 1) => self.add(Op::Reshape(Shape::new(&[a, b, c, 1])), &[x]),
                    (&[_, _, _], _) => x,
                    _ => {
                        let (r, c) = sx.rows_cols();
                        self.add(Op::Reshape(Shape::new(&[r, c, 1])), &[x])
                    }
                };
                if p / 2 % 2 == 1 {
                    // The statistics alone: (2, C).
                    self.add(Op::BatchMoments, &[x]);
                } else {
                    let d = self.shape(x);
                    let ch = Shape::new(&[d.dims()[d.rank() - 3]]);
                    let (g, b) = (self.adapt(y, &ch), self.adapt(z, &ch));
                    self.add(Op::BatchNorm { eps: 0.05 }, &[x, g, b]);
                }
            }
            38 => {
                let x = self.as_rank(x, 2);
                let sh = self.shape(x);
                let (n, dm) = (sh.dims()[0], sh.dims()[1]);
                let heads = 1 + usize::from(p % 2);
                let width = heads * (1 + usize::from(p / 2 % 2));
                let mask = (p / 4 % 2 == 1).then(|| Mask::causal(n).unwrap());
                let fused = p / 8 % 2 == 1;
                if p / 16 % 2 == 1 {
                    // The core alone on (n, width) queries, and keys and values as wide or,
                    // with two heads and one case in two, of one head (multi-query).
                    let s = Shape::new(&[n, width]);
                    let kv = match heads == 2 && p / 32 % 2 == 1 {
                        true => Shape::new(&[n, width / 2]),
                        false => s.clone(),
                    };
                    let (q, k, v) = (self.adapt(y, &s), self.adapt(z, &kv), self.adapt(x, &kv));
                    let op = Op::ScaledDotProductAttention { heads, mask, fused };
                    self.add(op, &[q, k, v]);
                } else {
                    let w = Shape::new(&[dm, width]);
                    let (wq, wk) = (self.adapt(y, &w), self.adapt(z, &w));
                    let wv = self.adapt(x, &w);
                    let wo = self.adapt(y, &Shape::new(&[width, dm]));
                    let op = Op::MultiHeadAttention { heads, mask, fused };
                    self.add(op, &[wq, wk, wv, wo, x]);
                }
            }
            39 => {
                // Scores (…, n, n) from x; the mask is causal or, when p is odd, leaves row 0
                // empty.
                let n = sx.dims().last().copied().unwrap_or(1);
                let x = if rank >= 2 && sx.dims()[rank - 2] == n {
                    x
                } else {
                    self.adapt(x, &Shape::new(&[n, n]))
                };
                let mask = if p % 2 == 1 {
                    Mask::from_fn(n, |i, j| i > 0 && j <= i).unwrap()
                } else {
                    Mask::causal(n).unwrap()
                };
                self.add(Op::MaskedSoftmax { mask }, &[x]);
            }
            k @ 32..=33 => self.conv_step(k == 33, x, y, z, p),
            k @ 34..=35 => self.pool_step(k == 35, x, y, p),
            48 => {
                // dropout(x)·x: the gradient reaching x sums the masked and the plain path.
                let keep = [0.5, 0.8, 1.0][usize::from(p % 3)];
                let (seed, counter) = (u64::from(p), u64::from(st.picks[2]));
                let op = Op::Dropout {
                    keep,
                    seed,
                    counter,
                };
                let d = self.add(op, &[x]);
                self.add(Op::Mul, &[d, x]);
            }
            49 | 50 => {
                // x·r + x with r a (gradient-free) uniform draw or a keep-½ mask.
                let (seed, counter) = (u64::from(p), u64::from(st.picks[2]));
                let op = if st.kind % MENU_LEN == 49 {
                    Op::RandUniform {
                        shape: sx,
                        seed,
                        counter,
                    }
                } else {
                    Op::BernoulliMask {
                        shape: sx,
                        keep: 0.5,
                        seed,
                        counter,
                    }
                };
                let r = self.add(op, &[]);
                let xr = self.add(Op::Mul, &[x, r]);
                self.add(Op::Add, &[xr, x]);
            }
            51 => {
                let a = self.as_rank(x, 2);
                let (n, w) = (self.shape(a).dims()[0], self.shape(a).dims()[1]);
                let modes = 1 + usize::from(p) % (n / 2 + 1);
                let ws = Shape::new(&[modes, w, w]);
                let wr = self.adapt(y, &ws);
                let wi = self.adapt(z, &ws);
                self.add(Op::SpectralConv1dRfft { modes }, &[a, wr, wi]);
            }
            _ => {
                let c = Tensor::from_fn(sx, |i| ((i * 7 + usize::from(p)) % 11) as f64 * 0.2 - 1.0);
                let c = self.add(Op::Constant(c), &[]);
                self.add(Op::Add, &[x, c]);
            }
        }
    }

    /// `x` as a channels-first operand: rank-3 operands as (C, H, W) for a 2-D window, others
    /// reshaped to (rows, last dim) for a 1-D one. Returns the operand and its shape.
    fn channels_first(&mut self, x: Id) -> (Id, Shape) {
        let x = if self.shape(x).rank() == 3 {
            x
        } else {
            self.as_rank(x, 2)
        };
        (x, self.shape(x))
    }

    /// conv (or convTranspose): kernel ≤ each spatial dim, stride 1–2, padding 0–1 (convT:
    /// padding < k/2 so the output is non-empty); weight and bias adapted from `y`, `z`.
    fn conv_step(&mut self, transpose: bool, x: Id, y: Id, z: Id, p: u16) {
        let (x, s) = self.channels_first(x);
        let c = s.dims()[0];
        let spatial = &s.dims()[1..];
        let out_c = 1 + usize::from(p % 2);
        let kernel: Vec<usize> = spatial
            .iter()
            .map(|&n| 1 + usize::from(p / 2) % n.min(3))
            .collect();
        let stride = vec![1 + usize::from(p / 8 % 2); spatial.len()];
        let padding: Vec<usize> = kernel
            .iter()
            .map(|&k| {
                if transpose {
                    (k - 1) / 2
                } else {
                    usize::from(p / 16 % 2)
                }
            })
            .collect();
        let (wa, wc) = if transpose { (c, out_c) } else { (out_c, c) };
        let mut wd = vec![wa, wc];
        wd.extend_from_slice(&kernel);
        let w = self.adapt(y, &Shape::from(wd));
        let b = self.adapt(z, &Shape::new(&[out_c]));
        let op = if transpose {
            Op::ConvTranspose { stride, padding }
        } else {
            Op::Conv { stride, padding }
        };
        self.push(op, &[w, b, x]);
    }

    /// maxPool / avgPool / smoothMaxPool (β = 1 or −2) with a kernel ≤ each spatial dim,
    /// stride 1–2 and padding ≤ k/2; half the time `y` (adapted) is added to the result, so
    /// earlier ids keep being reused.
    fn pool_step(&mut self, smooth: bool, x: Id, y: Id, p: u16) {
        let (x, s) = self.channels_first(x);
        let spatial = &s.dims()[1..];
        let kernel: Vec<usize> = spatial
            .iter()
            .map(|&n| 1 + usize::from(p / 4) % n.min(3))
            .collect();
        let stride = vec![1 + usize::from(p / 16 % 2); spatial.len()];
        let padding: Vec<usize> = kernel
            .iter()
            .map(|&k| usize::from(p / 32 % 2).min(k / 2))
            .collect();
        let op = match (smooth, p % 2) {
            (false, 0) => Op::MaxPool {
                kernel,
                stride,
                padding,
            },
            (false, _) => Op::AvgPool {
                kernel,
                stride,
                padding,
            },
            (true, sign) => Op::SmoothMaxPool {
                kernel,
                stride,
                padding,
                beta: if sign == 0 { 1.0 } else { -2.0 },
            },
        };
        let pooled = self.add(op, &[x]);
        if (p / 64).is_multiple_of(2) {
            let to = self.shape(pooled);
            let y = self.adapt(y, &to);
            self.add(Op::Add, &[pooled, y]);
        }
    }

    /// Append a node whose id the step does not need.
    fn push(&mut self, op: Op, args: &[Id]) {
        self.add(op, args);
    }

    /// `x` reshaped to rank 1, 2 (rows × last dim, or 1 × n) or 3 (leading 1s added).
    fn as_rank(&mut self, x: Id, rank: usize) -> Id {
        let s = self.shape(x);
        if s.rank() == rank {
            return x;
        }
        let to = match rank {
            1 => Shape::new(&[s.numel()]),
            2 => {
                let (r, c) = s.rows_cols();
                Shape::new(&[r, c])
            }
            _ => match s.dims() {
                &[r, c] => Shape::new(&[1, r, c]),
                _ => Shape::new(&[1, 1, s.numel()]),
            },
        };
        self.add(Op::Reshape(to), &[x])
    }
}
