//! Matrix products. `matmul` (m, k)·(k, n) and `bmm` (B, m, k)·(B, k, n) are one launch forward
//! and two backward (`g·bᵀ`, `aᵀ·g`, read through the transpose flags, no transposed copies).
//! `linear(w, b, x)` with w (out, in), b (out), x (in) or (B, in) is `x·wᵀ` plus the broadcast
//! bias forward; backward `dw = gᵀ·x`, `db = Σ_rows g`, `dx = g·w`. Shapes were checked by the
//! shape rule before any of these run.

use super::with_scratch;
use crate::device::{BiasLayout, Buffer, Device, Gemm};
use crate::{AnyBuffer, Result};

/// The dims of a (batched) product `a · b`: `batch` entries of (m, k)·(k, n).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product {
    /// Batch entries (1 for `matmul`).
    pub batch: usize,
    /// Rows of `a`.
    pub m: usize,
    /// The contracted dim.
    pub k: usize,
    /// Columns of `b`.
    pub n: usize,
}

impl Product {
    /// Read the dims of `a` (rank 2 or 3) and `b`.
    pub fn of(a: &AnyBuffer, b: &AnyBuffer) -> Product {
        match (a.shape().dims(), b.shape().dims()) {
            (&[batch, m, k], &[_, _, n]) => Product { batch, m, k, n },
            (&[m, k], &[_, n]) => Product { batch: 1, m, k, n },
            // Unreachable after the shape rule; an empty product then fails the length checks.
            _ => Product {
                batch: 0,
                m: 0,
                k: 0,
                n: 0,
            },
        }
    }

    fn run<D: Device>(&self, dev: &mut D, a: Buffer, b: Buffer, g: Gemm) -> Result<Buffer> {
        if self.batch == 1 {
            dev.matmul(a, b, g)
        } else {
            dev.bmm(a, b, self.batch, g)
        }
    }

    /// `a · b`.
    pub fn forward<D: Device>(&self, dev: &mut D, a: &AnyBuffer, b: &AnyBuffer) -> Result<Buffer> {
        self.run(
            dev,
            a.buffer(),
            b.buffer(),
            Gemm::nn(self.m, self.k, self.n),
        )
    }

    /// `g · bᵀ` → (m, k).
    pub fn grad_left<D: Device>(&self, dev: &mut D, g: Buffer, b: Buffer) -> Result<Buffer> {
        self.run(
            dev,
            g,
            b,
            Gemm::nn(self.m, self.n, self.k).with_t(false, true),
        )
    }

    /// `aᵀ · g` → (k, n).
    pub fn grad_right<D: Device>(&self, dev: &mut D, a: Buffer, g: Buffer) -> Result<Buffer> {
        self.run(
            dev,
            a,
            g,
            Gemm::nn(self.k, self.m, self.n).with_t(true, false),
        )
    }
}

/// The dims of `linear(w, b, x)`: `rows` inputs of `inp` features to `out` features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearDims {
    /// 1 for x (in), B for x (B, in).
    pub rows: usize,
    /// Output features.
    pub out: usize,
    /// Input features.
    pub inp: usize,
}

impl LinearDims {
    /// Read the dims of `w` and `x`.
    pub fn of(w: &AnyBuffer, x: &AnyBuffer) -> LinearDims {
        let (out, inp) = match *w.shape().dims() {
            [o, i] => (o, i),
            _ => (0, 0),
        };
        let rows = match *x.shape().dims() {
            [_] => 1,
            [r, _] => r,
            _ => 0,
        };
        LinearDims { rows, out, inp }
    }

    /// `x · wᵀ + b` (the product accumulated over `in` first, then the bias added: the
    /// reference's order).
    pub fn forward<D: Device>(
        &self,
        dev: &mut D,
        w: &AnyBuffer,
        b: &AnyBuffer,
        x: &AnyBuffer,
    ) -> Result<Buffer> {
        self.forward_with(dev, w, b, x, |dev, xw, b, layout| {
            dev.add_bias(xw, b, layout)
        })
    }

    /// The product `x · wᵀ`, then `epilogue(dev, xw, b, layout)` with the bias's layout over it
    /// (`xw` is a temporary, released afterwards): [`forward`](Self::forward) adds the bias,
    /// the CUDA tape's fused pair also applies the activation after it
    /// ([`super::forward_then`]).
    pub fn forward_with<D: Device, R>(
        &self,
        dev: &mut D,
        w: &AnyBuffer,
        b: &AnyBuffer,
        x: &AnyBuffer,
        epilogue: impl FnOnce(&mut D, Buffer, Buffer, BiasLayout) -> Result<R>,
    ) -> Result<R> {
        let LinearDims { rows, out, inp } = *self;
        with_scratch(dev, |dev, s| {
            let xw = s.tmp(dev.matmul(
                x.buffer(),
                w.buffer(),
                Gemm::nn(rows, inp, out).with_t(false, true),
            )?);
            epilogue(dev, xw, b.buffer(), BiasLayout::new(rows, out, 1))
        })
    }

    /// `dw = gᵀ · x` → (out, in).
    pub fn grad_w<D: Device>(&self, dev: &mut D, g: Buffer, x: Buffer) -> Result<Buffer> {
        dev.matmul(
            g,
            x,
            Gemm::nn(self.out, self.rows, self.inp).with_t(true, false),
        )
    }

    /// `db = Σ_rows g` → (out).
    pub fn grad_b<D: Device>(&self, dev: &mut D, g: Buffer) -> Result<Buffer> {
        dev.reduce_axis_sum(g, 1, self.rows, self.out)
    }

    /// `dx = g · w` → (in) or (B, in).
    pub fn grad_x<D: Device>(&self, dev: &mut D, g: Buffer, w: Buffer) -> Result<Buffer> {
        dev.matmul(g, w, Gemm::nn(self.rows, self.out, self.inp))
    }
}
