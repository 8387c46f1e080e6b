//! The fused optimizer steps on the CUDA device (kernels/optim.cu): one grid-stride launch per
//! parameter, its operands already checked by [`Device`](crate::device::Device)'s provided
//! methods; the rule is [`AdamUpdate::element`] / [`MomentumUpdate::element`].

use super::CudaDevice;
use super::driver::{self, Arg};
use crate::Result;
use crate::device::{AdamUpdate, Buffer, MomentumUpdate};

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
    /// `tl_adam_update` over `w`, `m`, `v` in place from `g`.
    pub(super) fn adam_update_impl(
        &mut self,
        w: Buffer,
        m: Buffer,
        v: Buffer,
        g: Buffer,
        c: &AdamUpdate,
    ) -> Result<()> {
        const OP: &str = "adam_update";
        let ptrs = [w, m, v, g].map(|b| self.ptr(OP, b));
        let [pw, pm, pv, pg] = ptrs;
        let ptrs = [Arg::Ptr(pw?), Arg::Ptr(pm?), Arg::Ptr(pv?), Arg::Ptr(pg?)];
        let extra = [
            Arg::U32(flag(c.decay.is_some(), FLAG_DECAY) | flag(c.l2.is_some(), FLAG_L2)),
            Arg::F32(c.decay.unwrap_or(0.0)),
            Arg::F32(c.l2.unwrap_or(0.0)),
            Arg::F32(c.b1m1),
            Arg::F32(c.omb1),
            Arg::F32(c.b2m1),
            Arg::F32(c.omb2),
            Arg::F32(c.inv_sqrt_bc2),
            Arg::F32(c.eps),
            Arg::F32(c.step),
        ];
        driver::enter()?;
        self.grid_stride(OP, "tl_adam_update", w.len(), &ptrs, &extra)
    }

    /// `tl_momentum_update` over `w`, `b` in place from `g`.
    pub(super) fn momentum_update_impl(
        &mut self,
        w: Buffer,
        b: Buffer,
        g: Buffer,
        c: &MomentumUpdate,
    ) -> Result<()> {
        const OP: &str = "momentum_update";
        let [pw, pb, pg] = [w, b, g].map(|x| self.ptr(OP, x));
        let ptrs = [Arg::Ptr(pw?), Arg::Ptr(pb?), Arg::Ptr(pg?)];
        let extra = [
            Arg::U32(flag(c.l2.is_some(), FLAG_L2) | flag(c.nesterov, FLAG_NESTEROV)),
            Arg::F32(c.l2.unwrap_or(0.0)),
            Arg::F32(c.mom_m1),
            Arg::F32(c.omd),
            Arg::F32(c.momentum),
            Arg::F32(c.step),
        ];
        driver::enter()?;
        self.grid_stride(OP, "tl_momentum_update", w.len(), &ptrs, &extra)
    }
}
