//! `maskedSoftmax` and `multiHeadAttention` on the device, composed from existing primitives
//! plus the norm family's [`Device::masked_softmax_rows`].
//!
//! - `maskedSoftmax`: one masked row launch forward (the mask's matrix, or a batched mask's
//!   matrix b, over x's batch element b); backward [`Device::softmax_rows_bwd`]
//!   (`y·(g − Σ g·y)`, which is 0 wherever y is: masked entries and empty rows).
//! - `multiHeadAttention`: Q, K, V = x·W by one GEMM each over all B·n rows, each (B, n, H, d):
//!   the heads side by side in every row, read and written in place by the head products
//!   ([`Device::bmm_heads`], no permutes); `S = Q_h K_hᵀ` by one launch over the B·H heads,
//!   scaled by 1/√d; A = (masked) row softmax; `O_h = A·V_h` by one launch writing C (B·n, P)
//!   with its heads merged; y = C·wo (`fused = false`). The node keeps Q, K, V, C and A as
//!   workspace (O(H·n²) floats). The backward reads them while they are live (the
//!   whole chain is recomputed once the tape has released workspaces) and runs
//!   `dC = g·woᵀ`, `dwo = Cᵀ·g`, `dA = dO_h V_hᵀ`,
//!   `dV_h = Aᵀ dO_h`, `dS = softmax_bwd(A, dA)/√d`, `dQ_h = dS K_h`, `dK_h = dSᵀ Q_h` (the
//!   head products reading dC and writing dQ, dK, dV in the merged layout), then
//!   `dW = xᵀ·dQ` (etc.) and `dx = Σ dQ·Wᵀ`, each one GEMM/bmm launch (the sum's adds in the
//!   products' epilogue, `matmul_acc`).
//! - `scaledDotProductAttention`: the core alone on q (B, nq, P) and k, v (B, nk, Pk), nk keys
//!   of any length (cross-attention, a KV cache): S (B·H, nq, nk), the mask's nq rows of nk
//!   applied to each head's block of score rows, `dK_h = dSᵀ Q_h` and `dV_h = Aᵀ dO_h` of nk
//!   rows; fused, the kernels take nq and nk ([`FlashDims`]) and the mask's causal diagonal.
//!   Grouped-query attention (Pk = Hk·d, Hk dividing H; [`Dims::kv_head`]): composed, the head
//!   products read K and V in place at key head `kv_head(h)` ([`Batch::grouped`], no copy),
//!   dK_h and dV_h per query head go to a (B·nk, P) temporary summed over each group in
//!   increasing head order into (B·nk, Pk) ([`Device::reduce_axis_sum`]); fused, the kernels
//!   read key head `kv_head(h)` and sum a key head's group ([`FlashDims::kv_heads`]).
//! - Masks (both ops, fused or composed): one (nq, nk) matrix shared by every batch element,
//!   or one per batch element ([`Mask::batch`] = B: a padded batch's key padding, PyTorch's
//!   `attn_mask` (B, 1, L, S)): composed, the H·nq score rows of element b take matrix b
//!   ([`Device::masked_softmax_rows`]); fused, the kernels read element b's words
//!   ([`FlashMask::stride`]). A mask of another batch is the IR's shape error before anything
//!   runs (and [`FlashMask::of`]'s, naming the op and both sizes, on the device).
//! - `fused` (the seeds' `useFlash`): the same projections and output GEMM around the fused
//!   core [`Device::flash_attention`] (kernels/attention.cu: tiles of queries against tiles
//!   of keys with the online softmax, one launch), which writes C and each row's log-sum-exp;
//!   the node keeps Q, K, V, C and the log-sum-exp (O(n·P) floats, never an (n, n) matrix),
//!   and the backward is [`Device::flash_attention_bwd`] (two launches recomputing the
//!   probabilities tile by tile) between the same GEMMs. Head sizes above
//!   [`FLASH_MAX_HEAD`](crate::device::FLASH_MAX_HEAD) are an error before anything runs.
//! - **Autocast** ([`crate::precision`]: bf16 / TF32): every product above rounds its operands
//!   (x, the weights, Q, K, A, V, C, and the backward's g, dC, dA's operands dO and V, dS),
//!   the CPU tape's set. The 1/√d scale: folded into the softmax forward as on the CPU
//!   (`S = round(Q)·round(K)ᵀ`, scaled in f32), applied to dS before the products read it
//!   rounded backward, as on the CPU. A `fused` node runs the fused core at the same setting
//!   ([`Flash::round`]; [`Device::flash_attention_rounded`]: the same products, O(n·P)
//!   memory, two passes over the keys forward) and keeps `Ō = A·round(V)` beside lse, which
//!   its backward's delta reads.

