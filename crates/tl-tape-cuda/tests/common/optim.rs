//! The fused optimizer steps (`Device::adam_update`, `Device::momentum_update`) against the
//! chains of primitives they replace, on any device: the simulation device in `device.rs`,
//! the CUDA device (a GPU or the kernel emulator) in `gpu.rs`.

use tl_tape_cuda::device::{AdamUpdate, MomentumUpdate};
use tl_tape_cuda::{Buffer, Device, Result};

use super::Gen;

/// Lengths: one element, a partial block, several blocks, more than one grid-stride round.
const LENS: [usize; 4] = [1, 5, 300, 70_000];

/// Values of `n` elements in [lo, hi), with zeros, a negative zero and (where `special`) the
/// non-finite values at fixed places.
fn data(g: &mut Gen, n: usize, lo: f64, hi: f64, special: bool) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|_| g.range(lo, hi) as f32).collect();
    let fixed = [0.0, -0.0, f32::INFINITY, f32::NAN, f32::NEG_INFINITY, 1e-30];
    let k = if special { fixed.len() } else { 2 };
    for (slot, &x) in v.iter_mut().skip(1).step_by(7).zip(&fixed[..k]) {
        *slot = x;
    }
    v
}

fn bits(v: Vec<f32>) -> Vec<u32> {
    v.into_iter().map(f32::to_bits).collect()
}

/// The Adam steps to check: plain, AdamW's decay, Adam's L2 (coefficients as the session's
/// device path makes them for lr 1e-3, β = (0.9, 0.999), ε = 1e-8, λ = 0.01 at step 3).
pub fn adam_cases() -> Vec<AdamUpdate> {
    let (lr, b1, b2, eps, wd, t) = (1e-3f64, 0.9f64, 0.999f64, 1e-8f64, 0.01f64, 3);
    let plain = AdamUpdate {
        decay: None,
        l2: None,
        b1m1: (b1 - 1.0) as f32,
        omb1: (1.0 - b1) as f32,
        b2m1: (b2 - 1.0) as f32,
        omb2: (1.0 - b2) as f32,
        inv_sqrt_bc2: (1.0 / (1.0 - b2.powi(t)).sqrt()) as f32,
        eps: eps as f32,
        step: (-lr / (1.0 - b1.powi(t))) as f32,
    };
    vec![
        plain,
        AdamUpdate {
            decay: Some((-lr * wd) as f32),
            ..plain
        },
        AdamUpdate {
            l2: Some(wd as f32),
            ..plain
        },
    ]
}

/// The momentum steps to check: plain, with dampening and L2, Nesterov.
pub fn momentum_cases() -> Vec<MomentumUpdate> {
    let plain = MomentumUpdate {
        l2: None,
        mom_m1: 0.9f32 - 1.0,
        omd: 1.0,
        momentum: 0.9,
        nesterov: false,
        step: -0.05,
    };
    vec![
        plain,
        MomentumUpdate {
            l2: Some(1e-4),
            omd: 0.75,
            ..plain
        },
        MomentumUpdate {
            nesterov: true,
            l2: Some(1e-4),
            ..plain
        },
    ]
}

/// `c`'s step composed from the primitives, as the session's device path ran it before the
/// fused kernel (and still runs it with `gates::force_fused_optimizer(Some(false))`).
fn adam_composed<D: Device>(d: &mut D, [w, m, v, g]: [Buffer; 4], c: &AdamUpdate) -> Result<()> {
    if let Some(k) = c.decay {
        d.axpy_assign(w, k, w)?;
    }
    let ge = d.copy(g)?;
    if let Some(k) = c.l2 {
        d.axpy_assign(ge, k, w)?;
    }
    d.axpy_assign(m, c.b1m1, m)?;
    d.axpy_assign(m, c.omb1, ge)?;
    let g2 = d.mul(ge, ge)?;
    d.axpy_assign(v, c.b2m1, v)?;
    d.axpy_assign(v, c.omb2, g2)?;
    let s = d.sqrt(v)?;
    let e = d.full(w.len(), c.eps)?;
    let denom = d.axpy(e, s, c.inv_sqrt_bc2)?;
    let u = d.div(m, denom)?;
    d.axpy_assign(w, c.step, u)?;
    d.release_all([ge, g2, s, e, denom, u]);
    Ok(())
}

