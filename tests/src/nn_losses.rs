//! tl-nn's losses under the harness: every function of `tl_nn::losses` on random sizes,
//! inputs, targets, options and reductions, on every session ([`NnSession`]).
//!
//! For each case the loss's value and the gradient of `⟨cotangent, loss⟩` with respect to the
//! input must equal the loss written another way with plain catalogue ops ([`LossCase::reference`],
//! a `GraphBuilder` graph evaluated and differentiated by the IR in f64): host-made masks where
//! tl-nn composes branches from the targets (the hinges' ±1 targets, the Stirling term's
//! `y > 1`), `max(0, ·)` where it uses `relu`, `log σ(x)` where it uses `softplus`, the
//! class axis's log-sum-exp by `reduceSum` where it moves the axis last. The reference reads
//! the case's own sizes and options, never the loss's code. Inputs keep away from the kinks
//! (the tl-nn tests check the kinks against PyTorch), so the two agree to the tolerances of
//! [`Tol::DEFAULT`], in f32 at least the reference's own f32 error
//! ([`reference_floors`]).

use std::cell::RefCell;

use proptest::prelude::*;
use tl_ir::{GraphBuilder, Id, Op};
use tl_nn::losses::{self, KlReduction, Reduction};
use tl_nn::{Labels, Runtime, Scope, Var};
use tl_session::{Param, TensorRef};
use tl_spec::{Scalar, Shape, Tensor};

use crate::checks::{reduction_len, reference_floors};
use crate::nn::{LayerSession, NnSession, SessionCheck, close, on_session, values};
use crate::{CaseResult, Report, RunConfig, Tol, run_check};

/// The losses of `tl_nn::losses` the harness draws (one conformance test each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// `losses::binary_cross_entropy_with_logits`.
    BceWithLogits,
    /// `losses::binary_cross_entropy`.
    Bce,
    /// `losses::nll_loss`.
    Nll,
    /// `losses::cross_entropy_nd` on (N, C, d): the class axis moved last.
    CrossEntropyNd,
    /// `losses::cross_entropy`.
    CrossEntropy,
    /// `losses::mse_loss`.
    Mse,
    /// `losses::l1_loss`.
    L1,
    /// `losses::huber_loss`.
    Huber,
    /// `losses::smooth_l1_loss`.
    SmoothL1,
    /// `losses::relative_l2_loss`.
    RelativeL2,
    /// `losses::kl_div`.
    KlDiv,
    /// `losses::poisson_nll_loss`.
    PoissonNll,
    /// `losses::gaussian_nll_loss`.
    GaussianNll,
    /// `losses::margin_ranking_loss`.
    MarginRanking,
    /// `losses::hinge_embedding_loss`.
    HingeEmbedding,
    /// `losses::soft_margin_loss`.
    SoftMargin,
    /// `losses::multilabel_soft_margin_loss`.
    MultilabelSoftMargin,
    /// `losses::multi_margin_loss`.
    MultiMargin,
    /// `losses::cosine_embedding_loss`.
    CosineEmbedding,
    /// `losses::triplet_margin_loss`.
    TripletMargin,
}

/// Every loss, in test order.
pub const LOSSES: [Loss; 20] = [
    Loss::BceWithLogits,
    Loss::Bce,
    Loss::Nll,
    Loss::CrossEntropyNd,
    Loss::CrossEntropy,
    Loss::Mse,
    Loss::L1,
    Loss::Huber,
    Loss::SmoothL1,
    Loss::RelativeL2,
    Loss::KlDiv,
    Loss::PoissonNll,
    Loss::GaussianNll,
    Loss::MarginRanking,
    Loss::HingeEmbedding,
    Loss::SoftMargin,
    Loss::MultilabelSoftMargin,
    Loss::MultiMargin,
    Loss::CosineEmbedding,
    Loss::TripletMargin,
];

impl Loss {
    /// The function's name in `tl_nn::losses` (`cross_entropy_nd`: `cross_entropy` on (N, C,
    /// d)).
    pub fn name(self) -> &'static str {
        match self {
            Loss::BceWithLogits => "binary_cross_entropy_with_logits",
            Loss::Bce => "binary_cross_entropy",
            Loss::Nll => "nll_loss",
            Loss::CrossEntropyNd => "cross_entropy_nd",
            Loss::CrossEntropy => "cross_entropy",
            Loss::Mse => "mse_loss",
            Loss::L1 => "l1_loss",
            Loss::Huber => "huber_loss",
            Loss::SmoothL1 => "smooth_l1_loss",
            Loss::RelativeL2 => "relative_l2_loss",
            Loss::KlDiv => "kl_div",
            Loss::PoissonNll => "poisson_nll_loss",
            Loss::GaussianNll => "gaussian_nll_loss",
            Loss::MarginRanking => "margin_ranking_loss",
            Loss::HingeEmbedding => "hinge_embedding_loss",
            Loss::SoftMargin => "soft_margin_loss",
            Loss::MultilabelSoftMargin => "multilabel_soft_margin_loss",
            Loss::MultiMargin => "multi_margin_loss",
            Loss::CosineEmbedding => "cosine_embedding_loss",
            Loss::TripletMargin => "triplet_margin_loss",
        }
    }
}

