//! [`MultiHeadAttention`]: self-attention with `heads` heads and no biases (its
//! cross-attention and rotary embeddings: `cross_attention.rs`, `rope.rs`).

use tl_session::{Param, Train};
use tl_spec::Tensor;
use tl_spec::ops::attention::Mask;
use tl_spec::ops::concat::{concat, slice};
use tl_spec::ops::shape::transpose2d;

use super::At;
use super::rope::Rope;
use crate::display::{py_bool, py_float};
use crate::error::usage;
use crate::{Init, Module, Parameters, Result, Runtime, Var, Vars};

/// Self-attention: `Q, K, V = x·Wq, x·Wk, x·Wv`, per head `softmax(QKᵀ/√d)·V`, heads
/// concatenated, then `·Wo`. x is (n, d) or (B, n, d). The projections are (d, d) applied on
/// the right (`x·W`, the transpose of `nn.Linear`'s layout) and have no biases; Wq, Wk, Wv are
/// Xavier-uniform (as PyTorch's `in_proj_weight`), Wo `kaiming_uniform(a=√5)`. A mask (true =
/// allowed) is shared by the batch: causal, key padding, or any (n, n) pattern. PyTorch:
/// `nn.MultiheadAttention(d, heads, bias=False, batch_first=True)` with `attn_mask`.
/// [`forward_qkv`](Self::forward_qkv) attends over separate keys and values
/// (cross-attention), [`with_rope`](Self::with_rope) rotates queries and keys by their
/// positions, and [`grouped`](Self::grouped) makes a layer with fewer key and value heads than
/// query heads (grouped-query attention).
///
/// The attention core runs fused by default ([`flash`](Self::flash), the seeds' `useFlash :=
/// true`): on the CUDA tape the flash kernels (kernels/attention.cu: O(n·d) device memory per
/// call, never the (n, n) scores), on the CPU tape its fused core; the value is the same
/// function as the composed path's (docs/semantics.md, "Attention").
#[derive(Debug, Clone)]
pub struct MultiHeadAttention {
    /// Query projection (d, d), named `wq`.
    pub wq: Param,
    /// Key projection (d, kv_heads·d/heads: (d, d) unless [`grouped`](Self::grouped)), named
    /// `wk`.
    pub wk: Param,
    /// Value projection (the shape of `wk`), named `wv`.
    pub wv: Param,
    /// Output projection (d, d), named `wo`.
    pub wo: Param,
    /// Number of (query) heads. Set directly, it is checked at every pass as the
    /// constructors check it (an error naming the layer and the value).
    pub heads: usize,
    /// Number of key and value heads: `heads` unless [`grouped`](Self::grouped), where each
    /// key/value head serves `heads / kv_heads` consecutive query heads.
    pub kv_heads: usize,
    /// Whether [`forward`](Module::forward) applies a causal mask ([`forward_masked`](Self::forward_masked)
    /// applies the mask it is given instead).
    pub causal: bool,
    /// Whether the op runs fused (`multiHeadAttention`'s `fused`, the seeds' `useFlash`): `true`
    /// by default where the head size is at most the CUDA kernels'
    /// [`FLASH_MAX_HEAD`](tl_tape_cuda::device::FLASH_MAX_HEAD) (128), else `false` (the
    /// composed path, which takes any head size). [`with_flash`](Self::with_flash) sets it.
    pub flash: bool,
    /// Rotary position embeddings of the queries and keys ([`with_rope`](Self::with_rope));
    /// `None` by default. With them every pass runs the attention of
    /// [`forward_qkv`](Self::forward_qkv) (`multiHeadAttention` has no rotation): the
    /// projections and rotations, then the core `scaledDotProductAttention`, fused as
    /// [`flash`](Self::flash) says; a query whose mask hides every key is an error there
    /// (`multiHeadAttention` gives it zeros). Set directly, it is checked at every pass as
    /// `with_rope` checks it.
    pub rope: Option<Rope>,
}

impl MultiHeadAttention {
    /// Attention of width `d` with `heads` heads (dividing `d`); `causal` masks the future.
    pub fn new<O: Train>(vars: &Vars<'_, O>, d: usize, heads: usize, causal: bool) -> Result<Self> {
        Self::build("MultiHeadAttention::new", vars, d, (heads, heads), causal)
    }