/// `c`'s step composed from the primitives.
fn momentum_composed<D: Device>(
    d: &mut D,
    [w, b, g]: [Buffer; 3],
    c: &MomentumUpdate,
) -> Result<()> {
    let ge = d.copy(g)?;
    if let Some(k) = c.l2 {
        d.axpy_assign(ge, k, w)?;
    }
    d.axpy_assign(b, c.mom_m1, b)?;
    d.axpy_assign(b, c.omd, ge)?;
    if c.nesterov {
        d.axpy_assign(ge, c.momentum, b)?;
        d.axpy_assign(w, c.step, ge)?;
    } else {
        d.axpy_assign(w, c.step, b)?;
    }
    d.release(ge);
    Ok(())
}

/// Every case on every length, fused against composed: the buffers whose bits differ and the
/// fused steps that took more than one launch (empty when all agree). Every buffer is
/// released.
pub fn optimizer_update_mismatches<D: Device>(d: &mut D) -> Vec<String> {
    let mut g = Gen::new(0x0b7);
    let mut bad = Vec::new();
    let mut run = || -> Result<()> {
        for (k, &n) in LENS.iter().enumerate() {
            let special = k > 0;
            let vals = [
                data(&mut g, n, -3.0, 3.0, special),
                data(&mut g, n, -0.5, 0.5, special),
                data(&mut g, n, 0.0, 0.2, special),
                data(&mut g, n, -2.0, 2.0, special),
            ];
            for (i, c) in adam_cases().iter().enumerate() {
                let up = |d: &mut D| -> Result<Vec<Buffer>> {
                    vals.iter().map(|v| d.upload(v)).collect()
                };
                let (fused, composed) = (up(d)?, up(d)?);
                let before = d.traffic().launches;
                d.adam_update(fused[0], fused[1], fused[2], fused[3], c)?;
                if d.traffic().launches - before != 1 {
                    bad.push(format!("adam case {i}, n {n}: not one launch"));
                }
                adam_composed(d, [composed[0], composed[1], composed[2], composed[3]], c)?;
                for (j, name) in ["w", "m", "v"].iter().enumerate() {
                    if bits(d.download(fused[j])?) != bits(d.download(composed[j])?) {
                        bad.push(format!("adam case {i}, n {n}: {name}"));
                    }
                }
                d.release_all(fused.into_iter().chain(composed));
            }
            for (i, c) in momentum_cases().iter().enumerate() {
                let up = |d: &mut D| -> Result<Vec<Buffer>> {
                    [&vals[0], &vals[1], &vals[3]]
                        .iter()
                        .map(|v| d.upload(v))
                        .collect()
                };
                let (fused, composed) = (up(d)?, up(d)?);
                let before = d.traffic().launches;
                d.momentum_update(fused[0], fused[1], fused[2], c)?;
                if d.traffic().launches - before != 1 {
                    bad.push(format!("momentum case {i}, n {n}: not one launch"));
                }
                momentum_composed(d, [composed[0], composed[1], composed[2]], c)?;
                for (j, name) in ["w", "b"].iter().enumerate() {
                    if bits(d.download(fused[j])?) != bits(d.download(composed[j])?) {
                        bad.push(format!("momentum case {i}, n {n}: {name}"));
                    }
                }
                d.release_all(fused.into_iter().chain(composed));
            }
        }
        Ok(())
    };
    if let Err(e) = run() {
        bad.push(format!("error: {e}"));
    }
    bad
}