/// One drawn case: the loss `name` of the input `x` (the one tensor with a gradient), its
/// other operands `aux` (constants), class labels, a parameter, flags and the reduction.
#[derive(Debug, Clone)]
pub struct LossCase {
    /// The loss.
    pub loss: Loss,
    /// The input.
    pub x: Tensor<f64>,
    /// The other operands (targets, weights, variances, the second input…), per loss.
    pub aux: Vec<Tensor<f64>>,
    /// Class labels (the classification losses).
    pub labels: Vec<usize>,
    /// The loss's scalar parameter (delta, beta, margin, label smoothing, …).
    pub param: f64,
    /// Two switches, per loss (weighted, `full`, `log_target`, `swap`, p = 2, …).
    pub flags: [bool; 2],
    /// 0 mean, 1 sum, 2 none; 3 `kl_div`'s batchmean.
    pub reduction: u8,
}

/// ±1 values of `dims`.
fn signs(dims: Vec<usize>) -> BoxedStrategy<Tensor<f64>> {
    let n = dims.iter().product::<usize>();
    prop::collection::vec(prop::bool::ANY, n)
        .prop_map(move |v| {
            Tensor::new(
                dims.clone(),
                v.iter().map(|&s| if s { 1.0 } else { -1.0 }).collect(),
            )
            .expect("sized")
        })
        .boxed()
}

/// Whole numbers 0..=6 of `dims` (Poisson counts, 0/1 multi-labels with `top` 1).
fn counts(dims: Vec<usize>, top: u8) -> BoxedStrategy<Tensor<f64>> {
    let n = dims.iter().product::<usize>();
    prop::collection::vec(0..=top, n)
        .prop_map(move |v| {
            Tensor::new(dims.clone(), v.iter().map(|&c| f64::from(c)).collect()).expect("sized")
        })
        .boxed()
}

/// Cases of `loss`.
pub fn loss_cases(loss: Loss) -> BoxedStrategy<LossCase> {
    let nd = loss == Loss::CrossEntropyNd;
    let shape = if nd {
        (1usize..=3, 1usize..=4, 1usize..=3)
            .prop_map(|(n, c, d)| vec![n, c, d])
            .boxed()
    } else {
        (1usize..=4, 1usize..=5)
            .prop_map(|(r, c)| vec![r, c])
            .boxed()
    };
    let reductions = if loss == Loss::KlDiv { 4 } else { 3 };
    (shape, 0..reductions, any::<[bool; 2]>(), 0usize..3)
        .prop_flat_map(move |(dims, reduction, flags, pick)| {
            let (r, c) = (dims[0], dims[1]);
            let rc = || dims.clone();
            let row = vec![r];
            let classes = vec![c];
            // Per loss: the input's range, the other operands, the parameter.
            let (lo, hi) = match loss {
                Loss::KlDiv => (-3.0, 0.0),
                _ => (-2.0, 2.0),
            };
            let aux: Vec<BoxedStrategy<Tensor<f64>>> = match loss {
                Loss::BceWithLogits => vec![
                    values(rc(), 0.0, 1.0),
                    values(classes.clone(), 0.5, 1.5),
                    values(classes.clone(), 0.5, 3.0),
                ],
                Loss::Bce => {
                    vec![values(rc(), 0.0, 1.0), values(classes.clone(), 0.5, 1.5)]
                }
                Loss::Nll | Loss::CrossEntropy | Loss::CrossEntropyNd | Loss::MultiMargin => {
                    vec![values(classes.clone(), 0.25, 2.0)]
                }
                Loss::Mse | Loss::L1 | Loss::Huber | Loss::SmoothL1 => {
                    vec![values(rc(), -2.0, 2.0)]
                }
                Loss::RelativeL2 => vec![values(rc(), 0.5, 1.5)],
                Loss::KlDiv => vec![values(rc(), 0.05, 1.0), values(rc(), -3.0, 0.0)],
                Loss::PoissonNll => vec![counts(rc(), 6)],
                Loss::GaussianNll => {
                    let var = match pick {
                        0 => rc(),
                        1 => row.clone(),
                        _ => vec![r, 1],
                    };
                    vec![values(rc(), -2.0, 2.0), values(var, 0.1, 2.0)]
                }
                Loss::MarginRanking => vec![values(rc(), -2.0, 2.0), signs(rc())],
                Loss::HingeEmbedding | Loss::SoftMargin => vec![signs(rc())],
                Loss::MultilabelSoftMargin => {
                    vec![counts(rc(), 1), values(classes.clone(), 0.5, 1.5)]
                }
                Loss::CosineEmbedding => vec![values(rc(), -2.0, 2.0), signs(row.clone())],
                Loss::TripletMargin => vec![values(rc(), -2.0, 2.0), values(rc(), -2.0, 2.0)],
            };
            let param = match loss {
                Loss::Huber => [0.5, 1.0, 2.0][pick],
                Loss::SmoothL1 => [0.0, 0.5, 1.0][pick],
                Loss::CrossEntropy | Loss::CrossEntropyNd => [0.0, 0.1, 0.3][pick],
                Loss::MarginRanking => [0.0, 0.5, 1.0][pick],
                Loss::HingeEmbedding => [0.5, 1.0, 2.0][pick],
                Loss::MultiMargin => [0.5, 1.0, 1.5][pick],
                Loss::CosineEmbedding => [-0.2, 0.0, 0.3][pick],
                Loss::TripletMargin => [0.5, 1.0, 2.0][pick],
                _ => 0.0,
            };
            let positions = if nd { r * dims[2] } else { r };
            (
                Just(dims.clone()),
                values(dims.clone(), lo, hi),
                aux,
                prop::collection::vec(0..c, positions),
                Just((param, flags, reduction as u8)),
            )
        })
        .prop_map(
            move |(_, x, aux, labels, (param, flags, reduction))| LossCase {
                loss,
                x,
                aux,
                labels,
                param,
                flags,
                reduction,
            },
        )
        .boxed()
}

