//! `maskedSoftmax` and `multiHeadAttention` on the device, composed from existing primitives
//! plus the norm family's [`Device::masked_softmax_rows`].
//!
//! - `maskedSoftmax`: one masked row launch forward; backward [`Device::softmax_rows_bwd`]
//!   (`y·(g − Σ g·y)`, which is 0 wherever y is: masked entries and empty rows).
//! - `multiHeadAttention`: Q, K, V = x·W by one GEMM each over all B·n rows, each (B, n, H, d):
//!   the heads side by side in every row, read and written in place by the head products
//!   ([`Device::bmm_heads`], no permutes); `S = Q_h K_hᵀ` by one launch over the B·H heads,
//!   scaled by 1/√d; A = (masked) row softmax; `O_h = A·V_h` by one launch writing C (B·n, P)
//!   with its heads merged; y = C·wo. The node keeps Q, K, V and C as workspace, and A too
//!   unless the op is `fused` (the memory-lean form: O(n·P) floats kept, not O(H·n²); its
//!   backward recomputes A, two launches). The backward reads them while they are live (the
//!   whole chain is recomputed once the tape has released workspaces) and runs
//!   `dC = g·woᵀ`, `dwo = Cᵀ·g`, `dA = dO_h V_hᵀ`,
//!   `dV_h = Aᵀ dO_h`, `dS = softmax_bwd(A, dA)/√d`, `dQ_h = dS K_h`, `dK_h = dSᵀ Q_h` (the
//!   head products reading dC and writing dQ, dK, dV in the merged layout), then
//!   `dW = xᵀ·dQ` (etc.) and `dx = Σ dQ·Wᵀ`, each one GEMM/bmm launch (the sum's adds in the
//!   products' epilogue, `matmul_acc`).
//!
//! The `fused` flag selects the streaming kernel on the CPU tape; the CUDA tape runs both
//! forms through this composed path (same value; a streaming attention kernel is not written
//! yet, see docs/cuda.md).

use tl_ir::Op;
use tl_spec::Error as SpecError;
use tl_spec::ops::attention::Mask;
use tl_spec::ops::attention::mha::{Dims, mha_dims};

use super::{Scratch, with_scratch};
use crate::device::{Batch, Buffer, Device, Gemm};
use crate::{AnyBuffer, Result};

/// Rows and row length of `maskedSoftmax` on x (…, n, n).
fn masked_rows(x: &AnyBuffer, mask: &Mask) -> (usize, usize) {
    let n = mask.n();
    (x.shape().numel() / n.max(1), n)
}