use tl_ir::Op;
use tl_spec::Error as SpecError;
use tl_spec::ops::attention::Mask;
use tl_spec::ops::attention::mha::{Dims, mha_dims};
use tl_spec::ops::attention::sdpa::sdpa_dims;

use super::{Scratch, with_scratch};
use crate::device::{Batch, Buffer, Device, Flash, FlashDims, FlashMask, FlashProducts, Gemm};
use crate::{AnyBuffer, Result};

/// Rows and row length of `maskedSoftmax` on x (…, rows, cols).
fn masked_rows(x: &AnyBuffer, mask: &Mask) -> (usize, usize) {
    let n = mask.cols();
    (x.shape().numel() / n.max(1), n)
}

/// Forward of `maskedSoftmax`: the mask's (rows, cols) matrix over every block of x's rows; a
/// batched mask's matrix b over the rows of x's batch element b (its first axis, B equal
/// shares of the rows: [`MaskedRows`](crate::device::MaskedRows)).
pub fn masked_softmax<D: Device>(dev: &mut D, x: &AnyBuffer, mask: &Mask) -> Result<Buffer> {
    let (rows, n) = masked_rows(x, mask);
    dev.masked_softmax_rows(x.buffer(), mask.as_slice(), rows, n, mask.rows())
}

/// Backward of `maskedSoftmax` from its output `y`.
pub fn masked_softmax_back<D: Device>(
    dev: &mut D,
    y: &AnyBuffer,
    g: Buffer,
    mask: &Mask,
) -> Result<Buffer> {
    let (rows, n) = masked_rows(y, mask);
    dev.softmax_rows_bwd(y.buffer(), g, rows, n)
}

/// The attributes of a `multiHeadAttention` or `scaledDotProductAttention` node: heads,
/// mask, fused.
fn attrs(op: &Op) -> Result<(usize, Option<&Mask>, bool)> {
    match op {
        Op::MultiHeadAttention { heads, mask, fused }
        | Op::ScaledDotProductAttention { heads, mask, fused } => {
            Ok((*heads, mask.as_ref(), *fused))
        }
        _ => Err(crate::Error::kernel(op.name(), "not an attention node")),
    }
}

/// The sizes of a `scaledDotProductAttention` node (`dm` = P), checked by the shape rule.
fn sdpa_dims_of(op: &Op, x: &[&AnyBuffer], heads: usize, mask: Option<&Mask>) -> Result<Dims> {
    if x.len() != 3 {
        return Err(
            SpecError::shape(op.name(), format!("{} operands, expected 3", x.len())).into(),
        );
    }
    Ok(sdpa_dims([x[0].shape(), x[1].shape(), x[2].shape()], heads, mask)?.0)
}

/// The sizes of one attention node, checked by the shape rule.
fn dims(op: &Op, x: &[&AnyBuffer], heads: usize, mask: Option<&Mask>) -> Result<Dims> {
    if x.len() != 5 {
        return Err(
            SpecError::shape(op.name(), format!("{} operands, expected 5", x.len())).into(),
        );
    }
    let w = [x[0].shape(), x[1].shape(), x[2].shape(), x[3].shape()];
    Ok(mha_dims(w, x[4].shape(), heads, mask)?.0)
}

/// The intermediates of the forward chain that the backward reads. Q and C are (B·nq, P), K
/// and V (B·nk, P), with the heads merged ([`Batch`]).
struct Chain {
    q: Buffer,
    k: Buffer,
    v: Buffer,
    c: Buffer,
    /// The attention probabilities (B·H, nq, nk); `None` when a workspace without them is
    /// reused: the backward recomputes them from `q` and `k`.
    a: Option<Buffer>,
}

impl Chain {
    /// The node's workspace: `[q, k, v, c]`, then `a` where kept.
    fn workspace(&self) -> Vec<Buffer> {
        let mut w = vec![self.q, self.k, self.v, self.c];
        w.extend(self.a);
        w
    }