    /// Grouped-query attention (GQA; `kv_heads` = 1 is multi-query attention): `heads` query
    /// heads over `kv_heads` key and value heads (dividing `heads`), query head i reading
    /// key/value head ⌊i·kv_heads/heads⌋; `wk` and `wv` are (d, kv_heads·dh), dh = d/heads,
    /// Xavier-uniform over that shape. Every pass runs the attention of
    /// [`forward_qkv`](Self::forward_qkv): the projections, then the op
    /// `scaledDotProductAttention` on the keys and values of `kv_heads` heads, which serves each
    /// group of query heads from its key head (no copy of K and V per query head; its
    /// gradient sums the group). PyTorch has no such `nn.MultiheadAttention`:
    /// `F.scaled_dot_product_attention(q, k, v, enable_gqa=True)` on the projections (Hugging
    /// Face's `repeat_kv`, torchtune's `MultiHeadAttention(num_kv_heads=…)`), so
    /// [`pytorch_state`](Self::pytorch_state) is an error for such a layer.
    pub fn grouped<O: Train>(
        vars: &Vars<'_, O>,
        d: usize,
        heads: usize,
        kv_heads: usize,
        causal: bool,
    ) -> Result<Self> {
        Self::build(
            "MultiHeadAttention::grouped",
            vars,
            d,
            (heads, kv_heads),
            causal,
        )
    }

    /// The layer of [`new`](Self::new) and [`grouped`](Self::grouped), its sizes checked.
    fn build<O: Train>(
        what: &'static str,
        vars: &Vars<'_, O>,
        d: usize,
        (heads, kv_heads): (usize, usize),
        causal: bool,
    ) -> Result<Self> {
        check_heads(what, d, heads, kv_heads)?;
        // kv ≤ d; the projections' size checked before any is made.
        let kv = kv_heads * (d / heads);
        tl_spec::alloc::check_shape::<O::T>(what, &tl_spec::Shape::new(&[d, d]))?;
        let xavier = |fan_out: usize| Init::XavierUniform { fan_in: d, fan_out };
        Ok(MultiHeadAttention {
            wq: vars.param("wq", &[d, d], xavier(d))?,
            wk: vars.param("wk", &[d, kv], xavier(kv))?,
            wv: vars.param("wv", &[d, kv], xavier(kv))?,
            wo: vars.param("wo", &[d, d], Init::default_weight(d))?,
            heads,
            kv_heads,
            causal,
            flash: d / heads <= tl_tape_cuda::device::FLASH_MAX_HEAD,
            rope: None,
        })
    }

    /// The same layer with rotary position embeddings `rope` on its queries and keys (an
    /// error for an odd head size or a base that is not finite and > 1). A LLaMA-style
    /// attention with Hugging Face's weight layout (one key head per query head):
    /// `MultiHeadAttention::new(vars, d, heads, true)?.with_rope(Rope { base: 10000.0,
    /// layout: RopeLayout::Halves })?`.
    pub fn with_rope(mut self, rope: Rope) -> Result<Self> {
        const WHAT: &str = "MultiHeadAttention::with_rope";
        let (_, dh) = self.sizes(WHAT)?;
        rope.check(WHAT, dh)?;
        self.rope = Some(rope);
        Ok(self)
    }

    /// The width d and head size dh, after the constructors' checks on the public fields a
    /// caller may have set since: `heads` and `kv_heads` (≥ 1, dividing d and heads), and
    /// the projections' shapes ((d, d), (d, kv_heads·dh) for `wk` and `wv`); an error naming
    /// `what` and the values otherwise.
    fn sizes(&self, what: &'static str) -> Result<(usize, usize)> {
        let d = self.wq.shape().dims().first().copied().unwrap_or(0);
        check_heads(what, d, self.heads, self.kv_heads)?;
        let dh = d / self.heads;
        let kv = self.kv_heads * dh;
        let want = [("wq", &self.wq, [d, d]), ("wk", &self.wk, [d, kv])];
        let want = want
            .into_iter()
            .chain([("wv", &self.wv, [d, kv]), ("wo", &self.wo, [d, d])]);
        for (name, p, dims) in want {
            if p.shape().dims() != dims {
                return Err(usage(
                    what,
                    format!(
                        "{name} has shape {}, where d {d}, heads {} and kv_heads {} need {dims:?}",
                        p.shape(),
                        self.heads,
                        self.kv_heads
                    ),
                ));
            }
        }
        Ok((d, dh))
    }

