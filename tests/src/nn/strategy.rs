//! The cases: random sizes and settings of each layer ([`spec_strategy`]), then its
//! parameters, input and cotangent ([`layer_cases`]).

use super::*;

/// f32-representable values uniform in `[lo, hi]` of `dims`.
pub(crate) fn values(dims: Vec<usize>, lo: f64, hi: f64) -> BoxedStrategy<Tensor<f64>> {
    let n = dims.iter().product::<usize>();
    prop::collection::vec(lo..=hi, n)
        .prop_map(move |v| {
            let v = v.into_iter().map(|x| x as f32 as f64).collect();
            Tensor::new(dims.clone(), v).expect("n elements")
        })
        .boxed()
}

/// The key/value head count `kv` picks among the divisors of `heads` (fewer than `heads`:
/// grouped-query attention).
fn divisor(heads: usize, kv: prop::sample::Index) -> usize {
    let divisors: Vec<usize> = (1..=heads).filter(|&k| heads.is_multiple_of(k)).collect();
    *kv.get(&divisors)
}

/// Rotary embeddings: the paper's (interleaved, base 10000), or Hugging Face's halves at base
/// 500.
fn rope_of(interleaved: bool) -> tl_nn::Rope {
    match interleaved {
        true => tl_nn::Rope::DEFAULT,
        false => tl_nn::Rope {
            base: 500.0,
            layout: tl_nn::RopeLayout::Halves,
        },
    }
}

fn opt_batch() -> impl Strategy<Value = Option<usize>> {
    prop::option::of(1usize..=2)
}

