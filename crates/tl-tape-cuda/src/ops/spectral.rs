//! `spectralConv1dRfft` (SEMANTICS.md, "Layers"; tl_spec::ops::spectral) as dense products: the
//! truncated real DFT and its inverse are matmuls against cosine/sine matrices of the kept
//! modes, built on the host in f64 and **uploaded once per call** (forward and backward each
//! upload the ones they use, 2–4 matrices of modes × grid floats); the per-mode complex channel
//! mix is four batched products over the modes.
//!
//! With x' = x as (grid, B·W), `C[k,t] = cos(2π(kt mod N)/N)`, `S'[k,t] = −sin(…)` (0 on the DC
//! and even-grid Nyquist rows) and `α_k/N` the inverse weights:
//! ```text
//! Xr = C·x'   Xi = S'·x'                                  (modes, B·W), per mode (B, W)
//! Zr = Xr·wRe − Xi·wIm   Zi = Xr·wIm + Xi·wRe             (bmm over the modes)
//! y' = (α/N·C)ᵀ·Zr + (α/N·S')ᵀ·Zi                         (grid, B·W)
//! ```
//! The backward applies the transposed steps in reverse (recomputing Xr, Xi when a weight
//! gradient is needed).
//!
//! These products are the DFT's, not autocast products (the CPU tape runs an FFT and an f32
//! channel mix here): both directions install `Precision::F32` around them, so a tape under
//! bf16 / TF32 autocast computes this op in f32 as the CPU tape does.

use tl_spec::Shape;

use super::{Scratch, with_scratch};
use crate::device::{Buffer, Device, Gemm};
use crate::{AnyBuffer, Error, Result};

const OP: &str = "spectralConv1dRfft";

/// (batch, grid, width, modes) of one node.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    n: usize,
    w: usize,
    m: usize,
}

impl Dims {
    fn of(x: &Shape, modes: usize) -> Result<Dims> {
        let (b, n, w) = match *x.dims() {
            [n, w] => (1, n, w),
            [b, n, w] => (b, n, w),
            _ => return Err(Error::kernel(OP, format!("x {x} must be rank 2 or 3"))),
        };
        Ok(Dims { b, n, w, m: modes })
    }

    fn bw(&self) -> usize {
        self.b * self.w
    }

    /// The basis rows `k < modes` over `t < grid`: `C` (`inverse`: times α_k/N) or `S'`. Its
    /// `modes·grid` values are checked against the kernels' `u32` and allocated fallibly
    /// before any is computed.
    fn basis(&self, sine: bool, inverse: bool) -> Result<Vec<f32>> {
        let (n, m) = (self.n, self.m);
        let len = crate::device::check::product(OP, &[m, n])?;
        crate::abi::len_u32(OP, len)?;
        let mut out = tl_spec::alloc::try_with_capacity(OP, "the DFT basis", len)?;
        for k in 0..m {
            let edge = k == 0 || 2 * k == n;
            let scale = if !inverse {
                1.0
            } else if edge {
                1.0 / n as f64
            } else {
                2.0 / n as f64
            };
            for t in 0..n {
                let a = 2.0 * std::f64::consts::PI * ((k * t) % n) as f64 / n as f64;
                let v = match (sine, edge) {
                    (false, _) => a.cos(),
                    (true, true) => 0.0,
                    (true, false) => -a.sin(),
                };
                out.push((v * scale) as f32);
            }
        }
        Ok(out)
    }

    /// x (B, N, W) as (N, B·W): a fresh permute, or `x` itself for B = 1.
    fn grid_major<D: Device>(&self, dev: &mut D, sc: &mut Scratch, x: Buffer) -> Result<Buffer> {
        if self.b == 1 {
            Ok(x)
        } else {
            Ok(sc.tmp(dev.permute(x, &[self.b, self.n, self.w], &[1, 0, 2])?))
        }
    }

    /// (N, B·W) back to (B, N, W); `c` is a registered temporary unless B = 1.
    fn batch_major<D: Device>(&self, dev: &mut D, c: Buffer) -> Result<Buffer> {
        if self.b == 1 {
            Ok(c)
        } else {
            dev.permute(c, &[self.n, self.b, self.w], &[1, 0, 2])
        }
    }

    /// `a·b + c·d` for per-mode products (`sign` −1: `a·b − c·d`) over (modes, B, W) × (W, W).
    #[allow(clippy::too_many_arguments)]
    fn mix<D: Device>(
        &self,
        dev: &mut D,
        sc: &mut Scratch,
        a: Buffer,
        b: Buffer,
        c: Buffer,
        d: Buffer,
        sign: f32,
        g: Gemm,
    ) -> Result<Buffer> {
        let p = sc.tmp(dev.bmm(a, b, self.m, g)?);
        let q = sc.tmp(dev.bmm(c, d, self.m, g)?);
        dev.axpy(p, q, sign)
    }