    /// The width d, after [`sizes`](Self::sizes)' checks and [`with_rope`](Self::with_rope)'s
    /// of [`rope`](Self::rope) (public fields: set directly, a rope is checked here): what
    /// every pass checks first, its error naming the layer and `what`.
    pub(super) fn checked_width<O: Train>(
        &self,
        what: &'static str,
        at: &At<'_, O>,
    ) -> Result<usize> {
        let checked = || {
            let (d, dh) = self.sizes(what)?;
            if let Some(rope) = &self.rope {
                rope.check(what, dh)?;
            }
            Ok(d)
        };
        checked().map_err(|e| at.op_error(e))
    }

    /// The same layer with the core fused (`true`) or composed (`false`). Fused with a head
    /// size above [`FLASH_MAX_HEAD`](tl_tape_cuda::device::FLASH_MAX_HEAD), the CUDA tape
    /// refuses the op with an error naming it (before anything runs); the CPU takes any.
    pub fn with_flash(mut self, flash: bool) -> Self {
        self.flash = flash;
        self
    }

    /// The mask that lets every query see the first `len` of `n` keys (padding after them).
    /// A `len` above `n` (a length from before the batch was cut to `n`), or an `n` whose n·n
    /// mask overflows or exceeds the allocation cap, is an error ([`Mask::from_fn`]).
    pub fn key_padding_mask(n: usize, len: usize) -> Result<Mask> {
        check_lens("MultiHeadAttention::key_padding_mask", n, &[len])?;
        Ok(Mask::from_fn(n, |_, j| j < len)?)
    }

    /// One key-padding mask per sequence of a padded batch, for [`forward_masked`](Self::forward_masked)
    /// on (B, n, d) with B = `lens.len()`: sequence b's queries see its first `lens[b]` of the
    /// `n` keys (PyTorch: `key_padding_mask` (B, n), true at the padding). Not causal: for a
    /// causal layer on a padded batch see [`causal_padding_masks`](Self::causal_padding_masks).
    /// An empty `lens`, a length above `n` (the error names the sequence), or sizes whose
    /// B·n·n mask overflows or exceeds the allocation cap, is an error
    /// ([`Mask::from_fn_batched`]).
    pub fn key_padding_masks(n: usize, lens: &[usize]) -> Result<Mask> {
        check_lens("MultiHeadAttention::key_padding_masks", n, lens)?;
        Ok(Mask::from_fn_batched(lens.len(), n, n, |b, _, j| {
            j < lens[b]
        })?)
    }

    /// [`key_padding_masks`](Self::key_padding_masks) and the causal mask together, for a
    /// causal model (a language model) on a padded batch: query i of sequence b sees key j
    /// where `j ≤ i` and `j < lens[b]` (PyTorch: `is_causal=True` with `key_padding_mask`).
    /// [`forward_masked`](Self::forward_masked) applies the mask it is given and not the
    /// layer's [`causal`](Self::causal) flag, so a causal layer's padded batch takes this one.
    /// The errors of `key_padding_masks`.
    pub fn causal_padding_masks(n: usize, lens: &[usize]) -> Result<Mask> {
        check_lens("MultiHeadAttention::causal_padding_masks", n, lens)?;
        Ok(Mask::from_fn_batched(lens.len(), n, n, |b, i, j| {
            j <= i && j < lens[b]
        })?)
    }