    /// The chain kept by the forward, if every buffer of it is still live (the tape releases
    /// workspaces after each backprop).
    fn reuse<D: Device>(dev: &D, w: &[Buffer]) -> Option<Chain> {
        if !(4..=5).contains(&w.len()) || !w.iter().all(|&b| dev.is_live(b)) {
            return None;
        }
        Some(Chain {
            q: w[0],
            k: w[1],
            v: w[2],
            c: w[3],
            a: w.get(4).copied(),
        })
    }
}

/// The B·H head products of one node, operands flagged in `merged` (`[a, b, result]`) read or
/// written in the head-merged layout of Q, C (B, nq, H, d) and K, V (B, nk, Hk, d); the
/// operands flagged in `kv` (`[a, b]`) are K or V, of Hk heads a row, query head h's product
/// reading key head `kv_head(h)` ([`Batch::grouped`]; Hk = H: every head its own).
fn by_head(dm: &Dims, merged: [bool; 3], kv: [bool; 2]) -> Batch {
    Batch::heads(dm.batch, dm.heads, merged).grouped(dm.kv_heads, kv)
}

/// The products that read K or V as their right operand `b`.
const KV_B: [bool; 2] = [false, true];
/// The products that read neither K nor V.
const NO_KV: [bool; 2] = [false, false];

/// A key head's cotangent (dK, dV) from its query heads': `x` (B·nk, H, d), one block of
/// columns per query head as the head products write it, summed over each group of `H/Hk`
/// consecutive heads into (B·nk, Hk, d) by one axis sum ([`Device::reduce_axis_sum`]: in
/// increasing head order from +0 below 64 heads a group), a temporary of `s`; `x` itself when
/// every query head has its own key head.
fn sum_groups<D: Device>(dev: &mut D, s: &mut Scratch, dm: &Dims, x: Buffer) -> Result<Buffer> {
    let group = dm.heads / dm.kv_heads.max(1);
    if group == 1 {
        return Ok(x);
    }
    let outer = dm.batch * dm.nk * dm.kv_heads;
    Ok(s.tmp(dev.reduce_axis_sum(x, outer, group, dm.d)?))
}

/// Q, K, V = x·W, (B·n, P) each with the heads merged, temporaries of `s`.
fn projections<D: Device>(
    dev: &mut D,
    s: &mut Scratch,
    dm: &Dims,
    x: &[&AnyBuffer],
) -> Result<[Buffer; 3]> {
    let g = Gemm::nn(dm.batch * dm.n, dm.dm, dm.p);
    let mut proj = |dev: &mut D, w: &AnyBuffer| -> Result<Buffer> {
        Ok(s.tmp(dev.matmul(x[4].buffer(), w.buffer(), g)?))
    };
    Ok([proj(dev, x[0])?, proj(dev, x[1])?, proj(dev, x[2])?])
}

/// Q, K, V, C and the attention probabilities, every buffer a temporary of `s` (the forward
/// takes back the ones it keeps with [`Scratch::keep`]).
fn chain<D: Device>(
    dev: &mut D,
    s: &mut Scratch,
    dm: &Dims,
    x: &[&AnyBuffer],
    mask: Option<&Mask>,
) -> Result<Chain> {
    let [q, k, v] = projections(dev, s, dm, x)?;
    let a = probabilities(dev, s, dm, q, k, mask)?;
    // O_h = A·V_h, written into C with the heads merged.
    let c = s.tmp(dev.bmm_heads(a, v, by_head(dm, [false, true, true], KV_B), attend(dm))?);
    Ok(Chain {
        q,
        k,
        v,
        c,
        a: Some(a),
    })
}

/// The fused core of one node: its sizes and its mask as the kernels read it. A head size
/// the kernels do not take, or a mask of another side, is an error naming the op before
/// anything is allocated.
fn flash_of<D: Device>(dev: &D, op: &Op, dm: &Dims, mask: Option<&Mask>) -> Result<Flash> {
    let dims = FlashDims {
        batch: dm.batch,
        nq: dm.n,
        nk: dm.nk,
        heads: dm.heads,
        kv_heads: dm.kv_heads,
        d: dm.d,
    };
    dims.check(op.name())?;
    let mask = FlashMask::of(op.name(), mask, dm.n, dm.nk, dm.batch)?;
    let f = Flash::new(dims, mask).with_round(crate::precision::current());
    // The device's choice of products where the tensor-core kernels take the core; else FMA.
    let products = match f.tensor_cores_fit() {
        true => dev.flash_products(),
        false => FlashProducts::Fma,
    };
    Ok(f.with_products(products))
}

