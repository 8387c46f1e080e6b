//! The fused attention core (flash-attention style): each output row with an online softmax, so
//! no more than one row of scores exists at a time.
//!
//! Forward, per sample, head and query row i: running max m, running sum l and accumulator
//! `acc` (d); for each allowed key j, `s = q_i·k_j/√d`; when s exceeds m, l and acc are rescaled
//! by exp(m − s); then `l += exp(s − m)`, `acc += exp(s − m)·v_j`. The row is `acc / l` (zeros
//! when nothing is allowed).
//!
//! Backward, per row: recompute the row of scores (one buffer of n), its max and sum, the
//! probabilities p_j; `dp_j = dO_i·v_j`, `D = Σ p_j dp_j`, `ds_j = p_j (dp_j − D)/√d`; then
//! `dq_i += Σ ds_j k_j`, `dk_j += ds_j q_i`, `dv_j += p_j dO_i`.

use tl_spec::Scalar;
use tl_spec::ops::attention::Mask;
use tl_spec::ops::attention::mha::Dims;

use super::super::dot_slice;

/// Row `i`'s head-`h` slice of a (B·n, P) buffer, sample `b`.
fn at(dm: &Dims, b: usize, i: usize, h: usize) -> std::ops::Range<usize> {
    let start = (b * dm.n + i) * dm.p + h * dm.d;
    start..start + dm.d
}

fn allowed(mask: Option<&Mask>, i: usize, j: usize) -> bool {
    mask.is_none_or(|m| m.allowed(i, j))
}

/// C (B·n, P) from Q, K, V, row by row.
pub(super) fn forward<T: Scalar>(
    dm: &Dims,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&Mask>,
) -> Vec<T> {
    let scale = T::one() / T::lit(dm.d as f64).sqrt();
    let mut c = vec![T::zero(); dm.batch * dm.n * dm.p];
    let mut acc = vec![T::zero(); dm.d];
    for b in 0..dm.batch {
        for h in 0..dm.heads {
            for i in 0..dm.n {
                let qi = &q[at(dm, b, i, h)];
                let (mut m, mut l) = (T::neg_infinity(), T::zero());
                acc.fill(T::zero());
                for j in (0..dm.n).filter(|&j| allowed(mask, i, j)) {
                    let s = dot_slice(qi, &k[at(dm, b, j, h)]) * scale;
                    if s > m {
                        let corr = (m - s).exp();
                        l *= corr;
                        for a in acc.iter_mut() {
                            *a *= corr;
                        }
                        m = s;
                    }
                    let e = (s - m).exp();
                    l += e;
                    for (a, &vv) in acc.iter_mut().zip(&v[at(dm, b, j, h)]) {
                        *a += e * vv;
                    }
                }
                if l > T::zero() {
                    let inv = T::one() / l;
                    for (o, &a) in c[at(dm, b, i, h)].iter_mut().zip(&acc) {
                        *o = a * inv;
                    }
                }
            }
        }
    }
    c
}

/// `[dQ, dK, dV]` from Q, K, V and dC, recomputing the scores one row at a time.
pub(super) fn backward<T: Scalar>(
    dm: &Dims,
    q: &[T],
    k: &[T],
    v: &[T],
    dc: &[T],
    mask: Option<&Mask>,
) -> [Vec<T>; 3] {
    let scale = T::one() / T::lit(dm.d as f64).sqrt();
    let len = dm.batch * dm.n * dm.p;
    let (mut dq, mut dk, mut dv) = (
        vec![T::zero(); len],
        vec![T::zero(); len],
        vec![T::zero(); len],
    );
    let mut p = vec![T::zero(); dm.n];
    let mut dp = vec![T::zero(); dm.n];
    for b in 0..dm.batch {
        for h in 0..dm.heads {
            for i in 0..dm.n {
                let qi = &q[at(dm, b, i, h)];
                let mut m = T::neg_infinity();
                for (j, pj) in p.iter_mut().enumerate() {
                    *pj = if allowed(mask, i, j) {
                        dot_slice(qi, &k[at(dm, b, j, h)]) * scale
                    } else {
                        T::neg_infinity()
                    };
                    m = m.max(*pj);
                }
                if m == T::neg_infinity() {
                    continue; // nothing allowed: zero output, zero gradient
                }
                let mut l = T::zero();
                for pj in p.iter_mut() {
                    *pj = (*pj - m).exp(); // exp(−∞) = 0 for masked keys
                    l += *pj;
                }
                let doi = &dc[at(dm, b, i, h)];
                let mut dsum = T::zero();
                for (j, (pj, dpj)) in p.iter_mut().zip(dp.iter_mut()).enumerate() {
                    *pj /= l;
                    *dpj = dot_slice(doi, &v[at(dm, b, j, h)]);
                    dsum += *pj * *dpj;
                }
                for (j, (&pj, &dpj)) in p.iter().zip(&dp).enumerate() {
                    if pj == T::zero() {
                        continue;
                    }
                    let ds = pj * (dpj - dsum) * scale;
                    let (rq, rk) = (at(dm, b, i, h), at(dm, b, j, h));
                    for t in 0..dm.d {
                        dq[rq.start + t] += ds * k[rk.start + t];
                        dk[rk.start + t] += ds * q[rq.start + t];
                        dv[rk.start + t] += pj * dc[rq.start + t];
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}
