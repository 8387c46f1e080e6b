//! Each case's layer built through tl-nn's public API ([`LayerSpec::build`]), as a user
//! builds it.

use super::*;

impl LayerSpec {
    /// The layer, made in `vars`.
    pub(super) fn build<O: Train + 'static>(&self, vars: &Vars<'_, O>) -> tl_nn::Result<Built<O>> {
        let m: Box<dyn Module<O>> = match self {
            LayerSpec::Linear {
                inputs,
                outputs,
                bias,
                ..
            } => Box::new(Linear::with_bias(vars, *inputs, *outputs, *bias)?),
            LayerSpec::Conv {
                transpose,
                inputs,
                outputs,
                kernel,
                stride,
                padding,
                ..
            } => {
                let cfg = ConvConfig::new(*stride, *padding);
                if *transpose {
                    Box::new(ConvTranspose::new(vars, *inputs, *outputs, kernel, cfg)?)
                } else {
                    Box::new(Conv::new(vars, *inputs, *outputs, kernel, cfg)?)
                }
            }
            LayerSpec::Pool {
                avg,
                kernel,
                stride,
                padding,
                ..
            } => {
                if *avg {
                    Box::new(AvgPool::new(kernel)?.stride(*stride)?.padding(*padding)?)
                } else {
                    Box::new(MaxPool::new(kernel)?.stride(*stride)?.padding(*padding)?)
                }
            }
            LayerSpec::LayerNorm { dim, eps, over, .. } if over.is_empty() => {
                Box::new(LayerNorm::with_eps(vars, *dim, *eps)?)
            }
            LayerSpec::LayerNorm { dim, eps, over, .. } => {
                let shape: Vec<usize> = over.iter().copied().chain([*dim]).collect();
                Box::new(LayerNorm::over(vars, &shape, *eps)?)
            }
            LayerSpec::BatchNorm { channels, eps, .. } => {
                Box::new(BatchNorm::with(vars, *channels, *eps, 0.1)?)
            }
            LayerSpec::RmsNorm { dim, eps, .. } => match eps {
                Some(eps) => Box::new(RmsNorm::with_eps(vars, *dim, *eps)?),
                None => Box::new(RmsNorm::new(vars, *dim)?),
            },
            LayerSpec::GroupNorm {
                groups,
                channels,
                eps,
                ..
            } => Box::new(GroupNorm::with_eps(vars, *groups, *channels, *eps)?),
            LayerSpec::Embedding { num, dim, .. } => {
                return Ok(Built::Embedding(Embedding::new(vars, *num, *dim)?));
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
                as_mask,
                rope,
            } => {
                let d = heads * head_dim;
                let mut mha = MultiHeadAttention::grouped(vars, d, *heads, *kv_heads, false)?;
                if let Some(rope) = rope {
                    mha = mha.with_rope(*rope)?;
                }
                let (nq, nk) = (*nq, *nk);
                let keys = match (as_mask, keep) {
                    (false, keep) => Keys::Keep(keep.clone()),
                    // Batch element b's matrix: its keys' flags on every row.
                    (true, keep) => Keys::Mask(Mask::from_fn_batched(
                        batch.unwrap_or(1),
                        nq,
                        nk,
                        |b, _, j| keep.as_ref().is_none_or(|k| k[b * nk + j]),
                    )?),
                };
                return Ok(Built::Cross(Box::new((mha, memory.clone(), keys))));
            }
            LayerSpec::Dropout { p, .. } => Box::new(Dropout::new(*p)?),
            LayerSpec::Attention {
                heads,
                kv_heads,
                head_dim,
                rope,
                causal,
                ..
            } => {
                let d = heads * head_dim;
                let mha = MultiHeadAttention::grouped(vars, d, *heads, *kv_heads, *causal)?;
                match rope {
                    Some(r) => Box::new(mha.with_rope(*r)?),
                    None => Box::new(mha),
                }
            }
            LayerSpec::Spectral { width, modes, .. } => {
                Box::new(SpectralConv1d::new(vars, *width, *modes)?)
            }
            LayerSpec::PRelu { slopes, .. } => Box::new(PRelu::new(vars, *slopes)?),
            LayerSpec::AdaptiveAvgPool { output, .. } => Box::new(AdaptiveAvgPool::new(output)?),
            LayerSpec::Upsample {
                scale,
                linear,
                shape,
            } => match (linear, scale.as_slice(), shape.len() - 2) {
                (Some(ac), [s], 1) => Box::new(Upsample::linear(*s, *ac)?),
                (Some(ac), [s], 2) => Box::new(Upsample::bilinear(*s, *ac)?),
                (Some(ac), [s], _) => Box::new(Upsample::trilinear(*s, *ac)?),
                (_, [s], _) => Box::new(Upsample::new(*s)?),
                (_, per, _) => Box::new(Upsample::per_axis(per)?),
            },
            LayerSpec::Activation { act, .. } => Box::new(*act),
            LayerSpec::Flatten { .. } => Box::new(tl_nn::Flatten),
            LayerSpec::Sequential {
                inputs,
                hidden,
                outputs,
                ..
            } => Box::new(
                Sequential::new()
                    .add(Linear::new(&vars.pp(0), *inputs, *hidden)?)
                    .add(Activation::Tanh)
                    .add(tl_nn::Flatten)
                    .add(Linear::new(&vars.pp(3), *hidden, *outputs)?),
            ),
        };
        Ok(Built::Module(m))
    }
}

/// Which keys a built cross-attention attends to: `forward_qkv`'s key flags, or
/// `forward_qkv_masked`'s attention mask.
pub(super) enum Keys {
    /// B·nk flags (true = attend), or every key.
    Keep(Option<Vec<bool>>),
    /// (nq, nk) matrices, one per batch element.
    Mask(Mask),
}

/// A built layer: a [`Module`], or the embedding (which takes ids).
pub(super) enum Built<O: Train> {
    Module(Box<dyn Module<O>>),
    Embedding(Embedding),
    /// Cross-attention, its memory and its key mask.
    Cross(Box<(MultiHeadAttention, Tensor<f64>, Keys)>),
}

impl<O: Train> Parameters for Built<O> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        match self {
            Built::Module(m) => m.visit_params(f),
            Built::Embedding(e) => e.visit_params(f),
            Built::Cross(c) => c.0.visit_params(f),
        }
    }
}