/// What the fused forward keeps: Q, K, V, C (B·n, P), each row's log-sum-exp (B·H·n) and,
/// under autocast, `Ō = A·round(V)` (B·n, P), which the backward reads in place of C.
struct FlashChain {
    qkv: [Buffer; 3],
    c: Buffer,
    lse: Buffer,
    exact: Option<Buffer>,
}

impl FlashChain {
    /// Q, K, V by the projections, then C and the log-sum-exp by the fused core: every buffer
    /// a temporary of `s`.
    fn new<D: Device>(
        dev: &mut D,
        s: &mut Scratch,
        dm: &Dims,
        x: &[&AnyBuffer],
        f: &Flash,
    ) -> Result<FlashChain> {
        let qkv = projections(dev, s, dm, x)?;
        let (c, lse, exact) = core(dev, s, qkv, f)?;
        Ok(FlashChain { qkv, c, lse, exact })
    }

    /// The node's workspace: `[q, k, v, c, lse]`, then Ō under autocast.
    fn workspace(&self) -> Vec<Buffer> {
        let [q, k, v] = self.qkv;
        let mut w = vec![q, k, v, self.c, self.lse];
        w.extend(self.exact);
        w
    }

    /// The chain the forward kept, if it is the buffers `f` keeps, of the right lengths, all
    /// live (a workspace kept at another precision is not: it is recomputed).
    fn reuse<D: Device>(dev: &D, w: &[Buffer], f: &Flash) -> Option<FlashChain> {
        let (q, kv, rows) = (f.dims.q_len(), f.dims.kv_len(), f.dims.rows_len());
        let lens = w.iter().map(|b| b.len());
        let lens_ok = match f.round.is_autocast() {
            false => lens.eq([q, kv, kv, q, rows]),
            true => lens.eq([q, kv, kv, q, rows, q]),
        };
        if !lens_ok || !w.iter().all(|&b| dev.is_live(b)) {
            return None;
        }
        Some(FlashChain {
            qkv: [w[0], w[1], w[2]],
            c: w[3],
            lse: w[4],
            exact: w.get(5).copied(),
        })
    }

    /// What the fused backward reads as the output: Ō under autocast, else C.
    fn delta_operand(&self) -> Buffer {
        self.exact.unwrap_or(self.c)
    }
}

/// The fused core on `qkv`: C, lse and, under autocast ([`Flash::round`]), Ō, temporaries of
/// `s`; no Ō for a node that will not be differentiated ([`crate::needs_backward`]: its
/// first pass keeps the statistics alone).
fn core<D: Device>(
    dev: &mut D,
    s: &mut Scratch,
    qkv: [Buffer; 3],
    f: &Flash,
) -> Result<(Buffer, Buffer, Option<Buffer>)> {
    if f.round.is_autocast() && crate::needs_backward::current() {
        let [c, lse, exact] = dev.flash_attention_rounded(qkv, f)?;
        return Ok((s.tmp(c), s.tmp(lse), Some(s.tmp(exact))));
    }
    let (c, lse) = dev.flash_attention(qkv, f)?;
    Ok((s.tmp(c), s.tmp(lse), None))
}

/// `A = softmax(Q_h K_gᵀ/√d)` (masked where `mask` says; g = kv_head(h)), (B·H, nq, nk), a
/// temporary of `s`.
fn probabilities<D: Device>(
    dev: &mut D,
    s: &mut Scratch,
    dm: &Dims,
    q: Buffer,
    k: Buffer,
    mask: Option<&Mask>,
) -> Result<Buffer> {
    let Dims { n, nk, d, .. } = *dm;
    let rows = dm.batch * dm.heads * n;
    let scores = Gemm::nn(n, d, nk).with_t(false, true);
    let raw = s.tmp(dev.bmm_heads(q, k, by_head(dm, [true, true, false], KV_B), scores)?);
    let a = match mask {
        // The mask's nq rows of nk, one per query row of each head: one (nq, nk) matrix shared
        // by every batch element, or one per element under its H·nq score rows.
        Some(m) => {
            let scores = s.tmp(dev.scale(raw, inv_sqrt(d))?);
            dev.masked_softmax_rows(scores, m.as_slice(), rows, nk, n)?
        }
        // scale → softmax in one launch (same bits).
        None => dev.scaled_softmax_rows(raw, inv_sqrt(d), rows, nk)?,
    };
    Ok(s.tmp(a))
}