/// The layer specs of the layer named `name` ([`LAYERS`]).
pub fn spec_strategy(name: &str) -> BoxedStrategy<LayerSpec> {
    let lead = || prop::collection::vec(1usize..=3, 0..=2);
    match name {
        "Linear" => (1usize..=4, 1usize..=4, any::<bool>(), lead())
            .prop_map(|(inputs, outputs, bias, lead)| LayerSpec::Linear {
                inputs,
                outputs,
                bias,
                lead,
            })
            .boxed(),
        "Conv" | "ConvTranspose" => {
            let transpose = name == "ConvTranspose";
            (1usize..=2, 1usize..=3, 1usize..=3, 1usize..=2, opt_batch())
                .prop_flat_map(move |(d, inputs, outputs, stride, batch)| {
                    (
                        prop::collection::vec(1usize..=3, d),
                        Just((inputs, outputs, stride, batch)),
                    )
                })
                .prop_flat_map(move |(kernel, (inputs, outputs, stride, batch))| {
                    let kmin = kernel.iter().copied().min().unwrap_or(1);
                    let d = kernel.len();
                    (
                        Just(kernel.clone()),
                        0..kmin,
                        prop::collection::vec(0usize..=3, d),
                        Just((inputs, outputs, stride, batch)),
                    )
                })
                .prop_map(
                    move |(kernel, padding, extra, (inputs, outputs, stride, batch))| {
                        // Conv: size ≥ kernel; transposed: any size ≥ 1 whose output is ≥ 1.
                        let spatial = kernel
                            .iter()
                            .zip(&extra)
                            .map(|(k, e)| if transpose { 1 + e + padding } else { k + e })
                            .collect();
                        LayerSpec::Conv {
                            transpose,
                            inputs,
                            outputs,
                            kernel,
                            stride,
                            padding,
                            batch,
                            spatial,
                        }
                    },
                )
                .boxed()
        }
        "MaxPool" | "AvgPool" => {
            let avg = name == "AvgPool";
            (
                prop::collection::vec(1usize..=3, 1..=2),
                1usize..=3,
                prop::collection::vec(1usize..=2, 1..=2),
            )
                .prop_flat_map(|(kernel, stride, lead)| {
                    let kmin = kernel.iter().copied().min().unwrap_or(1);
                    let d = kernel.len();
                    (
                        Just(kernel),
                        Just(stride),
                        0..=kmin / 2,
                        Just(lead),
                        prop::collection::vec(0usize..=3, d),
                    )
                })
                .prop_map(move |(kernel, stride, padding, lead, extra)| {
                    let spatial = kernel.iter().zip(&extra).map(|(k, e)| k + e).collect();
                    LayerSpec::Pool {
                        avg,
                        kernel,
                        stride,
                        padding,
                        lead,
                        spatial,
                    }
                })
                .boxed()
        }
        "LayerNorm" => (
            1usize..=5,
            prop::sample::select(vec![1e-5, 0.1]),
            prop::collection::vec(1usize..=3, 1..=2),
            prop::collection::vec(1usize..=3, 0..=2),
        )
            .prop_map(|(dim, eps, lead, over)| LayerSpec::LayerNorm {
                dim,
                over,
                eps,
                lead,
            })
            .boxed(),
        "BatchNorm" => (
            1usize..=3,
            2usize..=3,
            prop::collection::vec(1usize..=3, 0..=2),
            prop::sample::select(vec![1e-5, 0.1]),
            any::<bool>(),
        )
            .prop_map(|(channels, n, rest, eps, training)| LayerSpec::BatchNorm {
                channels,
                n,
                rest,
                eps,
                training,
            })
            .boxed(),
        "RmsNorm" => (
            1usize..=5,
            prop::sample::select(vec![None, Some(1e-5), Some(0.1)]),
            prop::collection::vec(1usize..=3, 0..=2),
        )
            .prop_map(|(dim, eps, lead)| LayerSpec::RmsNorm { dim, eps, lead })
            .boxed(),
        "GroupNorm" => (
            1usize..=3,
            1usize..=2,
            1usize..=3,
            prop::collection::vec(1usize..=3, 0..=2),
            prop::sample::select(vec![1e-5, 0.1]),
        )
            .prop_map(|(groups, per, n, rest, eps)| LayerSpec::GroupNorm {
                groups,
                channels: groups * per,
                n,
                rest,
                eps,
            })
            .boxed(),
        "Embedding" => (1usize..=5, 1usize..=3)
            .prop_flat_map(|(num, dim)| {
                (Just(num), Just(dim), prop::collection::vec(0..num, 1..=5))
            })
            .prop_map(|(num, dim, ids)| LayerSpec::Embedding { num, dim, ids })
            .boxed(),
        "Dropout" => (
            prop::sample::select(vec![0.0, 0.25, 0.5]),
            any::<bool>(),
            prop::collection::vec(1usize..=4, 1..=3),
        )
            .prop_map(|(p, training, shape)| LayerSpec::Dropout { p, training, shape })
            .boxed(),
        // Plain (the op multiHeadAttention), rotary or grouped (scaledDotProductAttention
        // behind the projections): 1–4 heads over a drawn divisor of key/value heads.
        "MultiHeadAttention" => (
            (1usize..=4, 1usize..=3, any::<bool>(), 1usize..=4),
            opt_batch(),
            prop::option::of(any::<bool>()),
            any::<prop::sample::Index>(),
        )
            .prop_map(|((heads, head_dim, causal, n), batch, rope, kv)| {
                let rope = rope.map(rope_of);
                LayerSpec::Attention {
                    heads,
                    kv_heads: divisor(heads, kv),
                    rope,
                    // With rotary embeddings the head size is even: 1 → 2, 3 → 4.
                    head_dim: head_dim + usize::from(rope.is_some()) * (head_dim % 2),
                    causal,
                    n,
                    batch,
                }
            })
            .boxed(),
        "CrossAttention" => (
            (1usize..=4, 1usize..=3, 1usize..=3, 1usize..=4),
            opt_batch(),
            prop::option::of(any::<bool>()),
            (any::<prop::sample::Index>(), any::<bool>()),
        )
            .prop_flat_map(|((heads, head_dim, nq, nk), batch, rope, (kv, as_mask))| {
                let kv_heads = divisor(heads, kv);
                // With rotary embeddings the head size is even: 1 → 2, 3 → 4.
                let rope = rope.map(rope_of);
                let head_dim = if rope.is_some() {
                    head_dim + head_dim % 2
                } else {
                    head_dim
                };
                let d = heads * head_dim;
                let b = batch.unwrap_or(1);
                let mem: Vec<usize> = batch.iter().copied().chain([nk, d]).collect();
                (
                    Just((heads, kv_heads, head_dim, nq, nk, batch, rope, as_mask)),
                    values(mem, -1.5, 1.5),
                    prop::option::of(prop::collection::vec(any::<bool>(), b * nk)),
                )
            })
            .prop_map(
                |((heads, kv_heads, head_dim, nq, nk, batch, rope, as_mask), memory, keep)| {
                    // Each batch element keeps one key at least (else the layer refuses it).
                    let keep = keep.map(|mut k| {
                        for row in k.chunks_mut(nk) {
                            if !row.iter().any(|&v| v) {
                                row[0] = true;
                            }
                        }
                        k
                    });
                    LayerSpec::CrossAttention {
                        heads,
                        kv_heads,
                        head_dim,
                        nq,
                        nk,
                        batch,
                        memory,
                        keep,
                        as_mask,
                        rope,
                    }
                },
            )
            .boxed(),
        "SpectralConv1d" => (1usize..=3, 1usize..=3, 0usize..=3, opt_batch())
            .prop_map(|(width, modes, extra, batch)| LayerSpec::Spectral {
                width,
                modes,
                // modes ≤ grid/2 + 1.
                grid: (2 * modes).saturating_sub(2).max(1) + extra,
                batch,
            })
            .boxed(),
        // x ([N,] C, spatial…), 1–3 spatial axes of 1–7 cells, outputs 1–4 (smaller, equal
        // or larger: overlapping windows).
        "AdaptiveAvgPool" => (
            prop::option::of(1usize..=2),
            1usize..=2,
            prop::collection::vec((1usize..=7, 1usize..=4), 1..=3),
        )
            .prop_map(|(n, c, axes)| {
                let shape = n.into_iter().chain([c]).chain(axes.iter().map(|a| a.0));
                LayerSpec::AdaptiveAvgPool {
                    output: axes.iter().map(|a| a.1).collect(),
                    shape: shape.collect(),
                }
            })
            .boxed(),
        // x (N, C, spatial…), 1–3 spatial axes, one factor or one per axis.
        "Upsample" => (
            1usize..=2,
            1usize..=2,
            prop::collection::vec(1usize..=3, 1..=3),
        )
            .prop_flat_map(|(n, c, spatial)| {
                // Nearest with one factor or one per axis; linear (either align_corners) with
                // one.
                let k = spatial.len();
                let shape: Vec<usize> = [n, c].into_iter().chain(spatial).collect();
                let one = prop::collection::vec(1usize..=3, 1);
                let per = prop::collection::vec(1usize..=3, k);
                let nearest = prop_oneof![one.clone(), per].prop_map(|s| (s, None));
                let linear = (one, any::<bool>()).prop_map(|(s, ac)| (s, Some(ac)));
                (Just(shape), prop_oneof![nearest, linear])
            })
            .prop_map(|(shape, (scale, linear))| LayerSpec::Upsample {
                scale,
                linear,
                shape,
            })
            .boxed(),
        // x (N, C, rest…) with C slopes, or x of rank 0–3 with one slope.
        "PRelu" => prop_oneof![
            (
                1usize..=3,
                1usize..=3,
                prop::collection::vec(1usize..=3, 0..=2)
            )
                .prop_map(|(n, c, rest)| LayerSpec::PRelu {
                    slopes: c,
                    shape: [n, c].into_iter().chain(rest).collect(),
                }),
            prop::collection::vec(1usize..=4, 0..=3)
                .prop_map(|shape| LayerSpec::PRelu { slopes: 1, shape }),
        ]
        .boxed(),
        "Activation" => (
            prop::sample::select(ACTIVATIONS.to_vec()),
            prop::collection::vec(1usize..=4, 1..=3),
        )
            .prop_map(|(act, mut shape)| {
                // GLU halves the last axis: draw it even.
                if act == Activation::Glu {
                    let last = shape.len() - 1;
                    shape[last] *= 2;
                }
                LayerSpec::Activation { act, shape }
            })
            .boxed(),
        "Flatten" => prop::collection::vec(1usize..=3, 2..=4)
            .prop_map(|shape| LayerSpec::Flatten { shape })
            .boxed(),
        _ => (1usize..=4, 1usize..=4, 1usize..=4, 1usize..=3)
            .prop_map(|(inputs, hidden, outputs, rows)| LayerSpec::Sequential {
                inputs,
                hidden,
                outputs,
                rows,
            })
            .boxed(),
    }
}

