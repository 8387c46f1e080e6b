//! The fused optimizer steps (`Device::adam_update`, `Device::momentum_update`) against the
//! chains of primitives they replace, and their list forms (`Device::adam_update_list`,
//! `Device::momentum_update_list`) against one launch per parameter, on any device: the
//! simulation device in `device.rs`, the CUDA device (a GPU or the kernel emulator) in
//! `gpu.rs`.

use tl_tape_cuda::device::{AdamSlot, AdamUpdate, MomentumSlot, MomentumUpdate};
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
    adam_cases_at(3)
}

/// [`adam_cases`] at step `t` (the bias corrections differ from step to step, the rest not).
fn adam_cases_at(t: i32) -> Vec<AdamUpdate> {
    let (lr, b1, b2, eps, wd) = (1e-3f64, 0.9f64, 0.999f64, 1e-8f64, 0.01f64);
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

/// Slot lengths of the list checks: eleven parameters (two launches of eight), an empty one, a
/// single element, one past a grid-stride round; slots 0 and 10, 4 and 8 of equal lengths
/// (to share buffers).
const LIST_LENS: [usize; 11] = [5, 0, 1, 300, 17, 70_000, 8, 33, 17, 64, 5];

/// `n` buffers per slot of [`LIST_LENS`] with fresh values, twice: the list's and the
/// reference's (the same values).
fn list_operands<D: Device, const N: usize>(
    d: &mut D,
    g: &mut Gen,
) -> Result<[Vec<[Buffer; N]>; 2]> {
    let ranges = [(-3.0, 3.0), (-0.5, 0.5), (0.0, 0.2), (-2.0, 2.0)];
    let (mut list, mut one) = (Vec::new(), Vec::new());
    for (k, &n) in LIST_LENS.iter().enumerate() {
        let vals: Vec<Vec<f32>> = (0..N)
            .map(|i| {
                // The gradient last, from the last range.
                let (lo, hi) = ranges[if i + 1 == N { 3 } else { i }];
                data(g, n, lo, hi, k % 2 == 1)
            })
            .collect();
        let mut up = || -> Result<[Buffer; N]> {
            let bufs: Vec<Buffer> = vals.iter().map(|v| d.upload(v)).collect::<Result<_>>()?;
            Ok(bufs.try_into().expect("N buffers"))
        };
        list.push(up()?);
        one.push(up()?);
    }
    Ok([list, one])
}

/// The written buffers (the first `w`) of `a` and `b`, slot by slot, whose bits differ, named
/// `what` and the slot.
fn differing<D: Device, const N: usize>(
    d: &mut D,
    what: &str,
    names: &[&str],
    a: &[[Buffer; N]],
    b: &[[Buffer; N]],
) -> Result<Vec<String>> {
    let mut bad = Vec::new();
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        for (j, name) in names.iter().enumerate() {
            if bits(d.download(x[j])?) != bits(d.download(y[j])?) {
                bad.push(format!("{what}, slot {k} (n {}): {name}", x[j].len()));
            }
        }
    }
    Ok(bad)
}

/// `d`'s launches while `f` runs.
fn launches<D: Device>(d: &mut D, f: impl FnOnce(&mut D) -> Result<()>) -> Result<usize> {
    let before = d.traffic().launches;
    f(d)?;
    Ok((d.traffic().launches - before) as usize)
}

/// The list steps against one launch per parameter, bit for bit, on `d` (empty when all
/// agree): eleven parameters of [`LIST_LENS`]' lengths (an empty one, one past a grid) in two
/// launches for each Adam and momentum case, the Adam slots at different step counts (their
/// bias corrections per slot); Adam slots of three cases interleaved in three launches (one
/// per case: the kernel takes the other coefficients for the whole list); lists in which a
/// buffer occurs in two slots (a shared gradient, a slot reading another's parameter) in one
/// launch per slot with the sequential result; an empty list in none; a length mismatch or a
/// buffer twice in a slot an error naming the list and the slot, before anything is written.
/// Every buffer is released.
pub fn optimizer_list_mismatches<D: Device>(d: &mut D) -> Vec<String> {
    let mut g = Gen::new(0x115);
    let mut bad = Vec::new();
    let mut run = || -> Result<()> {
        // Adam: each case over the whole list, slot k at step 1 + k % 4; then the three cases
        // interleaved.
        let cases = adam_cases();
        let mixed = (0..LIST_LENS.len()).map(|k| adam_cases_at(1 + k as i32 % 4)[k % 3]);
        let lists: Vec<(String, Vec<AdamUpdate>, usize)> = (0..cases.len())
            .map(|i| {
                let cs = (0..LIST_LENS.len()).map(|k| adam_cases_at(1 + k as i32 % 4)[i]);
                (format!("adam case {i}"), cs.collect(), 2)
            })
            .chain([("adam, cases interleaved".to_string(), mixed.collect(), 3)])
            .collect();
        for (what, cs, want) in &lists {
            let [list, one] = list_operands::<D, 4>(d, &mut g)?;
            let slots: Vec<AdamSlot> = (list.iter().zip(cs))
                .map(|(&[w, m, v, g], &c)| AdamSlot { w, m, v, g, c })
                .collect();
            let n = launches(d, |d| d.adam_update_list(&slots))?;
            if n != *want {
                bad.push(format!("{what}: {n} launches, not {want}"));
            }
            for (&[w, m, v, g], c) in one.iter().zip(cs) {
                d.adam_update(w, m, v, g, c)?;
            }
            bad.extend(differing(d, what, &["w", "m", "v"], &list, &one)?);
            d.release_all(list.into_iter().chain(one).flatten());
        }
        for (i, c) in momentum_cases().iter().enumerate() {
            let what = format!("momentum case {i}");
            let [list, one] = list_operands::<D, 3>(d, &mut g)?;
            let slots: Vec<MomentumSlot> = (list.iter())
                .map(|&[w, b, g]| MomentumSlot { w, b, g })
                .collect();
            let n = launches(d, |d| d.momentum_update_list(c, &slots))?;
            if n != 2 {
                bad.push(format!("{what}: {n} launches, not 2"));
            }
            for &[w, b, g] in &one {
                d.momentum_update(w, b, g, c)?;
            }
            bad.extend(differing(d, &what, &["w", "b"], &list, &one)?);
            d.release_all(list.into_iter().chain(one).flatten());
        }
        bad.extend(shared_and_refused(d, &mut g)?);
        Ok(())
    };
    if let Err(e) = run() {
        bad.push(format!("error: {e}"));
    }
    bad
}