/// `O_h = A·V_h`: (nq, nk)·(nk, d) per head.
fn attend(dm: &Dims) -> Gemm {
    Gemm::nn(dm.n, dm.nk, dm.d)
}

/// `1/√d` as the kernel's f32 (the reference's `1/sqrt(d)` rounded once).
fn inv_sqrt(d: usize) -> f32 {
    (1.0 / (d as f64).sqrt()) as f32
}

/// Forward of `multiHeadAttention` (`op`) on `[wq, wk, wv, wo, x]`: the value and the
/// workspace the backward reuses: Q, K, V and C, then the probabilities (composed) or each
/// row's log-sum-exp (`fused`: the fused core, O(n·P) floats kept, not O(H·n²)).
pub fn mha<D: Device>(dev: &mut D, op: &Op, x: &[&AnyBuffer]) -> Result<(Buffer, Vec<Buffer>)> {
    let (heads, mask, fused) = attrs(op)?;
    let dm = dims(op, x, heads, mask)?;
    let out = Gemm::nn(dm.batch * dm.n, dm.p, dm.dm);
    if fused {
        let f = flash_of(dev, op, &dm, mask)?;
        return with_scratch(dev, |dev, s| {
            let ch = FlashChain::new(dev, s, &dm, x, &f)?;
            let y = dev.matmul(ch.c, x[3].buffer(), out)?;
            let w = ch.workspace();
            s.keep(&w);
            Ok((y, w))
        });
    }
    with_scratch(dev, |dev, s| {
        let ch = chain(dev, s, &dm, x, mask)?;
        let y = dev.matmul(ch.c, x[3].buffer(), out)?;
        let w = ch.workspace();
        s.keep(&w);
        Ok((y, w))
    })
}

/// Backward of `multiHeadAttention`: `[dwq, dwk, dwv, dwo, dx]`, `None` where not needed.
/// `workspace` is what [`mha`] kept: read while every buffer of it is live, else the chain is
/// recomputed. On error every cotangent already computed is released.
pub fn mha_back<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &[&AnyBuffer],
    g: Buffer,
    needs: &[bool],
    workspace: &[Buffer],
) -> Result<[Option<Buffer>; 5]> {
    let (heads, mask, fused) = attrs(op)?;
    let dm = dims(op, x, heads, mask)?;
    let need = |k: usize| needs.get(k).copied().unwrap_or(false);
    if !(0..5).any(need) {
        return Ok([None, None, None, None, None]);
    }
    let flash = match fused {
        true => Some(flash_of(dev, op, &dm, mask)?),
        false => None,
    };
    let mut out: [Option<Buffer>; 5] = [None; 5];
    let r = with_scratch(dev, |dev, s| match &flash {
        Some(f) => {
            let ch = match FlashChain::reuse(dev, workspace, f) {
                Some(ch) => ch,
                None => FlashChain::new(dev, s, &dm, x, f)?,
            };
            let Some(dc) = output_grads(dev, s, &dm, x, g, &need, ch.c, &mut out)? else {
                return Ok(());
            };
            let d = dev.flash_attention_bwd(ch.qkv, ch.delta_operand(), ch.lse, dc, f)?;
            projection_grads(dev, &dm, x, &need, d.map(|b| s.tmp(b)), &mut out)
        }
        None => {
            let ch = match Chain::reuse(dev, workspace) {
                Some(ch) => ch,
                None => chain(dev, s, &dm, x, mask)?,
            };
            let Some(dc) = output_grads(dev, s, &dm, x, g, &need, ch.c, &mut out)? else {
                return Ok(());
            };
            let d = core_grads(dev, s, &dm, mask, &ch, dc)?;
            projection_grads(dev, &dm, x, &need, d, &mut out)
        }
    });
    match r {
        Ok(()) => Ok(out),
        Err(e) => {
            dev.release_all(out.into_iter().flatten());
            Err(e)
        }
    }
}