    /// Attention with an explicit mask (`None`: every key is allowed): an (n, n) mask shared
    /// by the batch, or one per batch element ([`Mask::batched`], [`key_padding_masks`](Self::key_padding_masks)).
    /// The mask is the whole pattern: the layer's [`causal`](Self::causal) flag (which
    /// [`forward`](Module::forward) applies) is not added to it, so a causal layer on a padded
    /// batch takes [`causal_padding_masks`](Self::causal_padding_masks).
    pub fn forward_masked<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        mask: Option<Mask>,
    ) -> Result<Var<'g, O>> {
        let g = x.scope();
        let w = [&self.wq, &self.wk, &self.wv, &self.wo].map(|p| g.param(p));
        let [q, k, v, o] = w;
        let (q, k, v, o) = (q?, k?, v?, o?);
        let (heads, fused) = (self.heads, self.flash);
        let at = At::new(g.rt, self, &self.wq);
        self.checked_width("MultiHeadAttention::forward", &at)?;
        let (batch, n) = self.tokens(x, "", &at)?;
        if self.rope.is_some() || self.kv_heads != self.heads {
            if let Some(m) = &mask
                && (m.rows(), m.cols()) != (n, n)
            {
                return Err(at.input(format!(
                    "the mask is {}×{}, the input has {n} positions",
                    m.rows(),
                    m.cols()
                )));
            }
            let keys = match &mask {
                Some(m) => super::cross_attention::Keys::Mask(m),
                None => super::cross_attention::Keys::All,
            };
            return self.attend((x, x, x), (batch, n, n), keys, &at);
        }
        q.op("MultiHeadAttention::forward", &[&k, &v, &o, x], |s| {
            s.multi_head_attention(
                q.tensor_ref(),
                k.tensor_ref(),
                v.tensor_ref(),
                o.tensor_ref(),
                x.tensor_ref(),
                heads,
                mask,
                fused,
            )
        })
        .map_err(|e| at.op_error(e))
    }
}

impl MultiHeadAttention {
    /// The batch (`None`: unbatched) and length of `x`, (n, d) or (B, n, d) tokens of the
    /// layer's width d; else an error naming the layer (`method`, when not empty, before it).
    pub(super) fn tokens<O: Train>(
        &self,
        x: &Var<'_, O>,
        method: &str,
        at: &At<'_, O>,
    ) -> Result<(Option<usize>, usize)> {
        let d = self.wq.shape().dims()[0];
        match x.dims() {
            [n, w] if *w == d => Ok((None, *n)),
            [b, n, w] if *w == d => Ok((Some(*b), *n)),
            _ => Err(at.input(format!(
                "{method}input {} must be (n, {d}) or (B, n, {d}): tokens of width {d}",
                x.shape()
            ))),
        }
    }
}

impl Parameters for MultiHeadAttention {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        for p in [&self.wq, &self.wk, &self.wv, &self.wo] {
            f(p);
        }
    }
    fn extra_repr(&self) -> String {
        let rope = match &self.rope {
            Some(r) => format!(", rope=(base={}, {:?})", py_float(r.base), r.layout),
            None => String::new(),
        };
        let kv = match self.kv_heads == self.heads {
            true => String::new(),
            false => format!(", num_kv_heads={}", self.kv_heads),
        };
        format!(
            "embed_dim={}, num_heads={}{kv}, bias=False, causal={}{rope}",
            self.wq.shape().dims().first().copied().unwrap_or(0),
            self.heads,
            py_bool(self.causal)
        )
    }
}

impl<O: Train> Module<O> for MultiHeadAttention {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        // Another rank: forward_masked's error names the layer and the layouts it takes.
        let n = match x.dims() {
            [n, _] | [_, n, _] => Some(*n),
            _ => None,
        };
        let mask = n.filter(|_| self.causal).map(Mask::causal).transpose()?;
        self.forward_masked(x, mask)
    }
}

/// An error naming `what` unless `heads` ≥ 1 divides the width `d` ≥ 1 and `kv_heads` ≥ 1
/// divides `heads`: the constructors' check, and every pass's on the public fields.
fn check_heads(what: &'static str, d: usize, heads: usize, kv_heads: usize) -> Result<()> {
    if d == 0 || heads == 0 || !d.is_multiple_of(heads) {
        return Err(usage(
            what,
            format!("need heads ≥ 1 dividing the width d ≥ 1, got d {d}, heads {heads}"),
        ));
    }
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(usage(
            what,
            format!("need kv_heads ≥ 1 dividing heads {heads}, got kv_heads {kv_heads}"),
        ));
    }
    Ok(())
}

