//! [`VecOps`]: the handful of vector primitives the optimizers are written against, once, and
//! their two implementations: host `Vec<f64>` and device buffers (TorchLean's primitives:
//! `scale`, `axpy`, `mul`, `div`, `sqrt`), so the CUDA update runs on the device.

use tl_tape_cuda::device::{AdamUpdate, MomentumUpdate};
use tl_tape_cuda::{Buffer, Device};

use super::{AdamStep, MomentumStep};
use crate::Result;

/// Where optimizer state lives and in which type: host vectors or device buffers.
///
/// State is stored in its parameter's type, as PyTorch keeps it: an `f32` parameter's
/// momentum or moments are `f32` on the host as on a device (half the memory of `f64`). The
/// host update ([`crate::Optimizer::update_host`]) widens them to `f64`, runs the formula in
/// `f64` and rounds the new state once to `f32`.
#[derive(Debug, Clone, PartialEq)]
pub enum StateBuf {
    /// Host state in `f64`: `f64` parameters, and [`crate::Optimizer::update`] called with
    /// [`HostOps`] directly.
    Host(Vec<f64>),
    /// Host state of `f32` parameters (CPU and linked sessions over `f32`).
    HostF32(Vec<f32>),
    /// Device state (CUDA sessions); released with [`crate::Optimizer::release_device_state`].
    Device(Buffer),
}

/// Vector primitives for optimizer updates. `V` owns its storage; `release` frees it.
pub trait VecOps {
    /// A vector.
    type V;
    /// Zeros of `x`'s length.
    fn zeros_like(&mut self, x: &Self::V) -> Result<Self::V>;
    /// `v` at every element, of `x`'s length.
    fn full_like(&mut self, x: &Self::V, v: f64) -> Result<Self::V>;
    /// A fresh copy.
    fn copy(&mut self, x: &Self::V) -> Result<Self::V>;
    /// `min(hi, max(lo, x))`, fresh (gradient clipping by value).
    fn clamp(&mut self, x: &Self::V, lo: f64, hi: f64) -> Result<Self::V>;
    /// `Σ|x|` (`p` = 1), `Σx²` (`p` = 2) or `max|x|` (`p` = ∞, NaN when an element is NaN):
    /// one parameter's share of a gradient norm. On the device the sums run there and one
    /// scalar is read back; the maximum reads `|x|` back.
    fn norm_part(&mut self, x: &Self::V, p: f64) -> Result<f64>;
    /// `y ← c · y`.
    fn scale_assign(&mut self, y: &mut Self::V, c: f64) -> Result<()>;
    /// `y ← y + c · x`.
    fn axpy_assign(&mut self, y: &mut Self::V, c: f64, x: &Self::V) -> Result<()>;
    /// `a · b`, fresh.
    fn mul(&mut self, a: &Self::V, b: &Self::V) -> Result<Self::V>;
    /// `a / b`, fresh.
    fn div(&mut self, a: &Self::V, b: &Self::V) -> Result<Self::V>;
    /// `sqrt(x) · c + e`, fresh (Adam's denominator).
    fn sqrt_scale_add(&mut self, x: &Self::V, c: f64, e: f64) -> Result<Self::V>;
    /// Free a temporary.
    fn release(&mut self, v: Self::V);
    /// Free optimizer state of this implementation's kind (the other kind is dropped as is).
    fn release_state(&mut self, s: StateBuf);
    /// The first element of `x` that is NaN or ±∞, with its index (`None` when all are finite);
    /// used by [`crate::Optimizer::check_finite`]. On the device this reads `x` back.
    fn first_non_finite(&mut self, x: &Self::V) -> Result<Option<(usize, f64)>>;
    /// Store `v` as optimizer state.
    fn into_state(v: Self::V) -> StateBuf;
    /// View optimizer state as a vector of this implementation (an error for the other kind).
    fn state_mut(s: &mut StateBuf) -> Result<&mut Self::V>;

