//! The fused attention core under autocast ([`Flash::round`] bf16 or TF32), composed of every
//! device's launches in O(n·d) memory: the composed path's products on rounded operands
//! (docs/semantics.md, "Mixed precision": `S = round(Q)·round(K)ᵀ`, `O = round(A)·round(V)`,
//! backward `dA = round(dO)·round(V)ᵀ`, `dV = round(A)ᵀ·round(dO)`,
//! `dQ = round(dS)·round(K)`, `dK = round(dS)ᵀ·round(Q)`, the softmax and its VJP in f32 on
//! the unrounded A), with the flash kernels' sums (products of rounded values are exact in
//! f32, so each sum is an f32 accumulation of the reference's terms).
//!
//! - Forward: Q, K, V rounded into copies ([`Device::round_to`]; none where the kernels round
//!   as they read, [`Flash::rounds_on_read`]: the tensor-core kernels); the plain forward on them
//!   gives lse and `Ō = A·round(V)` (the output of the unrounded probabilities; when nothing
//!   will read Ō, [`forward`]'s first pass gives lse alone); the second
//!   pass ([`FLASH_OUT`](super::FLASH_OUT)) gives `O = Σ_j round(exp(s − lse))·round(v_j)`: the
//!   probabilities normalized before they are rounded, as the composed A·V reads them (one
//!   pass with the online softmax would round them relative to a running max instead).
//! - Backward: Q, K, V and dO rounded into copies (likewise), then the plain backward launches
//!   with p and dS rounded ([`Flash::mode`]); its `delta_i = dot(round(dO_i), Ō_i)` is
//!   `Σ_j A_ij·dA_ij` up to f32 reassociation, from the unrounded A as the composed softmax
//!   VJP's.
//!
//! The copies are temporaries (three of Q's or K's length forward, four backward), released on
//! every path.

use super::{Buffer, Device, Flash};
use crate::Result;

/// `x` rounded as the core's products read it, each into a copy ([`Device::round_to`]), or `x`
/// itself where the kernels round as they read ([`Flash::rounds_on_read`]); on error the copies
/// made are released. Hand the result to [`release_copies`].
fn rounded<D: Device + ?Sized, const N: usize>(
    dev: &mut D,
    x: [Buffer; N],
    f: &Flash,
) -> Result<[Buffer; N]> {
    if f.rounds_on_read() {
        return Ok(x);
    }
    let mut out = Vec::with_capacity(N);
    for b in x {
        match dev.round_to(b, f.round) {
            Ok(r) => out.push(r),
            Err(e) => {
                release(dev, out);
                return Err(e);
            }
        }
    }
    // N pushes: the conversion cannot fail.
    out.try_into()
        .map_err(|_| crate::Error::kernel("flash_attention", "rounded copies miscounted"))
}

/// `(O, lse, Ō)` of the core under autocast: O = round(A)·round(V), lse of the rounded
/// scores and, with `exact`, Ō = A·round(V) (what the backward's delta reads). Without
/// `exact` the first pass keeps the statistics alone
/// ([`FLASH_STATS`](super::flash::FLASH_STATS): no P·V products), with the same bits of O and
/// lse. Operands already checked.
pub(super) fn forward<D: Device + ?Sized>(
    dev: &mut D,
    qkv: [Buffer; 3],
    f: &Flash,
    exact: bool,
) -> Result<(Buffer, Buffer, Option<Buffer>)> {
    let hat = rounded(dev, qkv, f)?;
    let first = match exact {
        true => dev
            .launch_flash_fwd(hat, f)
            .map(|(ex, lse)| (lse, Some(ex))),
        false => dev.launch_flash_lse(hat, f).map(|lse| (lse, None)),
    };
    let r = first.and_then(|(lse, ex)| match dev.launch_flash_out(hat, lse, f) {
        Ok(o) => Ok((o, lse, ex)),
        Err(e) => {
            release(dev, [lse].into_iter().chain(ex));
            Err(e)
        }
    });
    release_copies(dev, hat, f);
    r
}

/// `[dQ, dK, dV]` of the core under autocast for the cotangent `go` of O, from `exact` (the
/// forward's Ō) and lse. Operands already checked.
pub(super) fn backward<D: Device + ?Sized>(
    dev: &mut D,
    qkv: [Buffer; 3],
    exact: Buffer,
    lse: Buffer,
    go: Buffer,
    f: &Flash,
) -> Result<[Buffer; 3]> {
    let [q, k, v, g] = rounded(dev, [qkv[0], qkv[1], qkv[2], go], f)?;
    let r = dev.launch_flash_bwd([q, k, v], exact, lse, g, f);
    release_copies(dev, [q, k, v, g], f);
    r
}

/// Release what [`rounded`] made: its copies, nothing where the kernels round as they read.
fn release_copies<D: Device + ?Sized, const N: usize>(dev: &mut D, x: [Buffer; N], f: &Flash) {
    if !f.rounds_on_read() {
        release(dev, x);
    }
}

/// Release every buffer of `bufs`.
fn release<D: Device + ?Sized>(dev: &mut D, bufs: impl IntoIterator<Item = Buffer>) {
    for b in bufs {
        dev.release(b);
    }
}