impl LossCase {
    fn reduction(&self) -> Reduction {
        [Reduction::Mean, Reduction::Sum, Reduction::None][usize::from(self.reduction.min(2))]
    }

    fn classes(&self) -> usize {
        self.x.shape().dims()[1]
    }

    /// The class ignored by the classification losses with `flags[1]`: label 0 unless every
    /// label is 0 (a mean over nothing is an error).
    fn ignore_index(&self) -> Option<usize> {
        (self.flags[1] && self.labels.iter().any(|&l| l != 0)).then_some(0)
    }

    /// The class weights (`aux[0]`) with `flags[0]`.
    fn class_weight(&self) -> Option<Vec<f64>> {
        self.flags[0].then(|| self.aux[0].data().to_vec())
    }

    /// The loss through tl-nn on `x`, the case's operands as constants of the pass.
    fn run<'g, O: tl_session::Train>(
        &self,
        g: &Scope<'g, O>,
        x: &Var<'g, O>,
    ) -> tl_nn::Result<Var<'g, O>> {
        let aux = |k: usize| g.input(self.aux[k].cast());
        let r = self.reduction();
        let [f0, f1] = self.flags;
        let labels = || Labels::new(self.labels.clone(), self.classes());
        match self.loss {
            Loss::BceWithLogits => {
                let (w, pw) = (aux(1)?, aux(2)?);
                losses::binary_cross_entropy_with_logits(
                    x,
                    &aux(0)?,
                    f0.then_some(&w),
                    f1.then_some(&pw),
                    r,
                )
            }
            Loss::Bce => {
                let w = aux(1)?;
                losses::binary_cross_entropy(&x.sigmoid()?, &aux(0)?, f0.then_some(&w), r)
            }
            Loss::Nll => losses::nll_loss(
                &x.log_softmax()?,
                &labels()?,
                self.class_weight().as_deref(),
                self.ignore_index(),
                r,
            ),
            Loss::CrossEntropy | Loss::CrossEntropyNd => losses::cross_entropy(
                x,
                &labels()?,
                self.class_weight().as_deref(),
                self.ignore_index(),
                self.param,
                r,
            ),
            Loss::Mse => losses::mse_loss(x, &aux(0)?, r),
            Loss::L1 => losses::l1_loss(x, &aux(0)?, r),
            Loss::Huber => losses::huber_loss(x, &aux(0)?, self.param, r),
            Loss::SmoothL1 => losses::smooth_l1_loss(x, &aux(0)?, self.param, r),
            Loss::RelativeL2 => losses::relative_l2_loss(x, &aux(0)?, r),
            Loss::KlDiv => {
                let kr = [
                    KlReduction::Mean,
                    KlReduction::Sum,
                    KlReduction::None,
                    KlReduction::BatchMean,
                ][usize::from(self.reduction)];
                losses::kl_div(x, &aux(if f0 { 1 } else { 0 })?, kr, f0)
            }
            Loss::PoissonNll => {
                let input = if f0 { x.clone() } else { x.softplus()? };
                losses::poisson_nll_loss(&input, &aux(0)?, f0, f1, 1e-8, r)
            }
            Loss::GaussianNll => losses::gaussian_nll_loss(x, &aux(0)?, &aux(1)?, f0, 1e-6, r),
            Loss::MarginRanking => {
                losses::margin_ranking_loss(x, &aux(0)?, &aux(1)?, self.param, r)
            }
            Loss::HingeEmbedding => losses::hinge_embedding_loss(x, &aux(0)?, self.param, r),
            Loss::SoftMargin => losses::soft_margin_loss(x, &aux(0)?, r),
            Loss::MultilabelSoftMargin => {
                let w = aux(1)?;
                losses::multilabel_soft_margin_loss(x, &aux(0)?, f0.then_some(&w), r)
            }
            Loss::MultiMargin => losses::multi_margin_loss(
                x,
                &labels()?,
                if f1 { 2 } else { 1 },
                self.param,
                self.class_weight().as_deref(),
                r,
            ),
            Loss::CosineEmbedding => {
                losses::cosine_embedding_loss(x, &aux(0)?, &aux(1)?, self.param, r)
            }
            Loss::TripletMargin => losses::triplet_margin_loss(
                x,
                &aux(0)?,
                &aux(1)?,
                self.param,
                if f0 { 2 } else { 1 },
                1e-6,
                f1,
                r,
            ),
        }
    }

    /// The loss written with plain ops on the leaf `x`; returns the output id.
    pub fn reference(&self, b: &mut GraphBuilder, x: Id) -> tl_ir::Result<Id> {
        let dims = self.x.shape().dims().to_vec();
        let (rows, cols) = (dims[0], dims[1]);
        let n = self.x.shape().numel();
        let mut g = Ref {
            b,
            dims: dims.clone(),
        };
        let [f0, f1] = self.flags;
        let aux = |k: usize| self.aux[k].clone();
        // An (r, c) constant from a per-column (c) vector.
        let per_col = |v: &Tensor<f64>| Tensor::from_fn(dims.clone(), |i| v.data()[i % cols]);
        // An (r, c) constant from a per-row (r) vector.
        let per_row = |v: &Tensor<f64>| Tensor::from_fn(dims.clone(), |i| v.data()[i / cols]);
        let mask = |f: &dyn Fn(f64) -> bool, t: &Tensor<f64>| {
            Tensor::from_fn(t.shape().clone(), |i| f64::from(u8::from(f(t.data()[i]))))
        };
        // Element-wise losses reduce over every element; per-row ones sum their row first.
        let per_row_loss = matches!(
            self.loss,
            Loss::RelativeL2
                | Loss::MultilabelSoftMargin
                | Loss::MultiMargin
                | Loss::CosineEmbedding
                | Loss::TripletMargin
        );
        let terms = match self.loss {
            Loss::BceWithLogits | Loss::Bce => {
                // −w·(p·y·log σ(x) + (1 − y)·log σ(−x)); on probabilities p = 1 and σ(x) is
                // the input, whose complement 1 − σ(x) is σ(−x).
                let y = aux(0);
                let pw = if self.loss == Loss::BceWithLogits && f1 {
                    per_col(&aux(2))
                } else {
                    Tensor::full(dims.as_slice(), 1.0)
                };
                let on = Tensor::from_fn(dims.clone(), |i| -pw.data()[i] * y.data()[i]);
                let off = Tensor::from_fn(dims.clone(), |i| y.data()[i] - 1.0);
                let t = g.log_sigmoids(x, on, off)?;
                if f0 {
                    let w = per_col(&aux(1));
                    g.mul_k(t, w)?
                } else {
                    t
                }
            }
            Loss::Nll | Loss::CrossEntropy | Loss::CrossEntropyNd => {
                return self.class_reference(&mut g, x);
            }
            Loss::Mse | Loss::L1 | Loss::Huber | Loss::SmoothL1 => {
                let t = g.k(aux(0))?;
                let d = g.f(Op::Sub, &[x, t])?;
                let a = g.f(Op::Abs, &[d])?;
                match (self.loss, self.param) {
                    (Loss::Mse, _) => g.f(Op::Mul, &[d, d])?,
                    (Loss::L1, _) | (Loss::SmoothL1, 0.0) => a,
                    (_, delta) => {
                        // ½·min(|d|, δ)² + δ·max(|d| − δ, 0), over δ for smooth L1.
                        let k = g.full(delta)?;
                        let m = g.f(Op::Min, &[a, k])?;
                        let sq = g.f(Op::Mul, &[m, m])?;
                        let sq = g.f(Op::Scale(0.5), &[sq])?;
                        let over = g.f(Op::Sub, &[a, k])?;
                        let zero = g.full(0.0)?;
                        let over = g.f(Op::Max, &[over, zero])?;
                        let over = g.f(Op::Scale(delta), &[over])?;
                        let h = g.f(Op::Add, &[sq, over])?;
                        let by = if self.loss == Loss::SmoothL1 {
                            1.0 / delta
                        } else {
                            1.0
                        };
                        g.f(Op::Scale(by), &[h])?
                    }
                }
            }
            Loss::RelativeL2 => {
                // ‖d_b‖ / ‖t_b‖, each norm its own square root.
                let t = aux(0);
                let tk = g.k(t.clone())?;
                let d = g.f(Op::Sub, &[x, tk])?;
                let d2 = g.f(Op::Mul, &[d, d])?;
                let num = g.f(Op::ReduceSum(1), &[d2])?;
                let num = g.f(Op::Sqrt, &[num])?;
                let norms = Tensor::from_fn([rows], |b| {
                    t.data()[b * cols..(b + 1) * cols]
                        .iter()
                        .map(|v| v * v)
                        .sum::<f64>()
                        .sqrt()
                        .recip()
                });
                g.mul_k(num, norms)?
            }
            Loss::KlDiv => {
                if f0 {
                    // e^t·t − e^t·x, e^t computed here.
                    let t = aux(1);
                    let et = Tensor::from_fn(dims.clone(), |i| t.data()[i].exp());
                    let c = Tensor::from_fn(dims.clone(), |i| et.data()[i] * t.data()[i]);
                    let ex = g.mul_k(x, et.map(|v| -v))?;
                    let c = g.k(c)?;
                    g.f(Op::Add, &[c, ex])?
                } else {
                    let q = aux(0);
                    let c = Tensor::from_fn(dims.clone(), |i| q.data()[i] * q.data()[i].ln());
                    let qx = g.mul_k(x, q.map(|v| -v))?;
                    let c = g.k(c)?;
                    g.f(Op::Add, &[c, qx])?
                }
            }
            Loss::PoissonNll => {
                let y = aux(0);
                let ny = y.map(|v| -v);
                let t = if f0 {
                    let e = g.f(Op::Exp, &[x])?;
                    let yx = g.mul_k(x, ny)?;
                    g.f(Op::Add, &[e, yx])?
                } else {
                    let rate = g.f(Op::Softplus, &[x])?;
                    let eps = g.full(1e-8)?;
                    let l = g.f(Op::Add, &[rate, eps])?;
                    let l = g.f(Op::Log, &[l])?;
                    let yl = g.mul_k(l, ny)?;
                    g.f(Op::Add, &[rate, yl])?
                };
                if f1 {
                    let stirling = Tensor::from_fn(dims.clone(), |i| {
                        let v = y.data()[i];
                        if v > 1.0 {
                            v * v.ln() - v + 0.5 * (2.0 * std::f64::consts::PI * v).ln()
                        } else {
                            0.0
                        }
                    });
                    let s = g.k(stirling)?;
                    g.f(Op::Add, &[t, s])?
                } else {
                    t
                }
            }
            Loss::GaussianNll => {
                // ½·ln v + ½·(x − t)²/v, v broadcast here.
                let v = aux(1);
                let v = if v.shape().dims() == dims.as_slice() {
                    v
                } else {
                    per_row(&Tensor::vector(v.data().to_vec()))
                };
                let t = g.k(aux(0))?;
                let d = g.f(Op::Sub, &[x, t])?;
                let d2 = g.f(Op::Mul, &[d, d])?;
                let q = g.mul_k(d2, v.map(|v| 0.5 / v))?;
                let full = if f0 {
                    0.5 * (2.0 * std::f64::consts::PI).ln()
                } else {
                    0.0
                };
                let c = g.k(v.map(|v| 0.5 * v.ln() + full))?;
                g.f(Op::Add, &[q, c])?
            }
            Loss::MarginRanking => {
                // max(0, margin − y·x + y·x₂).
                let (x2, y) = (aux(0), aux(1));
                let c = Tensor::from_fn(dims.clone(), |i| self.param + y.data()[i] * x2.data()[i]);
                let yx = g.mul_k(x, y.map(|v| -v))?;
                let c = g.k(c)?;
                let z = g.f(Op::Add, &[yx, c])?;
                let zero = g.full(0.0)?;
                g.f(Op::Max, &[z, zero])?
            }
            Loss::HingeEmbedding => {
                let y = aux(0);
                let pos = g.mul_k(x, mask(&|v| v == 1.0, &y))?;
                let m = g.full(self.param)?;
                let h = g.f(Op::Sub, &[m, x])?;
                let zero = g.full(0.0)?;
                let h = g.f(Op::Max, &[h, zero])?;
                let neg = g.mul_k(h, mask(&|v| v == -1.0, &y))?;
                g.f(Op::Add, &[pos, neg])?
            }
            Loss::SoftMargin => {
                // ln(1 + e^{−y·x}).
                let e = g.mul_k(x, aux(0).map(|v| -v))?;
                let e = g.f(Op::Exp, &[e])?;
                let one = g.full(1.0)?;
                let e = g.f(Op::Add, &[e, one])?;
                g.f(Op::Log, &[e])?
            }
            Loss::MultilabelSoftMargin => {
                // −(y·log σ(x) + (1 − y)·log σ(−x))·w, summed over classes, over C.
                let y = aux(0);
                let w = if f0 {
                    per_col(&aux(1))
                } else {
                    Tensor::full(dims.as_slice(), 1.0)
                };
                let on = Tensor::from_fn(dims.clone(), |i| -y.data()[i] * w.data()[i]);
                let off = Tensor::from_fn(dims.clone(), |i| (y.data()[i] - 1.0) * w.data()[i]);
                let t = g.log_sigmoids(x, on, off)?;
                let t = g.f(Op::ReduceSum(1), &[t])?;
                g.f(Op::Scale(1.0 / cols as f64), &[t])?
            }
            Loss::MultiMargin => {
                // Σ_{c ≠ y} w_y·max(0, margin − x_y + x_c)^p / C, x_y by a one-hot product.
                let onehot = Tensor::from_fn(dims.clone(), |i| {
                    f64::from(u8::from(self.labels[i / cols] == i % cols))
                });
                let w = self.class_weight();
                let keep = Tensor::from_fn(dims.clone(), |i| {
                    let y = self.labels[i / cols];
                    match (y == i % cols, &w) {
                        (true, _) => 0.0,
                        (false, Some(w)) => w[y],
                        (false, None) => 1.0,
                    }
                });
                let picked = g.mul_k(x, onehot)?;
                let picked = g.f(Op::ReduceSum(1), &[picked])?;
                let picked = g.f(Op::Reshape(Shape::new(&[rows, 1])), &[picked])?;
                let picked = g.f(Op::BroadcastTo(Shape::new(&dims)), &[picked])?;
                let z = g.f(Op::Sub, &[x, picked])?;
                let m = g.full(self.param)?;
                let z = g.f(Op::Add, &[z, m])?;
                let zero = g.full(0.0)?;
                let z = g.f(Op::Max, &[z, zero])?;
                let h = if f1 { g.f(Op::Mul, &[z, z])? } else { z };
                let h = g.mul_k(h, keep)?;
                let h = g.f(Op::ReduceSum(1), &[h])?;
                g.f(Op::Scale(1.0 / cols as f64), &[h])?
            }
            Loss::CosineEmbedding => {
                // dot / (√(‖x‖² + ε)·√(‖x₂‖² + ε)); 1 − cos where y = 1, max(0, cos − m) where −1.
                let (x2, y) = (aux(0), aux(1));
                let dot = g.mul_k(x, x2.clone())?;
                let dot = g.f(Op::ReduceSum(1), &[dot])?;
                let sq = g.f(Op::Mul, &[x, x])?;
                let sq = g.f(Op::ReduceSum(1), &[sq])?;
                let eps = g.k(Tensor::full([rows], 1e-12))?;
                let sq = g.f(Op::Add, &[sq, eps])?;
                let nx = g.f(Op::Sqrt, &[sq])?;
                let cos = g.f(Op::Div, &[dot, nx])?;
                let n2 = Tensor::from_fn([rows], |b| {
                    let s: f64 = x2.data()[b * cols..(b + 1) * cols]
                        .iter()
                        .map(|v| v * v)
                        .sum();
                    (s + 1e-12).sqrt().recip()
                });
                let cos = g.mul_k(cos, n2)?;
                let one = g.k(Tensor::full([rows], 1.0))?;
                let pos = g.f(Op::Sub, &[one, cos])?;
                let pos = g.mul_k(pos, mask(&|v| v == 1.0, &y))?;
                let m = g.k(Tensor::full([rows], self.param))?;
                let neg = g.f(Op::Sub, &[cos, m])?;
                let zero = g.k(Tensor::full([rows], 0.0))?;
                let neg = g.f(Op::Max, &[neg, zero])?;
                let neg = g.mul_k(neg, mask(&|v| v == -1.0, &y))?;
                g.f(Op::Add, &[pos, neg])?
            }
            Loss::TripletMargin => {
                let p2 = f0;
                let (pos, neg) = (aux(0), aux(1));
                let d_ap = g.distance(x, &pos, p2)?;
                let d_an = g.distance(x, &neg, p2)?;
                let d_an = if f1 {
                    // d(p, n) is a constant here.
                    let d_pn = Tensor::from_fn([rows], |b| {
                        let s = b * cols..(b + 1) * cols;
                        let e = pos.data()[s.clone()].iter().zip(&neg.data()[s]);
                        if p2 {
                            e.map(|(p, n)| (p - n + 1e-6).powi(2)).sum::<f64>().sqrt()
                        } else {
                            e.map(|(p, n)| (p - n + 1e-6).abs()).sum::<f64>()
                        }
                    });
                    let d_pn = g.k(d_pn)?;
                    g.f(Op::Min, &[d_an, d_pn])?
                } else {
                    d_an
                };
                let z = g.f(Op::Sub, &[d_ap, d_an])?;
                let m = g.k(Tensor::full([rows], self.param))?;
                let z = g.f(Op::Add, &[z, m])?;
                let zero = g.k(Tensor::full([rows], 0.0))?;
                g.f(Op::Max, &[z, zero])?
            }
        };
        // The reduction: over elements, or over rows for the per-row losses.
        let count = if per_row_loss { rows } else { n };
        match self.reduction {
            0 => {
                let s = g.f(Op::Sum, &[terms])?;
                g.f(Op::Scale(1.0 / count as f64), &[s])
            }
            1 => g.f(Op::Sum, &[terms]),
            3 => {
                let s = g.f(Op::Sum, &[terms])?;
                g.f(Op::Scale(1.0 / rows as f64), &[s])
            }
            _ => Ok(terms),
        }
    }

    /// `nll_loss` of `log_softmax(x)` and `cross_entropy` (any rank ≥ 2, classes on axis 1):
    /// the log-softmax as `x − log Σ_c eˣ` along axis 1 by `reduceSum`, then host masks of
    /// each position's weight at its label (0 where ignored) and, with label smoothing, of
    /// every class's weight on the kept positions; the mean divides by the kept weights.
    fn class_reference(&self, g: &mut Ref<'_>, x: Id) -> tl_ir::Result<Id> {
        let dims = g.dims.clone();
        let (n, c) = (dims[0], dims[1]);
        let inner: usize = dims[2..].iter().product();
        let e = g.f(Op::Exp, &[x])?;
        let s = g.f(Op::ReduceSum(1), &[e])?;
        let s = g.f(Op::Log, &[s])?;
        let mut kept_shape = vec![n, 1];
        kept_shape.extend_from_slice(&dims[2..]);
        let s = g.f(Op::Reshape(Shape::new(&kept_shape)), &[s])?;
        let s = g.f(Op::BroadcastTo(Shape::new(&dims)), &[s])?;
        let ls = g.f(Op::Sub, &[x, s])?;
        let w = self.class_weight();
        let wc = |k: usize| w.as_ref().map_or(1.0, |w| w[k]);
        let ignore = self.ignore_index();
        // Element i of (n, c, inner): sample i / (c·inner), class (i / inner) % c, position.
        let at = |i: usize| (i / (c * inner), (i / inner) % c, i % inner);
        let label = |i: usize| {
            let (b, _, p) = at(i);
            self.labels[b * inner + p]
        };
        let kept = |i: usize| ignore != Some(label(i));
        let eps = if self.loss == Loss::Nll {
            0.0
        } else {
            self.param
        };
        let coef = Tensor::from_fn(dims.clone(), |i| {
            let (_, k, _) = at(i);
            if !kept(i) {
                return 0.0;
            }
            let nll = if label(i) == k {
                (1.0 - eps) * wc(k)
            } else {
                0.0
            };
            -(nll + eps / c as f64 * wc(k))
        });
        let t = g.mul_k(ls, coef)?;
        let per_position = g.f(Op::ReduceSum(1), &[t])?;
        match self.reduction {
            0 => {
                let total: f64 = (0..n * inner)
                    .filter(|&q| ignore != Some(self.labels[q]))
                    .map(|q| wc(self.labels[q]))
                    .sum();
                let s = g.f(Op::Sum, &[per_position])?;
                g.f(Op::Scale(1.0 / total), &[s])
            }
            1 => g.f(Op::Sum, &[per_position]),
            _ => Ok(per_position),
        }
    }
}