    /// Whether [`VecOps::adam_step`] and [`VecOps::momentum_step`] run a whole step in one
    /// call (a device: one launch per parameter, unless
    /// `tl_tape_cuda::gates::force_fused_optimizer` says otherwise). `false` (the default):
    /// the optimizer runs its rule one primitive at a time.
    fn fused_steps(&self) -> bool {
        false
    }

    /// One Adam(W) step of `w` and its moments `m`, `v` from the gradient `g` in one call,
    /// with the values the rule's primitives give one by one. Called only when
    /// [`VecOps::fused_steps`]; the default is an error.
    fn adam_step(
        &mut self,
        w: &mut Self::V,
        m: &mut Self::V,
        v: &mut Self::V,
        g: &Self::V,
        c: &AdamStep,
    ) -> Result<()> {
        let _ = (w, m, v, g, c);
        Err(not_fused("adam_step"))
    }

    /// One momentum SGD step (after the first) of `w` and its momentum buffer `b` from the
    /// gradient `g` in one call, as [`VecOps::adam_step`].
    fn momentum_step(
        &mut self,
        w: &mut Self::V,
        b: &mut Self::V,
        g: &Self::V,
        c: &MomentumStep,
    ) -> Result<()> {
        let _ = (w, b, g, c);
        Err(not_fused("momentum_step"))
    }
}

/// Store host state in the parameter's type `T`: `f64` state of an `f32` parameter is rounded
/// (to nearest) to `f32` (after [`HostOps`] widened it for an update); other state is left.
pub(crate) fn store_as<T: tl_spec::Scalar>(bufs: &mut [StateBuf]) {
    if std::any::TypeId::of::<T>() != std::any::TypeId::of::<f32>() {
        return;
    }
    for b in bufs {
        if let StateBuf::Host(v) = b {
            *b = StateBuf::HostF32(v.iter().map(|&x| x as f32).collect());
        }
    }
}

/// The error of a fused step asked of an implementation without one.
fn not_fused(what: &'static str) -> crate::Error {
    crate::Error::Usage {
        what,
        detail:
            "this VecOps runs the optimizer's rule one primitive at a time (fused_steps is false)"
                .into(),
    }
}

/// The `f32` coefficient of `y ← y + k·y` that [`DeviceOps`] launches for `y ← c·y`.
fn scale_coef(c: f64) -> f32 {
    (c - 1.0) as f32
}

/// The device kernel's coefficients of an Adam(W) step: each as the primitive it replaces
/// receives it ([`DeviceOps`]' `scale_assign`, `axpy_assign`, `sqrt_scale_add`), so the fused
/// step has the composed step's bits.
pub(super) fn adam_update(c: &AdamStep) -> AdamUpdate {
    AdamUpdate {
        decay: c.decay.map(scale_coef),
        l2: c.l2.map(|x| x as f32),
        b1m1: scale_coef(c.beta1),
        omb1: (1.0 - c.beta1) as f32,
        b2m1: scale_coef(c.beta2),
        omb2: (1.0 - c.beta2) as f32,
        inv_sqrt_bc2: c.inv_sqrt_bc2 as f32,
        eps: c.eps as f32,
        step: c.step as f32,
    }
}

/// The device kernel's coefficients of a momentum SGD step, as [`adam_update`]'s.
pub(super) fn momentum_update(c: &MomentumStep) -> MomentumUpdate {
    MomentumUpdate {
        l2: c.l2.map(|x| x as f32),
        mom_m1: scale_coef(c.momentum),
        omd: (1.0 - c.dampening) as f32,
        momentum: c.momentum as f32,
        nesterov: c.nesterov,
        step: (-c.lr) as f32,
    }
}

fn wrong_kind(expected: &str) -> crate::Error {
    crate::Error::Usage {
        what: "optimizer step",
        detail: format!(
            "the optimizer holds state of the other backend kind (expected {expected} state); use one optimizer per session kind"
        ),
    }
}