/// Forward of `maskedSoftmax`.
pub fn masked_softmax<D: Device>(dev: &mut D, x: &AnyBuffer, mask: &Mask) -> Result<Buffer> {
    let (rows, n) = masked_rows(x, mask);
    dev.masked_softmax_rows(x.buffer(), mask.as_slice(), rows, n)
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

/// The attributes of a `multiHeadAttention` node: heads, mask, fused.
fn attrs(op: &Op) -> Result<(usize, Option<&Mask>, bool)> {
    match op {
        Op::MultiHeadAttention { heads, mask, fused } => Ok((*heads, mask.as_ref(), *fused)),
        _ => Err(crate::Error::kernel(
            op.name(),
            "not a multiHeadAttention node",
        )),
    }
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

/// The intermediates of the forward chain that the backward reads. Q, K, V and C are (B·n, P)
/// with the heads merged ([`Batch`]).
struct Chain {
    q: Buffer,
    k: Buffer,
    v: Buffer,
    c: Buffer,
    /// The attention probabilities (B·H, n, n); `None` when the forward did not keep them (the
    /// `fused` form): the backward recomputes them from `q` and `k`.
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
/// written in the (B, n, H, d) layout of Q, K, V and C.
fn by_head(dm: &Dims, merged: [bool; 3]) -> Batch {
    Batch::heads(dm.batch, dm.heads, merged)
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
    let Dims { batch, n, p, d, .. } = *dm;
    let rows = batch * n;
    let mut proj = |dev: &mut D, w: &AnyBuffer| -> Result<Buffer> {
        Ok(s.tmp(dev.matmul(x[4].buffer(), w.buffer(), Gemm::nn(rows, dm.dm, p))?))
    };
    let q = proj(dev, x[0])?;
    let k = proj(dev, x[1])?;
    let v = proj(dev, x[2])?;
    let a = probabilities(dev, s, dm, q, k, mask)?;
    // O_h = A·V_h, written into C with the heads merged.
    let c = s.tmp(dev.bmm_heads(a, v, by_head(dm, [false, true, true]), Gemm::nn(n, n, d))?);
    Ok(Chain {
        q,
        k,
        v,
        c,
        a: Some(a),
    })
}

/// `A = softmax(Q_h K_hᵀ/√d)` (masked where `mask` says), (B·H, n, n), a temporary of `s`.
fn probabilities<D: Device>(
    dev: &mut D,
    s: &mut Scratch,
    dm: &Dims,
    q: Buffer,
    k: Buffer,
    mask: Option<&Mask>,
) -> Result<Buffer> {
    let (n, d, bh) = (dm.n, dm.d, dm.batch * dm.heads);
    let scores = Gemm::nn(n, d, n).with_t(false, true);
    let raw = s.tmp(dev.bmm_heads(q, k, by_head(dm, [true, true, false]), scores)?);
    let a = match mask {
        Some(m) => {
            let scores = s.tmp(dev.scale(raw, inv_sqrt(d))?);
            dev.masked_softmax_rows(scores, m.as_slice(), bh * n, n)?
        }
        // scale → softmax in one launch (same bits).
        None => dev.scaled_softmax_rows(raw, inv_sqrt(d), bh * n, n)?,
    };
    Ok(s.tmp(a))
}

/// `1/√d` as the kernel's f32 (the reference's `1/sqrt(d)` rounded once).
fn inv_sqrt(d: usize) -> f32 {
    (1.0 / (d as f64).sqrt()) as f32
}

/// Forward of `multiHeadAttention` (`op`) on `[wq, wk, wv, wo, x]`: the value and the
/// workspace the backward reuses (Q, K, V per head and C; the probabilities too unless the op
/// is `fused`, whose backward recomputes them so that the node keeps O(n·P) floats, not
/// O(H·n²)).
pub fn mha<D: Device>(dev: &mut D, op: &Op, x: &[&AnyBuffer]) -> Result<(Buffer, Vec<Buffer>)> {
    let (heads, mask, fused) = attrs(op)?;
    let dm = dims(op, x, heads, mask)?;
    with_scratch(dev, |dev, s| {
        let mut ch = chain(dev, s, &dm, x, mask)?;
        let y = dev.matmul(ch.c, x[3].buffer(), Gemm::nn(dm.batch * dm.n, dm.p, dm.dm))?;
        if fused {
            ch.a = None;
        }
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
    let (heads, mask, _) = attrs(op)?;
    let dm = dims(op, x, heads, mask)?;
    let need = |k: usize| needs.get(k).copied().unwrap_or(false);
    if !(0..5).any(need) {
        return Ok([None, None, None, None, None]);
    }
    let mut out: [Option<Buffer>; 5] = [None; 5];
    let r = with_scratch(dev, |dev, s| {
        let ch = match Chain::reuse(dev, workspace) {
            Some(ch) => ch,
            None => chain(dev, s, &dm, x, mask)?,
        };
        grads(dev, s, &dm, x, g, &need, mask, &ch, &mut out)
    });
    match r {
        Ok(()) => Ok(out),
        Err(e) => {
            dev.release_all(out.into_iter().flatten());
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn grads<D: Device>(
    dev: &mut D,
    s: &mut Scratch,
    dm: &Dims,
    x: &[&AnyBuffer],
    g: Buffer,
    need: &dyn Fn(usize) -> bool,
    mask: Option<&Mask>,
    ch: &Chain,
    out: &mut [Option<Buffer>; 5],
) -> Result<()> {
    let Dims {
        batch,
        n,
        p,
        heads,
        d,
        ..
    } = *dm;
    let (rows, bh, dmod) = (batch * n, batch * heads, dm.dm);
    // y = C·wo: dwo = Cᵀ·g, dC = g·woᵀ.
    if need(3) {
        out[3] = Some(dev.matmul(ch.c, g, Gemm::nn(p, rows, dmod).with_t(true, false))?);
    }
    if ![0, 1, 2, 4].into_iter().any(need) {
        return Ok(());
    }
    let dc = s.tmp(dev.matmul(
        g,
        x[3].buffer(),
        Gemm::nn(rows, dmod, p).with_t(false, true),
    )?);
    let a = match ch.a {
        Some(a) => a,
        None => probabilities(dev, s, dm, ch.q, ch.k, mask)?,
    };
    // O_h = A·V_h: dA = dO_h·V_hᵀ, dV_h = Aᵀ·dO_h (dO_h read from dC in place).
    let da_g = Gemm::nn(n, d, n).with_t(false, true);
    let da = s.tmp(dev.bmm_heads(dc, ch.v, by_head(dm, [true, true, false]), da_g)?);
    let into = by_head(dm, [false, true, true]);
    let dv = s.tmp(dev.bmm_heads(a, dc, into, Gemm::nn(n, n, d).with_t(true, false))?);
    // Softmax VJP (0 where A is: masked entries, empty rows), then S = Q_h K_hᵀ/√d.
    // softmax VJP → scale by 1/√d in one launch (same bits as the two).
    let ds = s.tmp(dev.scaled_softmax_rows_bwd(a, da, inv_sqrt(d), bh * n, n)?);
    let dq = s.tmp(dev.bmm_heads(ds, ch.k, into, Gemm::nn(n, n, d))?);
    let dk_g = Gemm::nn(n, n, d).with_t(true, false);
    let dk = s.tmp(dev.bmm_heads(ds, ch.q, into, dk_g)?);
    // Q = x·wq: dwq = xᵀ·dQ (likewise K, V); dx = dQ·wqᵀ + dK·wkᵀ + dV·wvᵀ.
    let proj = [dq, dk, dv];
    for (k, &dp) in proj.iter().enumerate() {
        if need(k) {
            let t = Gemm::nn(dmod, rows, p).with_t(true, false);
            out[k] = Some(dev.matmul(x[4].buffer(), dp, t)?);
        }
    }
    if need(4) {
        // (dQ·wqᵀ + dK·wkᵀ) + dV·wvᵀ, the last two added in the products' epilogue.
        let back = Gemm::nn(rows, p, dmod).with_t(false, true);
        let dx = dev.matmul(dq, x[0].buffer(), back)?;
        out[4] = Some(dx);
        dev.matmul_acc(dx, dk, x[1].buffer(), back)?;
        dev.matmul_acc(dx, dv, x[2].buffer(), back)?;
    }
    Ok(())
}