/// An error naming `what` when a sequence length in `lens` exceeds the `n` keys of the padded
/// batch (a length from before the batch was cut to `n`).
fn check_lens(what: &'static str, n: usize, lens: &[usize]) -> Result<()> {
    match lens.iter().position(|&len| len > n) {
        Some(b) => Err(usage(
            what,
            format!(
                "sequence {b} has length {} but the padded batch has n = {n} positions",
                lens[b]
            ),
        )),
        None => Ok(()),
    }
}

/// PyTorch's fused layout: `nn.MultiheadAttention(d, heads, bias=False, batch_first=True)`
/// keeps the three input projections as one `in_proj_weight` (3d, d) = `[wqᵀ; wkᵀ; wvᵀ]` and
/// the output projection as `out_proj.weight` (d, d) = `woᵀ`.
impl MultiHeadAttention {
    /// This layer's parameters in PyTorch's names and layout, relative to the layer
    /// (`in_proj_weight`, `out_proj.weight`): prefix them with the layer's path to write a
    /// PyTorch `state_dict`. PyTorch: `mha.state_dict()` with `bias=False`.
    #[allow(clippy::type_complexity)]
    pub fn pytorch_state<O: Train>(
        &self,
        rt: &Runtime<O>,
    ) -> Result<Vec<(&'static str, Tensor<O::T>)>> {
        self.check_ungrouped("MultiHeadAttention::pytorch_state")?;
        let t = |p: &Param| -> Result<Tensor<O::T>> { Ok(transpose2d(&rt.value_of(p)?)?) };
        let in_proj = concat(&concat(&t(&self.wq)?, &t(&self.wk)?)?, &t(&self.wv)?)?;
        Ok(vec![
            ("in_proj_weight", in_proj),
            ("out_proj.weight", t(&self.wo)?),
        ])
    }

    /// Set this layer's parameters from PyTorch's `in_proj_weight` (3d, d) and
    /// `out_proj.weight` (d, d). A shape that does not fit is an error naming it, and then
    /// nothing changes. PyTorch: `mha.load_state_dict(...)` with `bias=False`.
    pub fn load_pytorch<O: Train>(
        &self,
        rt: &Runtime<O>,
        in_proj_weight: &Tensor<O::T>,
        out_proj_weight: &Tensor<O::T>,
    ) -> Result<()> {
        self.check_ungrouped("MultiHeadAttention::load_pytorch")?;
        // The public fields checked as a pass checks them (heads, the projections' shapes).
        let (d, _) = self.sizes("MultiHeadAttention::load_pytorch")?;
        if in_proj_weight.shape().dims() != [3 * d, d] || out_proj_weight.shape().dims() != [d, d] {
            return Err(usage(
                "MultiHeadAttention::load_pytorch",
                format!(
                    "need in_proj_weight [{}, {d}] and out_proj.weight [{d}, {d}], got {} and {}",
                    3 * d,
                    in_proj_weight.shape(),
                    out_proj_weight.shape()
                ),
            ));
        }
        let part = |k: usize| -> Result<Tensor<O::T>> {
            Ok(transpose2d(&slice(in_proj_weight, k * d, d)?)?)
        };
        let values = [part(0)?, part(1)?, part(2)?, transpose2d(out_proj_weight)?];
        for (p, v) in [&self.wq, &self.wk, &self.wv, &self.wo]
            .into_iter()
            .zip(values)
        {
            rt.set_value(p, v)?;
        }
        Ok(())
    }

    /// An error naming `what` for a grouped layer, which has no `nn.MultiheadAttention` layout.
    fn check_ungrouped(&self, what: &'static str) -> Result<()> {
        match self.kv_heads == self.heads {
            true => Ok(()),
            false => Err(usage(
                what,
                format!(
                    "a grouped-query layer ({} heads over {} key/value heads) has no nn.MultiheadAttention layout: save it with its own names (checkpoint)",
                    self.heads, self.kv_heads
                ),
            )),
        }
    }
}