/// Cases of the layer named `name`: sizes, parameter values, input and cotangent.
pub fn layer_cases(name: &str) -> BoxedStrategy<LayerCase> {
    spec_strategy(name)
        .prop_flat_map(|spec| {
            let params: Vec<BoxedStrategy<Tensor<f64>>> = spec
                .slots()
                .into_iter()
                .map(|(dims, slot)| match slot {
                    Slot::Weight => values(dims, -1.0, 1.0),
                    Slot::Buffer => values(dims, 0.5, 1.5),
                })
                .collect();
            let x = match spec.x_shape() {
                Some(s) if spec.normalises() => {
                    let spec = spec.clone();
                    values(s, -0.3, 0.3)
                        .prop_map(move |x| Some(spec.spread(x)))
                        .boxed()
                }
                Some(s) => values(s, -1.5, 1.5).prop_map(Some).boxed(),
                None => Just(None).boxed(),
            };
            let out = LayerCase {
                spec: spec.clone(),
                params: Vec::new(),
                x: None,
                seed: Tensor::scalar(0.0),
            }
            .reference_graph()
            .ok()
            .and_then(|(g, out)| g.shape(out).ok().map(|s| s.dims().to_vec()))
            .unwrap_or_default();
            (Just(spec), params, x, values(out, -1.0, 1.0))
        })
        .prop_map(|(spec, params, x, seed)| LayerCase {
            spec,
            params,
            x,
            seed,
        })
        .boxed()
}