    /// (Xr, Xi) of x' (registered temporaries).
    fn rfft<D: Device>(&self, dev: &mut D, sc: &mut Scratch, xc: Buffer) -> Result<[Buffer; 2]> {
        let g = Gemm::nn(self.m, self.n, self.bw());
        let cos = sc.tmp(dev.upload(&self.basis(false, false)?)?);
        let sin = sc.tmp(dev.upload(&self.basis(true, false)?)?);
        let xr = sc.tmp(dev.matmul(cos, xc, g)?);
        let xi = sc.tmp(dev.matmul(sin, xc, g)?);
        Ok([xr, xi])
    }
}

fn modes_of(op: &tl_ir::Op) -> Result<usize> {
    match op {
        tl_ir::Op::SpectralConv1dRfft { modes } => Ok(*modes),
        _ => Err(Error::kernel(op.name(), "not a spectral op")),
    }
}

/// Forward on operands `(x, wRe, wIm)`.
pub fn forward<D: Device>(dev: &mut D, op: &tl_ir::Op, x: &[&AnyBuffer]) -> Result<Buffer> {
    let _f32 = crate::precision::install(crate::Precision::F32);
    let d = Dims::of(x[0].shape(), modes_of(op)?)?;
    let (wre, wim) = (x[1].buffer(), x[2].buffer());
    with_scratch(dev, |dev, sc| {
        let xc = d.grid_major(dev, sc, x[0].buffer())?;
        let [xr, xi] = d.rfft(dev, sc, xc)?;
        let g = Gemm::nn(d.b, d.w, d.w);
        let zr = d.mix(dev, sc, xr, wre, xi, wim, -1.0, g)?;
        sc.tmp(zr);
        let zi = d.mix(dev, sc, xr, wim, xi, wre, 1.0, g)?;
        sc.tmp(zi);
        let inv = Gemm::nn(d.n, d.m, d.bw()).with_t(true, false);
        let icos = sc.tmp(dev.upload(&d.basis(false, true)?)?);
        let isin = sc.tmp(dev.upload(&d.basis(true, true)?)?);
        let p = sc.tmp(dev.matmul(icos, zr, inv)?);
        let q = sc.tmp(dev.matmul(isin, zi, inv)?);
        let y = dev.add(p, q)?;
        if d.b == 1 {
            return Ok(y);
        }
        sc.tmp(y);
        d.batch_major(dev, y)
    })
}

/// Backward: cotangents of `(x, wRe, wIm)` where `needs` says.
pub fn backward<D: Device>(
    dev: &mut D,
    op: &tl_ir::Op,
    x: &[&AnyBuffer],
    g: Buffer,
    needs: &[bool],
) -> Result<[Option<Buffer>; 3]> {
    let _f32 = crate::precision::install(crate::Precision::F32);
    let d = Dims::of(x[0].shape(), modes_of(op)?)?;
    let (wre, wim) = (x[1].buffer(), x[2].buffer());
    let mut out: [Option<Buffer>; 3] = [None, None, None];
    if !needs.iter().any(|&n| n) {
        return Ok(out);
    }
    let r = with_scratch(dev, |dev, sc| {
        let gc = d.grid_major(dev, sc, g)?;
        let fwd = Gemm::nn(d.m, d.n, d.bw());
        let icos = sc.tmp(dev.upload(&d.basis(false, true)?)?);
        let isin = sc.tmp(dev.upload(&d.basis(true, true)?)?);
        let dzr = sc.tmp(dev.matmul(icos, gc, fwd)?);
        let dzi = sc.tmp(dev.matmul(isin, gc, fwd)?);
        if needs[1] || needs[2] {
            let xc = d.grid_major(dev, sc, x[0].buffer())?;
            let [xr, xi] = d.rfft(dev, sc, xc)?;
            let tg = Gemm::nn(d.w, d.b, d.w).with_t(true, false);
            if needs[1] {
                out[1] = Some(d.mix(dev, sc, xr, dzr, xi, dzi, 1.0, tg)?);
            }
            if needs[2] {
                out[2] = Some(d.mix(dev, sc, xr, dzi, xi, dzr, -1.0, tg)?);
            }
        }
        if needs[0] {
            let gt = Gemm::nn(d.b, d.w, d.w).with_t(false, true);
            let dxr = d.mix(dev, sc, dzr, wre, dzi, wim, 1.0, gt)?;
            sc.tmp(dxr);
            let dxi = d.mix(dev, sc, dzi, wre, dzr, wim, -1.0, gt)?;
            sc.tmp(dxi);
            let t = Gemm::nn(d.n, d.m, d.bw()).with_t(true, false);
            let cos = sc.tmp(dev.upload(&d.basis(false, false)?)?);
            let sin = sc.tmp(dev.upload(&d.basis(true, false)?)?);
            let p = sc.tmp(dev.matmul(cos, dxr, t)?);
            let q = sc.tmp(dev.matmul(sin, dxi, t)?);
            let dxc = dev.add(p, q)?;
            out[0] = Some(if d.b == 1 {
                dxc
            } else {
                sc.tmp(dxc);
                d.batch_major(dev, dxc)?
            });
        }
        Ok(())
    });
    match r {
        Ok(()) => Ok(out),
        Err(e) => {
            dev.release_all(out.into_iter().flatten());
            Err(e)
        }
    }
}
