//! Matrix products: `matmul` (2-D), `bmm` (batched) and `linear` (`W·x + b`), as naive loops.

use crate::alloc::try_zeroed;
use crate::{Error, Result, Scalar, Shape, Tensor};

fn dims2(op: &'static str, what: &str, s: &Shape) -> Result<(usize, usize)> {
    match s.dims() {
        &[m, n] => Ok((m, n)),
        _ => Err(Error::shape(
            op,
            format!("{what} must be 2-D, got shape {s}"),
        )),
    }
}

fn dims3(op: &'static str, what: &str, s: &Shape) -> Result<(usize, usize, usize)> {
    match s.dims() {
        &[b, m, n] => Ok((b, m, n)),
        _ => Err(Error::shape(
            op,
            format!("{what} must be 3-D, got shape {s}"),
        )),
    }
}

/// Shape rule of `matmul`: (m, n) · (n, p) → (m, p).
pub fn matmul_shape(a: &Shape, b: &Shape) -> Result<Shape> {
    let (m, n) = dims2("matmul", "left operand", a)?;
    let (n2, p) = dims2("matmul", "right operand", b)?;
    if n != n2 {
        return Err(Error::shape(
            "matmul",
            format!("inner dims differ: {a} · {b}"),
        ));
    }
    Shape::try_new("matmul", &[m, p])
}

/// Shape rule of `bmm`: (B, m, n) · (B, n, p) → (B, m, p).
pub fn bmm_shape(a: &Shape, b: &Shape) -> Result<Shape> {
    let (ba, m, n) = dims3("bmm", "left operand", a)?;
    let (bb, n2, p) = dims3("bmm", "right operand", b)?;
    if ba != bb || n != n2 {
        return Err(Error::shape(
            "bmm",
            format!("batch or inner dims differ: {a} · {b}"),
        ));
    }
    Shape::try_new("bmm", &[ba, m, p])
}

/// Shape rule of `linear(w, b, x)`: w (out, in), b (out), x (in) → (out) or x (B, in) → (B, out).
pub fn linear_shape(w: &Shape, b: &Shape, x: &Shape) -> Result<Shape> {
    let (out, inp) = dims2("linear", "weight", w)?;
    if b.dims() != [out] {
        return Err(Error::shape(
            "linear",
            format!("bias must have shape [{out}] for weight {w}, got {b}"),
        ));
    }
    match *x.dims() {
        [i] if i == inp => Ok(Shape::new(&[out])),
        [batch, i] if i == inp => Shape::try_new("linear", &[batch, out]),
        _ => Err(Error::shape(
            "linear",
            format!("input must have shape [{inp}] or [B, {inp}] for weight {w}, got {x}"),
        )),
    }
}

/// Naive product of row-major (m, n) and (n, p) blocks into `out` (m, p): written, or added to
/// what `out` holds when `add`; `ta`/`tb` read the operand transposed (then `a` is stored
/// (n, m), `b` (p, n)). Each output's sum runs over n in order, from 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Scalar>(
    a: &[T],
    ta: bool,
    b: &[T],
    tb: bool,
    m: usize,
    n: usize,
    p: usize,
    out: &mut [T],
    add: bool,
) {
    for i in 0..m {
        for j in 0..p {
            let mut acc = T::zero();
            for k in 0..n {
                let av = if ta { a[k * m + i] } else { a[i * n + k] };
                let bv = if tb { b[j * n + k] } else { b[k * p + j] };
                acc += av * bv;
            }
            let o = &mut out[i * p + j];
            *o = if add { *o + acc } else { acc };
        }
    }
}

