//! Each layer written with plain catalogue ops ([`LayerSpec::reference`]): the graph the
//! harness compares the layer against, built from the case's own sizes and settings, never
//! from the layer's fields.

use super::*;

impl LayerSpec {
    /// The layer written with plain catalogue ops: `p` are the parameters' leaves (in
    /// `LayerSpec::slots` order), `x` the input's; returns the output id.
    pub fn reference(&self, b: &mut GraphBuilder, p: &[Id], x: Option<Id>) -> tl_ir::Result<Id> {
        let x = || {
            x.ok_or(tl_ir::Error::Count {
                what: "nn reference: the layer's input",
                expected: 1,
                got: 0,
            })
        };
        let reshape = |b: &mut GraphBuilder, v: Id, dims: &[usize]| {
            b.apply(Op::Reshape(Shape::new(dims)), &[v])
        };
        match self {
            LayerSpec::Linear {
                inputs,
                outputs,
                lead,
                ..
            } => {
                let rows = lead.iter().product::<usize>();
                let bias = p.get(1).copied();
                let y = linear_ref(b, p[0], bias, x()?, rows, *inputs, *outputs)?;
                let out: Vec<usize> = lead.iter().chain([outputs]).copied().collect();
                reshape(b, y, &out)
            }
            LayerSpec::Conv {
                transpose,
                kernel,
                stride,
                padding,
                ..
            } => {
                let d = kernel.len();
                let (stride, padding) = (vec![*stride; d], vec![*padding; d]);
                let op = if *transpose {
                    Op::ConvTranspose { stride, padding }
                } else {
                    Op::Conv { stride, padding }
                };
                b.apply(op, &[p[0], p[1], x()?])
            }
            LayerSpec::Pool {
                avg,
                kernel,
                stride,
                padding,
                ..
            } => {
                let d = kernel.len();
                let op = pool_op(*avg, kernel.clone(), vec![*stride; d], vec![*padding; d]);
                b.apply(op, &[x()?])
            }
            LayerSpec::LayerNorm {
                eps,
                dim,
                over,
                lead,
            } if !over.is_empty() => {
                // The normalised axes as one row: (lead…, row), the affine (row), and back.
                let row = dim * over.iter().product::<usize>();
                let rows: Vec<usize> = lead.iter().copied().chain([row]).collect();
                let full: Vec<usize> = lead.iter().chain(over).chain([dim]).copied().collect();
                let xr = reshape(b, x()?, &rows)?;
                let (w, bias) = (reshape(b, p[0], &[row])?, reshape(b, p[1], &[row])?);
                let y = b.apply(Op::LayerNorm { eps: *eps }, &[xr, w, bias])?;
                reshape(b, y, &full)
            }
            LayerSpec::LayerNorm { eps, .. } => {
                b.apply(Op::LayerNorm { eps: *eps }, &[x()?, p[0], p[1]])
            }
            LayerSpec::BatchNorm {
                channels,
                n,
                rest,
                eps,
                training,
            } => {
                let (c, r) = (*channels, rest.iter().product::<usize>());
                let full: Vec<usize> = [*n, c].iter().chain(rest).copied().collect();
                let to = Shape::new(&[*n, c, r, 1]);
                let x4 = reshape(b, x()?, to.dims())?;
                let y = if *training {
                    b.apply(Op::BatchNorm { eps: *eps }, &[x4, p[0], p[1]])?
                } else {
                    // (x − mean)/√(var + ε)·γ + β per channel, the running statistics as given.
                    let per = |b: &mut GraphBuilder, v: Id| -> tl_ir::Result<Id> {
                        let v = reshape(b, v, &[c, 1, 1])?;
                        b.apply(Op::BroadcastTo(to.clone()), &[v])
                    };
                    let eps = b.apply(Op::Constant(Tensor::full([c], *eps)), &[])?;
                    let var = b.apply(Op::Add, &[p[3], eps])?;
                    let sd = b.apply(Op::Sqrt, &[var])?;
                    let (mean, sd, gamma, beta) =
                        (per(b, p[2])?, per(b, sd)?, per(b, p[0])?, per(b, p[1])?);
                    let centred = b.apply(Op::Sub, &[x4, mean])?;
                    let xhat = b.apply(Op::Div, &[centred, sd])?;
                    let scaled = b.apply(Op::Mul, &[xhat, gamma])?;
                    b.apply(Op::Add, &[scaled, beta])?
                };
                reshape(b, y, &full)
            }
            LayerSpec::RmsNorm { dim, eps, lead } => {
                // x / √(Σx²/dim + ε) · γ: a sum scaled and a division, where the layer takes a
                // mean and multiplies by the inverse.
                let x = x()?;
                let full: Vec<usize> = lead.iter().chain([dim]).copied().collect();
                let keep: Vec<usize> = lead.iter().copied().chain([1]).collect();
                let to = Shape::new(&full);
                let sq = b.apply(Op::Mul, &[x, x])?;
                let ss = b.apply(Op::ReduceSum(lead.len()), &[sq])?;
                let ms = b.apply(Op::Scale(1.0 / *dim as f64), &[ss])?;
                let lead_shape = Shape::new(lead);
                // `None` only in the shape-only graph of `layer_cases`: `compare` writes it out.
                let eps = eps.unwrap_or(f64::NAN);
                let eps = b.apply(Op::Constant(Tensor::full(lead_shape, eps)), &[])?;
                let rms = b.apply(Op::Add, &[ms, eps])?;
                let rms = b.apply(Op::Sqrt, &[rms])?;
                let rms = reshape(b, rms, &keep)?;
                let rms = b.apply(Op::BroadcastTo(to.clone()), &[rms])?;
                let xn = b.apply(Op::Div, &[x, rms])?;
                let gamma = b.apply(Op::BroadcastTo(to), &[p[0]])?;
                b.apply(Op::Mul, &[xn, gamma])
            }
            LayerSpec::GroupNorm {
                groups,
                channels,
                n,
                rest,
                eps,
            } => {
                // Per (sample, group): (x − mean)/√(mean((x − mean)²) + ε), from reductions,
                // where the layer runs the layerNorm op; then x̂·γ + β per channel.
                let (c, r) = (*channels, rest.iter().product::<usize>());
                let (rows, len) = (n * groups, c / groups * r);
                let full: Vec<usize> = [*n, c].iter().chain(rest).copied().collect();
                let grid = Shape::new(&[rows, len]);
                let xr = reshape(b, x()?, grid.dims())?;
                let per_row = |b: &mut GraphBuilder, v: Id| -> tl_ir::Result<Id> {
                    let v = reshape(b, v, &[rows, 1])?;
                    b.apply(Op::BroadcastTo(grid.clone()), &[v])
                };
                let mean = b.apply(Op::ReduceMean(1), &[xr])?;
                let mean = per_row(b, mean)?;
                let centred = b.apply(Op::Sub, &[xr, mean])?;
                let sq = b.apply(Op::Mul, &[centred, centred])?;
                let var = b.apply(Op::ReduceMean(1), &[sq])?;
                let eps = b.apply(Op::Constant(Tensor::full([rows], *eps)), &[])?;
                let sd = b.apply(Op::Add, &[var, eps])?;
                let sd = b.apply(Op::Sqrt, &[sd])?;
                let sd = per_row(b, sd)?;
                let xhat = b.apply(Op::Div, &[centred, sd])?;
                let to = Shape::new(&[*n, c, r]);
                let xhat = reshape(b, xhat, to.dims())?;
                let per_channel = |b: &mut GraphBuilder, v: Id| -> tl_ir::Result<Id> {
                    let v = reshape(b, v, &[c, 1])?;
                    b.apply(Op::BroadcastTo(to.clone()), &[v])
                };
                let (gamma, beta) = (per_channel(b, p[0])?, per_channel(b, p[1])?);
                let scaled = b.apply(Op::Mul, &[xhat, gamma])?;
                let y = b.apply(Op::Add, &[scaled, beta])?;
                reshape(b, y, &full)
            }
            LayerSpec::Embedding { num, ids, .. } => {
                // One-hot rows times the table.
                let k = ids.len();
                let onehot =
                    Tensor::from_fn(
                        [k, *num],
                        |i| {
                            if ids[i / num] == i % num { 1.0 } else { 0.0 }
                        },
                    );
                let oh = b.apply(Op::Constant(onehot), &[])?;
                b.apply(Op::Matmul, &[oh, p[0]])
            }
            LayerSpec::Dropout {
                p: drop, training, ..
            } => {
                if *training && *drop > 0.0 {
                    let op = Op::Dropout {
                        keep: 1.0 - drop,
                        seed: NN_SEED,
                        counter: 0,
                    };
                    b.apply(op, &[x()?])
                } else {
                    x()
                }
            }
            LayerSpec::Attention {
                heads,
                kv_heads,
                rope: None,
                causal,
                n,
                ..
            } if kv_heads == heads => {
                let op = Op::MultiHeadAttention {
                    heads: *heads,
                    mask: causal.then(|| Mask::causal(*n).unwrap()),
                    fused: false,
                };
                b.apply(op, &[p[0], p[1], p[2], p[3], x()?])
            }
            // Rotary or grouped: the cross-attention reference over x itself.
            LayerSpec::Attention {
                heads,
                kv_heads,
                head_dim,
                rope,
                causal,
                n,
                batch,
            } => {
                let sizes = CrossSizes {
                    heads: *heads,
                    kv_heads: *kv_heads,
                    head_dim: *head_dim,
                    nq: *n,
                    nk: *n,
                    batch: *batch,
                    rope: *rope,
                    causal: *causal,
                };
                let x = x()?;
                cross_attention_ref(b, sizes, p, x, x, None)
            }
            LayerSpec::CrossAttention {
                heads,
                kv_heads,
                head_dim,
                nq,
                nk,
                batch,
                memory,
                keep,
                rope,
                // The key flags as an attention mask: the same keys.
                as_mask: _,
            } => {
                let sizes = CrossSizes {
                    heads: *heads,
                    kv_heads: *kv_heads,
                    head_dim: *head_dim,
                    nq: *nq,
                    nk: *nk,
                    batch: *batch,
                    rope: *rope,
                    causal: false,
                };
                let memory = b.apply(Op::Constant(memory.clone()), &[])?;
                cross_attention_ref(b, sizes, p, x()?, memory, keep.as_deref())
            }
            LayerSpec::Spectral { modes, .. } => b.apply(
                Op::SpectralConv1dRfft { modes: *modes },
                &[x()?, p[0], p[1]],
            ),
            LayerSpec::Upsample {
                scale,
                linear,
                shape,
            } => {
                // Along each spatial axis in turn, (pre, d, post) → (pre, d·s, post). Nearest:
                // a 0/1 matrix R (d·s, d) with R[i][i / s] = 1 as a matmul, where the layer
                // reshapes and broadcasts. Linear: each output cell j's two neighbours picked
                // by 0/1 matrices and weighed by (1 − λⱼ, λⱼ) with a broadcast `mul`, where the
                // layer multiplies by one matrix of weights.
                let mut y = x()?;
                let mut dims = shape.clone();
                for k in 2..shape.len() {
                    let s = if scale.len() == 1 {
                        scale[0]
                    } else {
                        scale[k - 2]
                    };
                    let (pre, d) = (dims[..k].iter().product::<usize>(), dims[k]);
                    let post = dims[k + 1..].iter().product::<usize>();
                    let o = d * s;
                    // Output cell j's neighbours (lo, hi) and hi's weight.
                    let cell = |j: usize| -> (usize, usize, f64) {
                        match linear {
                            None => (j / s, j / s, 0.0),
                            Some(true) if o == 1 => (0, 0, 0.0),
                            Some(true) => {
                                let src = (j * (d - 1)) as f64 / (o - 1) as f64;
                                let lo = (j * (d - 1)) / (o - 1);
                                (lo, (lo + 1).min(d - 1), src - lo as f64)
                            }
                            Some(false) => {
                                // src = (2j + 1 − s)/(2s), or 0 where that is negative.
                                let twice = (2 * j + 1) as f64 - s as f64;
                                let src = (twice / (2 * s) as f64).max(0.0);
                                let lo = (src.floor() as usize).min(d - 1);
                                (lo, (lo + 1).min(d - 1), src - lo as f64)
                            }
                        }
                    };
                    let pick = |hi: bool| {
                        Tensor::from_fn([d, o], |e| {
                            let (i, j) = (e / o, e % o);
                            let (lo, up, _) = cell(j);
                            if i == if hi { up } else { lo } {
                                1.0
                            } else {
                                0.0
                            }
                        })
                    };
                    // (pre, d, post) → (pre, post, d) → (pre·post, d)·R → back.
                    let t = reshape(b, y, &[pre, d, post])?;
                    let t = b.apply(Op::SwapLastTwo, &[t])?;
                    let t = reshape(b, t, &[pre * post, d])?;
                    let lo = b.apply(Op::Constant(pick(false)), &[])?;
                    let t = if linear.is_none() {
                        b.apply(Op::Matmul, &[t, lo])?
                    } else {
                        let hi = b.apply(Op::Constant(pick(true)), &[])?;
                        let weight = |hi: bool| {
                            Tensor::from_fn([pre * post, o], |e| {
                                let lambda = cell(e % o).2;
                                if hi { lambda } else { 1.0 - lambda }
                            })
                        };
                        let (wlo, whi) = (
                            b.apply(Op::Constant(weight(false)), &[])?,
                            b.apply(Op::Constant(weight(true)), &[])?,
                        );
                        let at_lo = b.apply(Op::Matmul, &[t, lo])?;
                        let at_hi = b.apply(Op::Matmul, &[t, hi])?;
                        let at_lo = b.apply(Op::Mul, &[at_lo, wlo])?;
                        let at_hi = b.apply(Op::Mul, &[at_hi, whi])?;
                        b.apply(Op::Add, &[at_lo, at_hi])?
                    };
                    let t = reshape(b, t, &[pre, post, o])?;
                    let t = b.apply(Op::SwapLastTwo, &[t])?;
                    dims[k] = o;
                    y = reshape(b, t, &dims)?;
                }
                Ok(y)
            }
            LayerSpec::AdaptiveAvgPool { output, shape } => {
                // Along each spatial axis (identity sizes included): the window sums as a
                // matmul by a 0/1 matrix, then a division by each window's count; the layer
                // multiplies by 1/count inside its matrix and skips identity axes.
                let mut y = x()?;
                let mut dims = shape.clone();
                let first = shape.len() - output.len();
                for (k, &o) in (first..).zip(output) {
                    let (pre, d) = (dims[..k].iter().product::<usize>(), dims[k]);
                    let post = dims[k + 1..].iter().product::<usize>();
                    // Output cell i covers [⌊i·d/o⌋, ⌈(i+1)·d/o⌉).
                    let bounds = |i: usize| {
                        let (q, r) = ((i + 1) * d / o, (i + 1) * d % o);
                        (i * d / o, q + usize::from(r != 0))
                    };
                    let sel = Tensor::from_fn([d, o], |e| {
                        let (j, i) = (e / o, e % o);
                        let (lo, hi) = bounds(i);
                        if lo <= j && j < hi { 1.0 } else { 0.0 }
                    });
                    let counts = Tensor::from_fn([pre * post, o], |e| {
                        let (lo, hi) = bounds(e % o);
                        (hi - lo) as f64
                    });
                    let (sel, counts) = (
                        b.apply(Op::Constant(sel), &[])?,
                        b.apply(Op::Constant(counts), &[])?,
                    );
                    let t = reshape(b, y, &[pre, d, post])?;
                    let t = b.apply(Op::SwapLastTwo, &[t])?;
                    let t = reshape(b, t, &[pre * post, d])?;
                    let t = b.apply(Op::Matmul, &[t, sel])?;
                    let t = b.apply(Op::Div, &[t, counts])?;
                    let t = reshape(b, t, &[pre, post, o])?;
                    let t = b.apply(Op::SwapLastTwo, &[t])?;
                    dims[k] = o;
                    y = reshape(b, t, &dims)?;
                }
                Ok(y)
            }
            LayerSpec::PRelu { slopes, shape } => {
                // max(x, 0) + a·min(x, 0), a broadcast from (C, 1, …) (or a scalar), where the
                // layer takes relu(x) + a·(x − relu(x)).
                let x = x()?;
                let to = Shape::new(shape);
                let slope_dims: Vec<usize> = match *slopes {
                    1 => Vec::new(),
                    c => [c]
                        .into_iter()
                        .chain(shape[2..].iter().map(|_| 1))
                        .collect(),
                };
                let a = reshape(b, p[0], &slope_dims)?;
                let a = b.apply(Op::BroadcastTo(to.clone()), &[a])?;
                let zero = b.apply(Op::Constant(Tensor::zeros(to.dims())), &[])?;
                let pos = b.apply(Op::Max, &[x, zero])?;
                let neg = b.apply(Op::Min, &[x, zero])?;
                let neg = b.apply(Op::Mul, &[a, neg])?;
                b.apply(Op::Add, &[pos, neg])
            }
            LayerSpec::Activation { act, shape } => activation_ref(b, *act, x()?, shape),
            LayerSpec::Flatten { shape } => {
                let rest = shape[1..].iter().product::<usize>();
                reshape(b, x()?, &[shape[0], rest])
            }
            LayerSpec::Sequential {
                inputs,
                hidden,
                outputs,
                rows,
            } => {
                let h = linear_ref(b, p[0], Some(p[1]), x()?, *rows, *inputs, *hidden)?;
                let h = b.apply(Op::Tanh, &[h])?;
                let h = reshape(b, h, &[*rows, *hidden])?;
                linear_ref(b, p[2], Some(p[3]), h, *rows, *hidden, *outputs)
            }
        }
    }
}

/// `x2·Wᵀ + b` on (rows, inputs) with plain ops (x reshaped to rows first).
fn linear_ref(
    b: &mut GraphBuilder,
    w: Id,
    bias: Option<Id>,
    x: Id,
    rows: usize,
    inputs: usize,
    outputs: usize,
) -> tl_ir::Result<Id> {
    let x2 = b.apply(Op::Reshape(Shape::new(&[rows, inputs])), &[x])?;
    let wt = b.apply(Op::Transpose2d, &[w])?;
    let y = b.apply(Op::Matmul, &[x2, wt])?;
    match bias {
        Some(bias) => {
            let bb = b.apply(Op::BroadcastTo(Shape::new(&[rows, outputs])), &[bias])?;
            b.apply(Op::Add, &[y, bb])
        }
        None => Ok(y),
    }
}

/// The average (`avg`) or max pool op of these windows.
pub(crate) fn pool_op(
    avg: bool,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
) -> Op {
    if avg {
        Op::AvgPool {
            kernel,
            stride,
            padding,
        }
    } else {
        Op::MaxPool {
            kernel,
            stride,
            padding,
        }
    }
}