/// A reference graph under construction, with the input's dims for constants.
struct Ref<'a> {
    b: &'a mut GraphBuilder,
    dims: Vec<usize>,
}

impl Ref<'_> {
    fn f(&mut self, op: Op, args: &[Id]) -> tl_ir::Result<Id> {
        self.b.apply(op, args)
    }
    fn k(&mut self, t: Tensor<f64>) -> tl_ir::Result<Id> {
        self.b.apply(Op::Constant(t), &[])
    }
    /// `v` everywhere in the input's shape.
    fn full(&mut self, v: f64) -> tl_ir::Result<Id> {
        self.k(Tensor::full(self.dims.as_slice(), v))
    }
    /// `a · t` for a constant `t` of `a`'s shape.
    fn mul_k(&mut self, a: Id, t: Tensor<f64>) -> tl_ir::Result<Id> {
        let k = self.k(t)?;
        self.f(Op::Mul, &[a, k])
    }
    /// `on·log σ(x) + off·log σ(−x)` for constants `on`, `off` of x's shape (the binary
    /// cross-entropies' two terms, log σ(−x) being log(1 − σ(x))).
    fn log_sigmoids(&mut self, x: Id, on: Tensor<f64>, off: Tensor<f64>) -> tl_ir::Result<Id> {
        let ls = self.f(Op::Sigmoid, &[x])?;
        let ls = self.f(Op::Log, &[ls])?;
        let nx = self.f(Op::Scale(-1.0), &[x])?;
        let lc = self.f(Op::Sigmoid, &[nx])?;
        let lc = self.f(Op::Log, &[lc])?;
        let a = self.mul_k(ls, on)?;
        let c = self.mul_k(lc, off)?;
        self.f(Op::Add, &[a, c])
    }

    /// `‖x − other + 1e-6‖` along the last axis, the 2-norm or (`p2` false) the 1-norm.
    fn distance(&mut self, x: Id, other: &Tensor<f64>, p2: bool) -> tl_ir::Result<Id> {
        let shifted = other.map(|v| 1e-6 - v);
        let k = self.k(shifted)?;
        let d = self.f(Op::Add, &[x, k])?;
        if p2 {
            let d2 = self.f(Op::Mul, &[d, d])?;
            let s = self.f(Op::ReduceSum(1), &[d2])?;
            self.f(Op::Sqrt, &[s])
        } else {
            let a = self.f(Op::Abs, &[d])?;
            self.f(Op::ReduceSum(1), &[a])
        }
    }
}

