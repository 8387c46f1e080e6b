//! Argument checks every device runs before a launch, shared by the implementations so that the
//! simulation device and the CUDA device reject exactly the same inputs with the same errors.

use smallvec::SmallVec;

use super::{Batch, Buffer, Gemm, MAX_RANK};
use crate::{Error, Result, abi};

/// Dims or strides of one tensor, inline up to [`MAX_RANK`].
pub type Dims = SmallVec<[usize; MAX_RANK]>;

/// `b` has `expected` elements.
pub fn len_is(op: &'static str, what: &str, b: Buffer, expected: usize) -> Result<()> {
    if b.len() == expected {
        Ok(())
    } else {
        Err(Error::kernel(
            op,
            format!("{what} has {} element(s), expected {expected}", b.len()),
        ))
    }
}

/// `a` and `b` have the same length; returns it (checked for the `u32` ABI).
pub fn same_len(op: &'static str, a: Buffer, b: Buffer) -> Result<usize> {
    if a.len() != b.len() {
        return Err(Error::kernel(
            op,
            format!("operands have {} and {} elements", a.len(), b.len()),
        ));
    }
    abi::len_u32(op, a.len())?;
    Ok(a.len())
}

/// `a`, `b` and `g` have the same length (a two-output pointwise backward); returns it.
pub fn same_len3(op: &'static str, a: Buffer, b: Buffer, g: Buffer) -> Result<usize> {
    let n = same_len(op, a, b)?;
    same_len(op, a, g)?;
    Ok(n)
}

/// The buffers of an in-place update with several outputs are distinct allocations (`names`
/// say which is which): one written twice, or an output read as an input, would make the
/// result depend on the order of the writes.
pub fn distinct(op: &'static str, named: &[(&str, Buffer)]) -> Result<()> {
    for (k, &(a, x)) in named.iter().enumerate() {
        if let Some(&(b, _)) = named[..k].iter().find(|(_, y)| y.id() == x.id()) {
            return Err(Error::kernel(
                op,
                format!(
                    "{b} and {a} are the same buffer (#{}); they must be distinct",
                    x.id()
                ),
            ));
        }
    }
    Ok(())
}

/// Checked dims of an axis reduction: `x` is (outer, n, inner); returns `outer·inner`, the
/// output's length.
pub fn axis_lens(
    op: &'static str,
    x: Buffer,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<usize> {
    len_is(op, "input", x, product(op, &[outer, n, inner])?)?;
    product(op, &[outer, inner])
}

/// The product of `factors`, or an error naming `op` when it overflows `usize`.
pub fn product(op: &'static str, factors: &[usize]) -> Result<usize> {
    factors.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| Error::kernel(op, format!("element count of {factors:?} overflows")))
    })
}

/// The element count of `dims`, with rank ≤ [`MAX_RANK`] and every dim within the `u32` ABI.
pub fn dims_numel(op: &'static str, dims: &[usize]) -> Result<usize> {
    if dims.len() > MAX_RANK {
        return Err(Error::kernel(
            op,
            format!(
                "rank {} of {dims:?} exceeds the kernel limit {MAX_RANK}",
                dims.len()
            ),
        ));
    }
    abi::dims_u32(op, dims)?;
    let n = product(op, dims)?;
    abi::len_u32(op, n)?;
    Ok(n)
}

/// Row-major strides of `dims`, saturating (an empty tensor's other dims may overflow; its
/// strides are never followed).
pub fn strides(dims: &[usize]) -> Dims {
    let mut s: Dims = SmallVec::from_elem(1, dims.len());
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(dims[i + 1]);
    }
    s
}

/// A checked broadcast from dims `from` to dims `to`: for each axis of `to`, the stride into
/// the source (0 along broadcast axes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BroadcastPlan {
    /// Dims of the broadcast result.
    pub to: Dims,
    /// For each axis of `to`, the source stride (0 where the axis is broadcast).
    pub src_strides: Dims,
    /// Element count of the source.
    pub from_len: usize,
    /// Element count of the result.
    pub to_len: usize,
}

impl BroadcastPlan {
    /// Check numpy's rules (right-aligned; each dim of `from` equals that of `to` or is 1).
    pub fn new(op: &'static str, from: &[usize], to: &[usize]) -> Result<BroadcastPlan> {
        let from_len = dims_numel(op, from)?;
        let to_len = dims_numel(op, to)?;
        let ok = from.len() <= to.len()
            && from
                .iter()
                .zip(&to[to.len() - from.len()..])
                .all(|(&f, &t)| f == t || f == 1);
        if !ok {
            return Err(Error::kernel(
                op,
                format!("cannot broadcast {from:?} to {to:?} (dims are matched from the right)"),
            ));
        }
        let offset = to.len() - from.len();
        let fs = strides(from);
        let mut src_strides: Dims = SmallVec::from_elem(0, to.len());
        for (k, s) in src_strides.iter_mut().enumerate().skip(offset) {
            if from[k - offset] != 1 {
                *s = fs[k - offset];
            }
        }
        Ok(BroadcastPlan {
            to: SmallVec::from_slice(to),
            src_strides,
            from_len,
            to_len,
        })
    }

    /// The source index of every result element, in row-major order of the result (the
    /// per-thread index computation of the kernel, done with a mixed-radix counter). The index
    /// vector is checked against the allocation cap ([`tl_spec::alloc`]) first.
    pub fn source_indices(&self) -> Result<Vec<usize>> {
        gather_indices("broadcast", &self.to, &self.src_strides, self.to_len)
    }
}

/// A checked permutation of dims `dims`: output axis k is input axis `perm[k]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermutePlan {
    /// Dims of the result.
    pub out: Dims,
    /// For each output axis, the input stride it walks.
    pub src_strides: Dims,
    /// Element count.
    pub len: usize,
}