/// `y = C·wo`: `dwo = Cᵀ·g` into `out[3]` where needed, and `dC = g·woᵀ` (a temporary of
/// `s`), or `None` when no other cotangent is needed.
#[allow(clippy::too_many_arguments)]
fn output_grads<D: Device>(
    dev: &mut D,
    s: &mut Scratch,
    dm: &Dims,
    x: &[&AnyBuffer],
    g: Buffer,
    need: &dyn Fn(usize) -> bool,
    c: Buffer,
    out: &mut [Option<Buffer>; 5],
) -> Result<Option<Buffer>> {
    let (rows, p, dmod) = (dm.batch * dm.n, dm.p, dm.dm);
    if need(3) {
        out[3] = Some(dev.matmul(c, g, Gemm::nn(p, rows, dmod).with_t(true, false))?);
    }
    if ![0, 1, 2, 4].into_iter().any(need) {
        return Ok(None);
    }
    let back = Gemm::nn(rows, dmod, p).with_t(false, true);
    Ok(Some(s.tmp(dev.matmul(g, x[3].buffer(), back)?)))
}

/// The composed core's backward: `[dQ, dK, dV]` (temporaries of `s`) from dC; dK and dV of
/// a key head the sums of its query heads' ([`sum_groups`]).
fn core_grads<D: Device>(
    dev: &mut D,
    s: &mut Scratch,
    dm: &Dims,
    mask: Option<&Mask>,
    ch: &Chain,
    dc: Buffer,
) -> Result<[Buffer; 3]> {
    let Dims {
        batch,
        n,
        nk,
        heads,
        d,
        ..
    } = *dm;
    let rows = batch * heads * n;
    let a = match ch.a {
        Some(a) => a,
        None => probabilities(dev, s, dm, ch.q, ch.k, mask)?,
    };
    // O_h = A·V_g: dA = dO_h·V_gᵀ (nq, nk), dV_g += Aᵀ·dO_h (nk, d) (dO_h read from dC in
    // place), g = kv_head(h).
    let da_g = Gemm::nn(n, d, nk).with_t(false, true);
    let da = s.tmp(dev.bmm_heads(dc, ch.v, by_head(dm, [true, true, false], KV_B), da_g)?);
    let into = by_head(dm, [false, true, true], NO_KV);
    // Aᵀ·X and dSᵀ·X: (nk, nq)·(nq, d), A and dS stored (nq, nk); per query head.
    let t_nq = Gemm::nn(nk, n, d).with_t(true, false);
    let dv = s.tmp(dev.bmm_heads(a, dc, into, t_nq)?);
    let dv = sum_groups(dev, s, dm, dv)?;
    // Softmax VJP (0 where A is: masked entries, empty rows), then S = Q_h K_gᵀ/√d.
    // softmax VJP → scale by 1/√d in one launch (same bits as the two).
    let ds = s.tmp(dev.scaled_softmax_rows_bwd(a, da, inv_sqrt(d), rows, nk)?);
    let into_kv = by_head(dm, [false, true, true], KV_B);
    let dq = s.tmp(dev.bmm_heads(ds, ch.k, into_kv, attend(dm))?);
    let dk = s.tmp(dev.bmm_heads(ds, ch.q, into, t_nq)?);
    let dk = sum_groups(dev, s, dm, dk)?;
    Ok([dq, dk, dv])
}

/// `Q = x·wq`: `dwq = xᵀ·dQ` (likewise K, V) into `out[0..3]`, and
/// `dx = dQ·wqᵀ + dK·wkᵀ + dV·wvᵀ` into `out[4]`, where needed.
fn projection_grads<D: Device>(
    dev: &mut D,
    dm: &Dims,
    x: &[&AnyBuffer],
    need: &dyn Fn(usize) -> bool,
    proj: [Buffer; 3],
    out: &mut [Option<Buffer>; 5],
) -> Result<()> {
    let (rows, p, dmod) = (dm.batch * dm.n, dm.p, dm.dm);
    for (k, &dp) in proj.iter().enumerate() {
        if need(k) {
            let t = Gemm::nn(dmod, rows, p).with_t(true, false);
            out[k] = Some(dev.matmul(x[4].buffer(), dp, t)?);
        }
    }
    if need(4) {
        // (dQ·wqᵀ + dK·wkᵀ) + dV·wvᵀ, the last two added in the products' epilogue.
        let back = Gemm::nn(rows, p, dmod).with_t(false, true);
        let dx = dev.matmul(proj[0], x[0].buffer(), back)?;
        out[4] = Some(dx);
        dev.matmul_acc(dx, proj[1], x[1].buffer(), back)?;
        dev.matmul_acc(dx, proj[2], x[2].buffer(), back)?;
    }
    Ok(())
}