/// The largest `|v|`, NaN when any `v` is NaN (PyTorch's ∞-norm); 0 for none.
fn max_abs(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(0.0, |m, v| {
        if m.is_nan() || v.is_nan() {
            f64::NAN
        } else {
            m.max(v.abs())
        }
    })
}

/// Host vectors in f64.
#[derive(Debug, Default)]
pub struct HostOps;

impl VecOps for HostOps {
    type V = Vec<f64>;
    fn zeros_like(&mut self, x: &Vec<f64>) -> Result<Vec<f64>> {
        Ok(vec![0.0; x.len()])
    }
    fn full_like(&mut self, x: &Vec<f64>, v: f64) -> Result<Vec<f64>> {
        Ok(vec![v; x.len()])
    }
    fn copy(&mut self, x: &Vec<f64>) -> Result<Vec<f64>> {
        Ok(x.clone())
    }
    fn clamp(&mut self, x: &Vec<f64>, lo: f64, hi: f64) -> Result<Vec<f64>> {
        // NaN stays NaN (PyTorch's clamp); f64::clamp would keep it too, but panics on lo > hi.
        Ok(x.iter()
            .map(|&v| {
                if v < lo {
                    lo
                } else if v > hi {
                    hi
                } else {
                    v
                }
            })
            .collect())
    }
    fn norm_part(&mut self, x: &Vec<f64>, p: f64) -> Result<f64> {
        Ok(if p == 1.0 {
            x.iter().map(|v| v.abs()).sum()
        } else if p == 2.0 {
            x.iter().map(|v| v * v).sum()
        } else {
            max_abs(x.iter().copied())
        })
    }
    fn scale_assign(&mut self, y: &mut Vec<f64>, c: f64) -> Result<()> {
        y.iter_mut().for_each(|v| *v *= c);
        Ok(())
    }
    fn axpy_assign(&mut self, y: &mut Vec<f64>, c: f64, x: &Vec<f64>) -> Result<()> {
        y.iter_mut().zip(x).for_each(|(y, x)| *y += c * x);
        Ok(())
    }
    fn mul(&mut self, a: &Vec<f64>, b: &Vec<f64>) -> Result<Vec<f64>> {
        Ok(a.iter().zip(b).map(|(a, b)| a * b).collect())
    }
    fn div(&mut self, a: &Vec<f64>, b: &Vec<f64>) -> Result<Vec<f64>> {
        Ok(a.iter().zip(b).map(|(a, b)| a / b).collect())
    }
    fn sqrt_scale_add(&mut self, x: &Vec<f64>, c: f64, e: f64) -> Result<Vec<f64>> {
        Ok(x.iter().map(|v| v.max(0.0).sqrt() * c + e).collect())
    }
    fn release(&mut self, _v: Vec<f64>) {}
    fn release_state(&mut self, _s: StateBuf) {}
    fn first_non_finite(&mut self, x: &Vec<f64>) -> Result<Option<(usize, f64)>> {
        Ok(x.iter().position(|v| !v.is_finite()).map(|i| (i, x[i])))
    }
    fn into_state(v: Vec<f64>) -> StateBuf {
        StateBuf::Host(v)
    }
    fn state_mut(s: &mut StateBuf) -> Result<&mut Vec<f64>> {
        // f32 state is widened in place for the update (`Optimizer::update_host` rounds it
        // back afterwards): exact, and the same formula as f64 state from here on.
        if let StateBuf::HostF32(v) = s {
            *s = StateBuf::Host(v.iter().map(|&x| f64::from(x)).collect());
        }
        match s {
            StateBuf::Host(v) => Ok(v),
            StateBuf::HostF32(_) | StateBuf::Device(_) => Err(wrong_kind("host")),
        }
    }
}

/// Device buffers (float32), through the device's primitives.
#[derive(Debug)]
pub struct DeviceOps<'a, D: Device>(pub &'a mut D);

