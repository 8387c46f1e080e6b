//! The fused optimizer steps on the CUDA device (kernels/optim.cu): one grid-stride launch per
//! list of up to [`OPTIM_LIST_MAX`] parameters (`blockIdx.y` the slot; a one-parameter step is
//! a list of one), its operands already checked by [`Device`](crate::device::Device)'s provided methods; the rule
//! is [`AdamUpdate::element`] / [`MomentumUpdate::element`].

use super::CudaDevice;
use super::driver::{self, Arg};
use super::launch::blocks;
use crate::Result;
use crate::device::{AdamSlot, AdamUpdate, MomentumSlot, MomentumUpdate, OPTIM_LIST_MAX};

/// The kernels' flags (`TL_OPT_*` in kernels/optim.cu): decoupled weight decay first, the
/// gradient read with L2 weight decay, momentum SGD's Nesterov form.
const FLAG_DECAY: u32 = 1;
const FLAG_L2: u32 = 2;
const FLAG_NESTEROV: u32 = 4;

/// `flag` where `on`, else 0.
fn flag(on: bool, flag: u32) -> u32 {
    if on { flag } else { 0 }
}

impl CudaDevice {
    /// `tl_adam_update_list` over at most [`OPTIM_LIST_MAX`] slots (the list's coefficients
    /// from slot 0's, the bias corrections from each slot's), errors naming `op`.
    pub(super) fn adam_update_list_impl(
        &mut self,
        op: &'static str,
        slots: &[AdamSlot],
    ) -> Result<()> {
        let Some(first) = slots.first() else {
            return Ok(());
        };
        let c = &first.c;
        let [flags, decay, l2, b1m1, omb1, b2m1, omb2] = adam_shared(c);
        let mut args = vec![flags, decay, l2, b1m1, omb1, b2m1, omb2, Arg::F32(c.eps)];
        args.push(Arg::U32(slots.len() as u32));
        let per_slot = |s: &AdamSlot, n: usize| -> Result<[Arg; 7]> {
            let [w, m, v, g] = [s.w, s.m, s.v, s.g].map(|b| self.ptr(op, b));
            Ok([
                Arg::Ptr(w?),
                Arg::Ptr(m?),
                Arg::Ptr(v?),
                Arg::Ptr(g?),
                Arg::U64(n as u64),
                Arg::F32(s.c.inv_sqrt_bc2),
                Arg::F32(s.c.step),
            ])
        };
        let longest = list_args(&mut args, slots, |s| s.w.len(), per_slot)?;
        if longest == 0 {
            return Ok(());
        }
        driver::enter()?;
        let grid = [blocks(longest), slots.len() as u32, 1];
        self.run(op, "tl_adam_update_list", grid, &args)
    }

    /// `tl_momentum_update_list` over at most [`OPTIM_LIST_MAX`] slots, errors naming `op`.
    pub(super) fn momentum_update_list_impl(
        &mut self,
        op: &'static str,
        c: &MomentumUpdate,
        slots: &[MomentumSlot],
    ) -> Result<()> {
        let mut args = momentum_coefs(c).to_vec();
        args.push(Arg::U32(slots.len() as u32));
        let per_slot = |s: &MomentumSlot, n: usize| -> Result<[Arg; 4]> {
            let [w, b, g] = [s.w, s.b, s.g].map(|x| self.ptr(op, x));
            Ok([Arg::Ptr(w?), Arg::Ptr(b?), Arg::Ptr(g?), Arg::U64(n as u64)])
        };
        let longest = list_args(&mut args, slots, |s| s.w.len(), per_slot)?;
        if longest == 0 {
            return Ok(());
        }
        driver::enter()?;
        let grid = [blocks(longest), slots.len() as u32, 1];
        self.run(op, "tl_momentum_update_list", grid, &args)
    }
}

/// The Adam kernel's coefficients shared by a whole list: flags, decay, l2, b1m1, omb1, b2m1,
/// omb2 (ε follows).
fn adam_shared(c: &AdamUpdate) -> [Arg; 7] {
    [
        Arg::U32(flag(c.decay.is_some(), FLAG_DECAY) | flag(c.l2.is_some(), FLAG_L2)),
        Arg::F32(c.decay.unwrap_or(0.0)),
        Arg::F32(c.l2.unwrap_or(0.0)),
        Arg::F32(c.b1m1),
        Arg::F32(c.omb1),
        Arg::F32(c.b2m1),
        Arg::F32(c.omb2),
    ]
}

/// The momentum kernel's coefficients: flags, l2, mom_m1, omd, momentum, step.
fn momentum_coefs(c: &MomentumUpdate) -> [Arg; 6] {
    [
        Arg::U32(flag(c.l2.is_some(), FLAG_L2) | flag(c.nesterov, FLAG_NESTEROV)),
        Arg::F32(c.l2.unwrap_or(0.0)),
        Arg::F32(c.mom_m1),
        Arg::F32(c.omd),
        Arg::F32(c.momentum),
        Arg::F32(c.step),
    ]
}

/// Append the [`OPTIM_LIST_MAX`] slots' arguments of a list kernel to `args`: each of `slots`
/// as `per_slot` writes it with its length (`len`), then the unused slots as the first slot's
/// with no elements (never read). Returns the longest slot's length.
fn list_args<S, const K: usize>(
    args: &mut Vec<Arg>,
    slots: &[S],
    len: impl Fn(&S) -> usize,
    per_slot: impl Fn(&S, usize) -> Result<[Arg; K]>,
) -> Result<usize> {
    let Some(first) = slots.first() else {
        return Ok(0);
    };
    let mut longest = 0;
    for s in slots {
        longest = longest.max(len(s));
        args.extend(per_slot(s, len(s))?);
    }
    let unused = per_slot(first, 0)?;
    for _ in slots.len()..OPTIM_LIST_MAX {
        args.extend(unused.iter().cloned());
    }
    Ok(longest)
}