/// Forward of `scaledDotProductAttention` on `[q, k, v]` (the heads merged, as the
/// projections of `multiHeadAttention` leave them): C and the workspace its backward reuses:
/// each row's log-sum-exp and, under autocast, Ō (`fused`: [`Device::flash_attention`],
/// O(n·P) memory) or the probabilities (composed).
pub fn sdpa<D: Device>(dev: &mut D, op: &Op, x: &[&AnyBuffer]) -> Result<(Buffer, Vec<Buffer>)> {
    let (heads, mask, fused) = attrs(op)?;
    let dm = sdpa_dims_of(op, x, heads, mask)?;
    let [q, k, v] = [0, 1, 2].map(|i| x[i].buffer());
    with_scratch(dev, |dev, s| {
        if fused {
            let f = flash_of(dev, op, &dm, mask)?;
            let (c, lse, exact) = core(dev, s, [q, k, v], &f)?;
            let mut w = vec![lse];
            w.extend(exact);
            s.keep(&w);
            s.keep(&[c]);
            return Ok((c, w));
        }
        let a = probabilities(dev, s, &dm, q, k, mask)?;
        let c = dev.bmm_heads(a, v, by_head(&dm, [false, true, true], KV_B), attend(&dm))?;
        s.keep(&[a]);
        Ok((c, vec![a]))
    })
}

/// Backward of `scaledDotProductAttention`: `[dq, dk, dv]`, `None` where not needed, from the
/// node's value `c` and what [`sdpa`] kept (`workspace`: read while live and of the right
/// length, else recomputed). On error every cotangent already computed is released.
pub fn sdpa_back<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &[&AnyBuffer],
    c: &AnyBuffer,
    g: Buffer,
    needs: &[bool],
    workspace: &[Buffer],
) -> Result<[Option<Buffer>; 3]> {
    let (heads, mask, fused) = attrs(op)?;
    let dm = sdpa_dims_of(op, x, heads, mask)?;
    let need = |k: usize| needs.get(k).copied().unwrap_or(false);
    if !(0..3).any(need) {
        return Ok([None, None, None]);
    }
    let [q, k, v] = [0, 1, 2].map(|i| x[i].buffer());
    let c = c.buffer();
    // The workspace, if it is buffers of these lengths, all live.
    let live = |dev: &D, lens: &[usize]| {
        let ok = workspace.len() == lens.len()
            && workspace
                .iter()
                .zip(lens)
                .all(|(b, &len)| b.len() == len && dev.is_live(*b));
        ok.then_some(workspace)
    };
    let flash = match fused {
        true => Some(flash_of(dev, op, &dm, mask)?),
        false => None,
    };
    let grads = with_scratch(dev, |dev, s| match &flash {
        Some(f) => {
            let (rows, q_len) = (f.dims.rows_len(), f.dims.q_len());
            let kept = match f.round.is_autocast() {
                false => live(dev, &[rows]).map(|w| (w[0], c)),
                true => live(dev, &[rows, q_len]).map(|w| (w[0], w[1])),
            };
            // lse and what delta reads (C, or Ō under autocast): kept, or recomputed.
            let (lse, out) = match kept {
                Some(kept) => kept,
                None => {
                    let (c_again, lse, exact) = core(dev, s, [q, k, v], f)?;
                    (lse, exact.unwrap_or(c_again))
                }
            };
            dev.flash_attention_bwd([q, k, v], out, lse, g, f)
        }
        None => {
            let kept = live(dev, &[dm.batch * dm.heads * dm.n * dm.nk]).map(|w| w[0]);
            let ch = Chain {
                q,
                k,
                v,
                c,
                a: kept,
            };
            let d = core_grads(dev, s, &dm, mask, &ch, g)?;
            s.keep(&d);
            Ok(d)
        }
    })?;
    let mut out: [Option<Buffer>; 3] = [None; 3];
    for (i, b) in grads.into_iter().enumerate() {
        match need(i) {
            true => out[i] = Some(b),
            false => {
                dev.release(b);
            }
        }
    }
    Ok(out)
}