impl<D: Device> VecOps for DeviceOps<'_, D> {
    type V = Buffer;
    fn zeros_like(&mut self, x: &Buffer) -> Result<Buffer> {
        Ok(self.0.zeros(x.len())?)
    }
    fn full_like(&mut self, x: &Buffer, v: f64) -> Result<Buffer> {
        Ok(self.0.full(x.len(), v as f32)?)
    }
    fn copy(&mut self, x: &Buffer) -> Result<Buffer> {
        Ok(self.0.copy(*x)?)
    }
    fn clamp(&mut self, x: &Buffer, lo: f64, hi: f64) -> Result<Buffer> {
        Ok(self.0.clamp(*x, lo as f32, hi as f32)?)
    }
    fn norm_part(&mut self, x: &Buffer, p: f64) -> Result<f64> {
        if x.is_empty() {
            return Ok(0.0);
        }
        let dev = &mut *self.0;
        if p == 2.0 || p == 1.0 {
            let t = if p == 2.0 {
                dev.mul(*x, *x)?
            } else {
                dev.abs(*x)?
            };
            let s = dev.reduce_sum(t);
            dev.release(t);
            let s = s?;
            let v = dev.download(s);
            dev.release(s);
            return Ok(f64::from(v?[0]));
        }
        let v = dev.download(*x)?;
        Ok(max_abs(v.into_iter().map(f64::from)))
    }
    fn scale_assign(&mut self, y: &mut Buffer, c: f64) -> Result<()> {
        // y ← y + (c − 1)·y, in place, so the buffer (a parameter mirror) keeps its handle.
        Ok(self.0.axpy_assign(*y, scale_coef(c), *y)?)
    }
    fn axpy_assign(&mut self, y: &mut Buffer, c: f64, x: &Buffer) -> Result<()> {
        Ok(self.0.axpy_assign(*y, c as f32, *x)?)
    }
    fn mul(&mut self, a: &Buffer, b: &Buffer) -> Result<Buffer> {
        Ok(self.0.mul(*a, *b)?)
    }
    fn div(&mut self, a: &Buffer, b: &Buffer) -> Result<Buffer> {
        Ok(self.0.div(*a, *b)?)
    }
    fn sqrt_scale_add(&mut self, x: &Buffer, c: f64, e: f64) -> Result<Buffer> {
        let s = self.0.sqrt(*x)?;
        let e = self.0.full(x.len(), e as f32).inspect_err(|_| {
            self.0.release(s);
        })?;
        let out = self.0.axpy(e, s, c as f32);
        self.0.release(s);
        self.0.release(e);
        Ok(out?)
    }
    fn release(&mut self, v: Buffer) {
        self.0.release(v);
    }
    fn release_state(&mut self, s: StateBuf) {
        if let StateBuf::Device(b) = s {
            self.0.release(b);
        }
    }
    fn first_non_finite(&mut self, x: &Buffer) -> Result<Option<(usize, f64)>> {
        let v = self.0.download(*x)?;
        Ok(v.iter()
            .position(|v| !v.is_finite())
            .map(|i| (i, f64::from(v[i]))))
    }
    fn into_state(v: Buffer) -> StateBuf {
        StateBuf::Device(v)
    }
    fn fused_steps(&self) -> bool {
        tl_tape_cuda::gates::fused_optimizer()
    }
    fn adam_step(
        &mut self,
        w: &mut Buffer,
        m: &mut Buffer,
        v: &mut Buffer,
        g: &Buffer,
        c: &AdamStep,
    ) -> Result<()> {
        Ok(self.0.adam_update(*w, *m, *v, *g, &adam_update(c))?)
    }
    fn momentum_step(
        &mut self,
        w: &mut Buffer,
        b: &mut Buffer,
        g: &Buffer,
        c: &MomentumStep,
    ) -> Result<()> {
        Ok(self.0.momentum_update(*w, *b, *g, &momentum_update(c))?)
    }
    fn state_mut(s: &mut StateBuf) -> Result<&mut Buffer> {
        match s {
            StateBuf::Device(v) => Ok(v),
            StateBuf::Host(_) | StateBuf::HostF32(_) => Err(wrong_kind("device")),
        }
    }
}