/// [`optimizer_list_mismatches`]' lists with a buffer in two slots, the empty lists and the
/// refused ones.
fn shared_and_refused<D: Device>(d: &mut D, g: &mut Gen) -> Result<Vec<String>> {
    let mut bad = Vec::new();
    let c = adam_cases()[1];
    let [list, one] = list_operands::<D, 4>(d, g)?;
    // Every slot but the empty one (which a CUDA device does not launch on its own); slot 8
    // reads slot 4's gradient, slot 10 reads slot 0's parameter, which slot 0 updates first.
    let shared = |b: &[[Buffer; 4]]| -> Vec<[Buffer; 4]> {
        let mut slots = b.to_vec();
        slots[8][3] = b[4][3];
        slots[10][3] = b[0][0];
        slots.remove(1);
        slots
    };
    let (slots, reference) = (shared(&list), shared(&one));
    let adam = |b: &[[Buffer; 4]]| -> Vec<AdamSlot> {
        (b.iter())
            .map(|&[w, m, v, g]| AdamSlot { w, m, v, g, c })
            .collect()
    };
    let n = launches(d, |d| d.adam_update_list(&adam(&slots)))?;
    if n != slots.len() {
        bad.push(format!("shared adam list: {n} launches, not one per slot"));
    }
    for s in adam(&reference) {
        d.adam_update(s.w, s.m, s.v, s.g, &s.c)?;
    }
    bad.extend(differing(
        d,
        "shared adam list",
        &["w", "m", "v"],
        &list,
        &one,
    )?);
    let s = momentum_cases()[2];
    let momentum = |b: &[[Buffer; 4]]| -> Vec<MomentumSlot> {
        (b.iter())
            .map(|&[w, b, _, g]| MomentumSlot { w, b, g })
            .collect()
    };
    let n = launches(d, |d| d.momentum_update_list(&s, &momentum(&slots)))?;
    if n != slots.len() {
        bad.push(format!(
            "shared momentum list: {n} launches, not one per slot"
        ));
    }
    for m in momentum(&reference) {
        d.momentum_update(m.w, m.b, m.g, &s)?;
    }
    bad.extend(differing(
        d,
        "shared momentum list",
        &["w", "b"],
        &list,
        &one,
    )?);
    // Empty lists: nothing launched.
    let n = launches(d, |d| {
        d.adam_update_list(&[])?;
        d.momentum_update_list(&s, &[])
    })?;
    if n != 0 {
        bad.push(format!("empty lists: {n} launches"));
    }
    // Refused before anything is written: a gradient of another length in slot 2, a moment
    // twice in slot 1, a parameter read as its own gradient in slot 6.
    let before: Vec<Vec<u32>> = (list.iter().flatten())
        .map(|&b| d.download(b).map(bits))
        .collect::<Result<_>>()?;
    let base = adam(&list);
    let mut short = base.clone();
    short[2].g = list[3][3];
    let mut twice = base.clone();
    twice[1].v = twice[1].m;
    let mut own = base.clone();
    own[6].g = own[6].w;
    let mut mshort = momentum(&list);
    mshort[5].b = list[0][1];
    let errors = [
        (
            d.adam_update_list(&short),
            "slot 2: operands have 1 and 300 elements",
        ),
        (
            d.adam_update_list(&twice),
            "slot 1: m and v are the same buffer",
        ),
        (
            d.adam_update_list(&own),
            "slot 6: w and g are the same buffer",
        ),
        (
            d.momentum_update_list(&s, &mshort),
            "slot 5: operands have 70000 and 5 elements",
        ),
    ];
    for (k, (r, want)) in errors.into_iter().enumerate() {
        let op = if k < 3 {
            "adam_update_list"
        } else {
            "momentum_update_list"
        };
        match r {
            Err(e) if e.to_string().contains(op) && e.to_string().contains(want) => {}
            other => bad.push(format!("refusal {k}: {other:?}, wanted {op}: {want}")),
        }
    }
    let after: Vec<Vec<u32>> = (list.iter().flatten())
        .map(|&b| d.download(b).map(bits))
        .collect::<Result<_>>()?;
    if before != after {
        bad.push("a refused list wrote a buffer".into());
    }
    d.release_all(list.into_iter().chain(one).flatten());
    Ok(bad)
}