/// (m, n) · (n, p) → (m, p). PyTorch: `a @ b`.
pub fn matmul<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    let s = matmul_shape(a.shape(), b.shape())?;
    let (m, n) = (a.shape().dims()[0], a.shape().dims()[1]);
    let p = b.shape().dims()[1];
    let mut out = try_zeroed("matmul", "output", s.numel())?;
    gemm(a.data(), false, b.data(), false, m, n, p, &mut out, false);
    Tensor::new(s, out)
}
/// VJP of `matmul`: `(g·bᵀ, aᵀ·g)`.
pub fn matmul_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    let s = matmul_shape(a.shape(), b.shape())?;
    check_cotangent("matmul", &s, g)?;
    let (m, n) = (a.shape().dims()[0], a.shape().dims()[1]);
    let p = b.shape().dims()[1];
    let mut da = try_zeroed("matmul", "gradient", m * n)?;
    gemm(g.data(), false, b.data(), true, m, p, n, &mut da, false);
    let mut db = try_zeroed("matmul", "gradient", n * p)?;
    gemm(a.data(), true, g.data(), false, n, m, p, &mut db, false);
    Ok((
        Tensor::new(a.shape().clone(), da)?,
        Tensor::new(b.shape().clone(), db)?,
    ))
}
/// JVP of `matmul`: `da·b + a·db`.
pub fn matmul_jvp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    da: &Tensor<T>,
    db: &Tensor<T>,
) -> Result<Tensor<T>> {
    matmul(da, b)?.add(&matmul(a, db)?)
}

fn check_cotangent<T: Scalar>(op: &'static str, expected: &Shape, g: &Tensor<T>) -> Result<()> {
    if g.shape() == expected {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!("cotangent has shape {}, expected {expected}", g.shape()),
        ))
    }
}

/// (B, m, n) · (B, n, p) → (B, m, p). PyTorch: `torch.bmm`.
pub fn bmm<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    let s = bmm_shape(a.shape(), b.shape())?;
    let (bs, m, n, p) = (s.dims()[0], s.dims()[1], a.shape().dims()[2], s.dims()[2]);
    let mut out = try_zeroed("bmm", "output", s.numel())?;
    for k in 0..bs {
        let (ak, bk) = (
            &a.data()[k * m * n..(k + 1) * m * n],
            &b.data()[k * n * p..(k + 1) * n * p],
        );
        gemm(
            ak,
            false,
            bk,
            false,
            m,
            n,
            p,
            &mut out[k * m * p..(k + 1) * m * p],
            false,
        );
    }
    Tensor::new(s, out)
}
/// VJP of `bmm`: per batch `(g·bᵀ, aᵀ·g)`.
pub fn bmm_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    let s = bmm_shape(a.shape(), b.shape())?;
    check_cotangent("bmm", &s, g)?;
    let (bs, m, n, p) = (s.dims()[0], s.dims()[1], a.shape().dims()[2], s.dims()[2]);
    let mut da = try_zeroed("bmm", "gradient", bs * m * n)?;
    let mut db = try_zeroed("bmm", "gradient", bs * n * p)?;
    for k in 0..bs {
        let ak = &a.data()[k * m * n..(k + 1) * m * n];
        let bk = &b.data()[k * n * p..(k + 1) * n * p];
        let gk = &g.data()[k * m * p..(k + 1) * m * p];
        gemm(
            gk,
            false,
            bk,
            true,
            m,
            p,
            n,
            &mut da[k * m * n..(k + 1) * m * n],
            false,
        );
        gemm(
            ak,
            true,
            gk,
            false,
            n,
            m,
            p,
            &mut db[k * n * p..(k + 1) * n * p],
            false,
        );
    }
    Ok((
        Tensor::new(a.shape().clone(), da)?,
        Tensor::new(b.shape().clone(), db)?,
    ))
}
/// JVP of `bmm`: `da·b + a·db` per batch.
pub fn bmm_jvp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    da: &Tensor<T>,
    db: &Tensor<T>,
) -> Result<Tensor<T>> {
    bmm(da, b)?.add(&bmm(a, db)?)
}

/// View x as (batch, in) rows: a 1-D x is one row.
fn as_rows<T: Scalar>(x: &Tensor<T>) -> (usize, usize) {
    match *x.shape().dims() {
        [i] => (1, i),
        [bt, i] => (bt, i),
        _ => (0, 0),
    }
}

