//! Index kernels: every gather copies whole rows (a 1-D x is rows of one element) into the
//! output, or zeros for an out-of-range index; its backward scatter-adds the cotangent rows into
//! zeros of x's shape in index order, so repeated indices accumulate and out-of-range ones get
//! nothing. Indices come from the op (static/raw), the Nat environment (one position, or a block of positions) or the
//! index tensor (values that are not non-negative integers below rows count as out of range).
//! `scatterAddVec`/`scatterAddRow` copy x and add v into one row; backward `(g, g[row])`.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::ops::index::{nat_at, try_nat_vec_at};
use tl_spec::{Scalar, Tensor};

use super::{Grads, check_arity, check_shape, out_shape, tensor, wrong_family};
use crate::Result;

/// Forward value of an index op.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>], nats: &[usize]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let out = out_shape(op, x)?;
    let (rows, cols) = rows_cols(x[0]);
    if let Op::ScatterAddVec { index } | Op::ScatterAddRow { index } = op {
        let mut y = x[0].clone();
        let at = index * cols;
        for (a, &b) in y.data_mut()[at..at + cols].iter_mut().zip(x[1].data()) {
            *a += b;
        }
        return Ok(y);
    }
    let idx = indices(op, x, nats, rows)?;
    let src = x[0].data();
    let mut data = tl_spec::alloc::try_zeroed(op.name(), "output", out.numel())?;
    for (&i, o) in idx.iter().zip(data.chunks_exact_mut(cols.max(1))) {
        if i < rows {
            o.copy_from_slice(&src[i * cols..(i + 1) * cols]);
        }
    }
    tensor(out, data)
}

/// Operand cotangents of an index op (the index tensor of `gather` gets `None`).
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    nats: &[usize],
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    let out = out_shape(op, x)?;
    check_shape(op, "output", y, &out)?;
    check_shape(op, "cotangent", g, &out)?;
    let (rows, cols) = rows_cols(x[0]);
    if let Op::ScatterAddVec { index } | Op::ScatterAddRow { index } = op {
        let at = index * cols;
        let row = tl_spec::alloc::try_copy(op.name(), "cotangent", &g.data()[at..at + cols])?;
        let dv = tensor(x[1].shape().clone(), row)?;
        return Ok(smallvec![Some(g.clone()), Some(dv)]);
    }
    let idx = indices(op, x, nats, rows)?;
    let mut dx = tl_spec::alloc::try_zeroed(op.name(), "cotangent", x[0].numel())?;
    for (&i, gr) in idx.iter().zip(g.data().chunks_exact(cols.max(1))) {
        if i < rows {
            for (d, &v) in dx[i * cols..(i + 1) * cols].iter_mut().zip(gr) {
                *d += v;
            }
        }
    }
    let dx = Some(tensor(x[0].shape().clone(), dx)?);
    Ok(if x.len() == 2 {
        smallvec![dx, None]
    } else {
        smallvec![dx]
    })
}

/// `(rows, cols)` of a gather/scatter operand: (n, 1) for 1-D (rank checked by the shape rule).
fn rows_cols<T: Scalar>(x: &Tensor<T>) -> (usize, usize) {
    match x.shape().dims() {
        &[n] => (n, 1),
        &[r, c, ..] => (r, c),
        [] => (0, 0),
    }
}

/// The row indices a gather reads; an index ≥ rows is out of range (a zero row).
fn indices<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    nats: &[usize],
    rows: usize,
) -> Result<Vec<usize>> {
    use Op::*;
    Ok(match op {
        GatherScalar { index }
        | GatherRow { index }
        | GatherScalarRaw { index }
        | GatherRowRaw { index } => vec![*index],
        GatherScalarNat { at } | GatherRowNat { at } => vec![nat_at(nats, *at)],
        GatherScalarsNatVec { at, k } | GatherRowsNatVec { at, k } => {
            try_nat_vec_at(op.name(), nats, *at, *k)?
        }
        GatherIndexTensor => {
            let idx = x.get(1).ok_or_else(|| wrong_family(op, "index"))?.data();
            let rows_of = idx.iter().map(|&v| {
                let v = v.as_f64();
                if v >= 0.0 && v.fract() == 0.0 && v < rows as f64 {
                    v as usize
                } else {
                    rows
                }
            });
            tl_spec::alloc::try_collect(op.name(), "indices", idx.len(), rows_of)?
        }
        _ => return Err(wrong_family(op, "index")),
    })
}
