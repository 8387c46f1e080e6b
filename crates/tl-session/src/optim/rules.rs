//! RMSprop and Adagrad updates with PyTorch's formulas (`torch.optim.RMSprop`,
//! `torch.optim.Adagrad`; `maximize`, `foreach` and the like off), written once against
//! [`VecOps`] like SGD and Adam. `ge` is the effective gradient (clipped, weight decay added).

use super::{ParamState, VecOps};
use crate::Result;

/// RMSprop's hyper-parameters besides lr.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RmsProp {
    pub(crate) alpha: f64,
    pub(crate) eps: f64,
    pub(crate) momentum: f64,
    pub(crate) centered: bool,
}

/// One RMSprop step. State: `square_avg`, then `momentum_buffer` (momentum > 0), then
/// `grad_avg` (centered), each starting at zeros:
///
/// ```text
/// v ← αv + (1−α)g²
/// centered: ḡ ← αḡ + (1−α)g ; avg = sqrt(v − ḡ²) + ε      else avg = sqrt(v) + ε
/// momentum: b ← μb + g/avg ; w ← w − lr·b                   else w ← w − lr·g/avg
/// ```
pub(crate) fn rmsprop<O: VecOps>(
    ops: &mut O,
    st: &mut ParamState,
    w: &mut O::V,
    ge: &O::V,
    lr: f64,
    h: RmsProp,
) -> Result<()> {
    let wanted = 1 + usize::from(h.momentum > 0.0) + usize::from(h.centered);
    while st.bufs.len() < wanted {
        let z = ops.zeros_like(ge)?;
        st.bufs.push(O::into_state(z));
    }
    let (sq_slot, rest) = st.bufs.split_at_mut(1);
    let sq = O::state_mut(&mut sq_slot[0])?;
    let g2 = ops.mul(ge, ge)?;
    ops.scale_assign(sq, h.alpha)?;
    let r = ops.axpy_assign(sq, 1.0 - h.alpha, &g2);
    ops.release(g2);
    r?;
    let (mom_slot, avg_slot) = rest.split_at_mut(usize::from(h.momentum > 0.0));
    let avg = if h.centered {
        let ga = O::state_mut(&mut avg_slot[0])?;
        ops.scale_assign(ga, h.alpha)?;
        ops.axpy_assign(ga, 1.0 - h.alpha, ge)?;
        let ga2 = ops.mul(ga, ga)?;
        let mut d = match ops.copy(sq) {
            Ok(d) => d,
            Err(e) => {
                ops.release(ga2);
                return Err(e);
            }
        };
        let r = ops.axpy_assign(&mut d, -1.0, &ga2);
        ops.release(ga2);
        let avg = r.and_then(|()| ops.sqrt_scale_add(&d, 1.0, h.eps));
        ops.release(d);
        avg?
    } else {
        ops.sqrt_scale_add(sq, 1.0, h.eps)?
    };
    let u = ops.div(ge, &avg);
    ops.release(avg);
    let u = u?;
    let r = if let Some(b) = mom_slot.first_mut() {
        let b = O::state_mut(b)?;
        ops.scale_assign(b, h.momentum)
            .and_then(|()| ops.axpy_assign(b, 1.0, &u))
            .and_then(|()| ops.axpy_assign(w, -lr, b))
    } else {
        ops.axpy_assign(w, -lr, &u)
    };
    ops.release(u);
    r
}

/// One Adagrad step (`st.step` already counts it). State: `sum`, starting at
/// `initial_accumulator_value`:
///
/// ```text
/// clr = lr / (1 + (t−1)·lr_decay) ; s ← s + g² ; w ← w − clr · g / (sqrt(s) + ε)
/// ```
#[allow(clippy::too_many_arguments)]
pub(crate) fn adagrad<O: VecOps>(
    ops: &mut O,
    st: &mut ParamState,
    w: &mut O::V,
    ge: &O::V,
    lr: f64,
    lr_decay: f64,
    eps: f64,
    initial: f64,
) -> Result<()> {
    if st.bufs.is_empty() {
        let s = ops.full_like(ge, initial)?;
        st.bufs.push(O::into_state(s));
    }
    let clr = lr / (1.0 + (st.step.saturating_sub(1)) as f64 * lr_decay);
    let s = O::state_mut(&mut st.bufs[0])?;
    let g2 = ops.mul(ge, ge)?;
    let r = ops.axpy_assign(s, 1.0, &g2);
    ops.release(g2);
    r?;
    let std = ops.sqrt_scale_add(s, 1.0, eps)?;
    let u = ops.div(ge, &std);
    ops.release(std);
    let u = u?;
    let r = ops.axpy_assign(w, -clr, &u);
    ops.release(u);
    r
}