/// `y = W·x + b` for x (in), or row-wise for x (B, in). PyTorch: `F.linear(x, w, b)`.
pub fn linear<T: Scalar>(w: &Tensor<T>, b: &Tensor<T>, x: &Tensor<T>) -> Result<Tensor<T>> {
    let s = linear_shape(w.shape(), b.shape(), x.shape())?;
    let (out, inp) = (w.shape().dims()[0], w.shape().dims()[1]);
    let (rows, _) = as_rows(x);
    let mut y = try_zeroed("linear", "output", s.numel())?;
    // y (rows, out) = x (rows, in) · Wᵀ (in, out)
    gemm(
        x.data(),
        false,
        w.data(),
        true,
        rows,
        inp,
        out,
        &mut y,
        false,
    );
    for r in 0..rows {
        for o in 0..out {
            y[r * out + o] += b.data()[o];
        }
    }
    Tensor::new(s, y)
}
/// VJP of `linear`: `dW = gᵀ·x`, `db = Σ_rows g`, `dx = g·W`.
pub fn linear_vjp<T: Scalar>(
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>, Tensor<T>)> {
    let s = linear_shape(w.shape(), b.shape(), x.shape())?;
    check_cotangent("linear", &s, g)?;
    let (out, inp) = (w.shape().dims()[0], w.shape().dims()[1]);
    let (rows, _) = as_rows(x);
    let mut dw = try_zeroed("linear", "weight gradient", out * inp)?;
    gemm(
        g.data(),
        true,
        x.data(),
        false,
        out,
        rows,
        inp,
        &mut dw,
        false,
    );
    let mut db = try_zeroed("linear", "bias gradient", out)?;
    for row in g.data().chunks(out.max(1)).take(rows) {
        for (d, &v) in db.iter_mut().zip(row) {
            *d += v;
        }
    }
    let mut dx = try_zeroed("linear", "input gradient", rows * inp)?;
    gemm(
        g.data(),
        false,
        w.data(),
        false,
        rows,
        out,
        inp,
        &mut dx,
        false,
    );
    Ok((
        Tensor::new(w.shape().clone(), dw)?,
        Tensor::new(b.shape().clone(), db)?,
        Tensor::new(x.shape().clone(), dx)?,
    ))
}
/// JVP of `linear`: `dW·x + W·dx + db`.
pub fn linear_jvp<T: Scalar>(
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    dw: &Tensor<T>,
    db: &Tensor<T>,
    dx: &Tensor<T>,
) -> Result<Tensor<T>> {
    let zero_b = Tensor::try_zeros("linear", b.shape().clone())?;
    linear(dw, db, x)?.add(&linear(w, &zero_b, dx)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_by_hand() {
        let a = Tensor::<f64>::new([2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = Tensor::<f64>::new([2, 1], vec![5.0, 6.0]).unwrap();
        assert_eq!(matmul(&a, &b).unwrap().data(), &[17.0, 39.0]);
        let e = matmul(&a, &a.reshape([4, 1]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("matmul") && e.contains("[2, 2]") && e.contains("[4, 1]"),
            "{e}"
        );
    }

    #[test]
    fn linear_batched_equals_rows() {
        let w = Tensor::<f64>::from_fn([3, 2], |i| i as f64 - 2.0);
        let b = Tensor::<f64>::vector(vec![0.5, -1.0, 2.0]);
        let x = Tensor::<f64>::from_fn([2, 2], |i| (i * i) as f64);
        let y = linear(&w, &b, &x).unwrap();
        for r in 0..2 {
            let xr = Tensor::vector(x.data()[r * 2..r * 2 + 2].to_vec());
            let yr = linear(&w, &b, &xr).unwrap();
            assert_eq!(&y.data()[r * 3..r * 3 + 3], yr.data());
        }
        // y0 = W·[0,1] + b = [-1, 1, 3] + b
        assert_eq!(&y.data()[..3], &[-0.5, 0.0, 5.0]);
    }

    #[test]
    fn bmm_matches_per_batch_matmul() {
        let a = Tensor::<f64>::from_fn([2, 2, 3], |i| i as f64);
        let b = Tensor::<f64>::from_fn([2, 3, 2], |i| 1.0 - i as f64);
        let c = bmm(&a, &b).unwrap();
        for k in 0..2 {
            let ak = Tensor::new([2, 3], a.data()[k * 6..k * 6 + 6].to_vec()).unwrap();
            let bk = Tensor::new([3, 2], b.data()[k * 6..k * 6 + 6].to_vec()).unwrap();
            assert_eq!(
                &c.data()[k * 4..k * 4 + 4],
                matmul(&ak, &bk).unwrap().data()
            );
        }
    }
}