/// The cotangent of a `None` reduction's values: 1, 0.7, 0.4, 0.1, repeating (a scalar loss
/// gets 1).
fn cotangent(shape: &Shape) -> Tensor<f64> {
    Tensor::from_fn(shape.clone(), |i| 1.0 - 0.3 * (i % 4) as f64)
}

impl SessionCheck for LossCase {
    fn run<O: LayerSession + 'static>(&self, session: O) -> CaseResult {
        let mut b = GraphBuilder::new();
        let xl = b
            .leaf(self.x.shape().clone(), None)
            .map_err(|e| e.to_string())?;
        let out = self
            .reference(&mut b, xl)
            .map_err(|e| format!("reference: {e}"))?;
        let graph = b.finish();
        let leaves = [self.x.clone()];
        let want = graph.eval(&leaves, &[]).map_err(|e| e.to_string())?;
        let seed = cotangent(want[out].shape());
        let want_g = graph
            .backprop_all(&leaves, &[], out, &seed)
            .map_err(|e| e.to_string())?;
        let rt = Runtime::new(session);
        let xr: RefCell<Vec<TensorRef>> = RefCell::new(Vec::new());
        let (value, grads) = rt
            .record(
                &Vec::<Param>::new(),
                false,
                |g| {
                    let x = g.input_grad(self.x.cast())?;
                    xr.borrow_mut().push(x.tensor_ref().clone());
                    self.run(g, &x)
                },
                |s, out| {
                    let v = s.read(out)?;
                    let g = s.seeded_grads(out, seed.cast(), &xr.borrow())?;
                    Ok((v, g))
                },
            )
            .map_err(|e| format!("the pass failed: {e}"))?;
        if value.shape() != want[out].shape() {
            return Err(format!(
                "the loss has shape {}, the reference {}",
                value.shape(),
                want[out].shape()
            ));
        }
        // In f32, at least the reference's own f32 error (`checks::reference_floors`, as on
        // random DAGs): a cosine of nearly parallel rows has a gradient that is the small
        // difference of terms near 1/|x|, which f32 cannot hold whoever computes it.
        let (tol_value, tol_grad) = if O::T::NAME == "f64" {
            (Tol::DEFAULT.f64, Tol::DEFAULT.f64)
        } else {
            let tol = Tol::DEFAULT.f32_for(reduction_len(&graph));
            let leaves: Vec<Tensor<O::T>> = vec![self.x.cast()];
            let seed_t: Tensor<O::T> = seed.cast();
            let values = reference_floors(&graph, &leaves, |g, l, _| g.eval(l, &[]).ok(), &want);
            let grads = reference_floors(
                &graph,
                &leaves,
                |g, l, id| g.backprop_all(l, &[], id(out), &seed_t).ok(),
                &want_g,
            );
            (tol.max(values[out]), tol.max(grads[0]))
        };
        let m = close(&value, &want[out], tol_value, "loss")?;
        let g = grads.first().ok_or("no gradient of the input")?;
        Ok(m.max(close(g, &want_g[0], tol_grad, "gradient of the input")?))
    }
}

/// The check of `loss` on session `on`: `cfg.cases` cases, labelled
/// `nn loss <name> <session>`.
pub fn check_loss(loss: Loss, on: NnSession, cfg: &RunConfig) -> Report {
    let name = loss.name();
    let label = format!("nn loss {name} {}", on.name());
    run_check(label, cfg, loss_cases(loss), move |c| {
        on_session(on, c).map_err(|e| format!("{name} {}: {e}", on.name()))
    })
}