impl PermutePlan {
    /// Check that `perm` is a permutation of `0..dims.len()` and the rank is within the limit.
    pub fn new(op: &'static str, dims: &[usize], perm: &[usize]) -> Result<PermutePlan> {
        let len = dims_numel(op, dims)?;
        let mut seen = [false; MAX_RANK];
        let valid = perm.len() == dims.len()
            && perm
                .iter()
                .all(|&p| p < dims.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(Error::kernel(
                op,
                format!("{perm:?} is not a permutation of the axes of {dims:?}"),
            ));
        }
        let s = strides(dims);
        Ok(PermutePlan {
            out: perm.iter().map(|&p| dims[p]).collect(),
            src_strides: perm.iter().map(|&p| s[p]).collect(),
            len,
        })
    }

    /// The source index of every output element, in row-major order of the output (checked
    /// against the allocation cap first).
    pub fn source_indices(&self) -> Result<Vec<usize>> {
        gather_indices("permute", &self.out, &self.src_strides, self.len)
    }
}

/// Source offsets of a strided gather over `dims`, in row-major order of `dims`.
fn gather_indices(
    op: &'static str,
    dims: &[usize],
    src_strides: &[usize],
    len: usize,
) -> Result<Vec<usize>> {
    let rank = dims.len();
    let mut out = tl_spec::alloc::try_with_capacity(op, "source indices", len)?;
    let mut counter: Dims = SmallVec::from_elem(0, rank);
    let mut src = 0usize;
    for _ in 0..len {
        out.push(src);
        for k in (0..rank).rev() {
            counter[k] += 1;
            src += src_strides[k];
            if counter[k] < dims[k] {
                break;
            }
            src -= src_strides[k] * counter[k];
            counter[k] = 0;
        }
    }
    Ok(out)
}

/// Checked operand lengths of a (batched) product: `(a_len, b_len, out_len)` per batch entry.
pub fn gemm_lens(op: &'static str, a: Buffer, b: Buffer, bt: Batch, g: Gemm) -> Result<[usize; 3]> {
    for (what, d) in [("batch", bt.count), ("m", g.m), ("k", g.k), ("n", g.n)] {
        abi::to_u32(op, what, d)?;
    }
    let per = [
        product(op, &[g.m, g.k])?,
        product(op, &[g.k, g.n])?,
        product(op, &[g.m, g.n])?,
    ];
    let total = [
        product(op, &[bt.matrices(0), per[0]])?,
        product(op, &[bt.matrices(1), per[1]])?,
        product(op, &[bt.count, per[2]])?,
    ];
    abi::len_u32(op, total[2])?;
    len_is(op, "left operand", a, total[0])?;
    len_is(op, "right operand", b, total[1])?;
    Ok(per)
}

/// A batched product's layout: at least one head, and whole groups of heads; grouped operands
/// head-merged, their `kv_heads` at least 1 and dividing `heads`.
pub fn batch(op: &'static str, bt: Batch) -> Result<()> {
    abi::to_u32(op, "heads", bt.heads)?;
    abi::to_u32(op, "kv_heads", bt.kv_heads)?;
    if bt.heads == 0 || !bt.count.is_multiple_of(bt.heads) {
        return Err(Error::kernel(
            op,
            format!(
                "{} products are not whole groups of {} heads",
                bt.count, bt.heads
            ),
        ));
    }
    if bt.grouped.contains(&true)
        && (bt.kv_heads == 0
            || !bt.heads.is_multiple_of(bt.kv_heads)
            || (0..2).any(|w| bt.grouped[w] && !bt.merged[w]))
    {
        return Err(Error::kernel(
            op,
            format!(
                "grouped operands {:?} must be head-merged (merged {:?}) and their kv_heads = {} \
                 ≥ 1 must divide heads = {}",
                bt.grouped, bt.merged, bt.kv_heads, bt.heads
            ),
        ));
    }
    Ok(())
}

/// Checked dims of a row kernel: `rows · cols` must be `x`'s length.
pub fn rows_cols(op: &'static str, x: Buffer, rows: usize, cols: usize) -> Result<()> {
    abi::to_u32(op, "rows", rows)?;
    abi::to_u32(op, "cols", cols)?;
    len_is(op, "input", x, product(op, &[rows, cols])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_plan_follows_numpy_rules() {
        let p = BroadcastPlan::new("broadcast", &[2, 1], &[3, 2, 2]).unwrap();
        assert_eq!(
            p.source_indices().unwrap(),
            vec![0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
        );
        assert!(BroadcastPlan::new("broadcast", &[], &[2, 2]).is_ok());
        let e = BroadcastPlan::new("broadcast", &[2], &[2, 3])
            .unwrap_err()
            .to_string();
        assert!(e.contains("broadcast") && e.contains("[2, 3]"), "{e}");
    }

    #[test]
    fn permute_plan_rejects_non_permutations_and_high_rank() {
        let p = PermutePlan::new("permute", &[2, 3], &[1, 0]).unwrap();
        assert_eq!(p.source_indices().unwrap(), vec![0, 3, 1, 4, 2, 5]);
        assert!(PermutePlan::new("permute", &[2, 3], &[0, 0]).is_err());
        assert!(PermutePlan::new("permute", &[2, 3], &[0, 2]).is_err());
        assert!(PermutePlan::new("permute", &[2, 3], &[0]).is_err());
        let nine = [1usize; 9];
        let perm: Vec<usize> = (0..9).collect();
        let e = PermutePlan::new("permute", &nine, &perm)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 9"), "{e}");
    }
}
