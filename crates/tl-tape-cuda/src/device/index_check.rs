//! Argument checks and host-side plans of the index primitives, shared by both devices so that
//! they reject the same inputs with the same errors and walk indices in the same order.
//!
//! Gathers are totalized (SEMANTICS.md "Indexing"): an index ≥ rows is not an error, it is
//! mapped to `rows`, the marker every kernel tests (`idx < rows`) before reading or writing.

use super::{Buffer, check};
use crate::{Error, Result, abi};

/// Checked dims of a gather/scatter over (rows, cols) with `idx.len()` indices; returns the
/// indices as `u32`, each one ≥ rows mapped to `rows`.
pub fn row_indices(op: &'static str, rows: usize, cols: usize, idx: &[usize]) -> Result<Vec<u32>> {
    let marker = abi::to_u32(op, "rows", rows)?;
    abi::to_u32(op, "cols", cols)?;
    abi::len_u32(op, idx.len())?;
    abi::len_u32(op, check::product(op, &[rows, cols])?)?;
    abi::len_u32(op, check::product(op, &[idx.len(), cols])?)?;
    Ok(idx
        .iter()
        .map(|&i| if i < rows { i as u32 } else { marker })
        .collect())
}

/// The fixed order of a scatter-add into `rows` rows: the source rows that target row `j` are
/// `order[offsets[j]..offsets[j + 1]]`, in increasing source order (a stable counting sort;
/// indices ≥ rows appear nowhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScatterPlan {
    /// `rows + 1` offsets into `order`.
    pub offsets: Vec<u32>,
    /// Source rows grouped by target row.
    pub order: Vec<u32>,
}

impl ScatterPlan {
    /// The plan of `idx` (as [`row_indices`] returns it) into `rows` rows.
    pub fn new(rows: usize, idx: &[u32]) -> ScatterPlan {
        let mut offsets = vec![0u32; rows + 1];
        for &i in idx {
            if (i as usize) < rows {
                offsets[i as usize + 1] += 1;
            }
        }
        for j in 0..rows {
            offsets[j + 1] += offsets[j];
        }
        let mut next = offsets.clone();
        let mut order = vec![0u32; offsets[rows] as usize];
        for (r, &i) in idx.iter().enumerate() {
            if (i as usize) < rows {
                let slot = &mut next[i as usize];
                order[*slot as usize] = r as u32;
                *slot += 1;
            }
        }
        ScatterPlan { offsets, order }
    }

    /// The source rows that target row `j`, in order.
    pub fn sources(&self, j: usize) -> &[u32] {
        &self.order[self.offsets[j] as usize..self.offsets[j + 1] as usize]
    }
}

/// `start..start + len` lies inside `b` (and within the `u32` ABI).
pub fn range(op: &'static str, what: &str, b: Buffer, start: usize, len: usize) -> Result<()> {
    fits(op, what, start, len, b.len())
}

/// `start..start + len` lies inside `0..total` (and `total` within the `u32` ABI).
pub fn fits(op: &'static str, what: &str, start: usize, len: usize, total: usize) -> Result<()> {
    abi::len_u32(op, total)?;
    match start.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(Error::kernel(
            op,
            format!("range {start}..{start}+{len} is outside the {what} of {total} element(s)"),
        )),
    }
}

/// The length of `a` followed by `b`, within the `u32` ABI.
pub fn concat_len(op: &'static str, a: Buffer, b: Buffer) -> Result<usize> {
    let n = a
        .len()
        .checked_add(b.len())
        .ok_or_else(|| Error::kernel(op, "length overflows"))?;
    abi::len_u32(op, n)?;
    Ok(n)
}

/// Checked dims of a cross-entropy row kernel: `x` is (rows, cols), one label per row; returns
/// the labels as `u32`, each one ≥ cols mapped to `cols` (a row that contributes nothing).
pub fn labels(
    op: &'static str,
    x: Buffer,
    rows: usize,
    cols: usize,
    labels: &[usize],
) -> Result<Vec<u32>> {
    check::rows_cols(op, x, rows, cols)?;
    if labels.len() != rows {
        return Err(Error::kernel(
            op,
            format!("{} label(s) for {rows} row(s)", labels.len()),
        ));
    }
    let marker = cols as u32;
    Ok(labels
        .iter()
        .map(|&l| if l < cols { l as u32 } else { marker })
        .collect())
}

/// Checked dims of a cross-entropy row kernel reading its labels from a device buffer
/// (`Device::upload_labels`): `x` is (rows, cols) and `labels` holds one element per row.
pub fn label_buffer(
    op: &'static str,
    x: Buffer,
    rows: usize,
    cols: usize,
    labels: Buffer,
) -> Result<()> {
    check::rows_cols(op, x, rows, cols)?;
    check::len_is(op, "labels", labels, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_plan_groups_sources_by_target_in_order() {
        // idx = [2, 0, 2, 5 (out of range → 3), 0] into 3 rows.
        let idx = row_indices("t", 3, 1, &[2, 0, 2, 5, 0]).unwrap();
        assert_eq!(idx, vec![2, 0, 2, 3, 0]);
        let p = ScatterPlan::new(3, &idx);
        assert_eq!(p.offsets, vec![0, 2, 2, 4]);
        assert_eq!(p.sources(0), &[1, 4]);
        assert_eq!(p.sources(1), &[] as &[u32]);
        assert_eq!(p.sources(2), &[0, 2]);
    }

    #[test]
    fn ranges_outside_the_operand_are_errors() {
        let b = Buffer::fresh(5);
        assert!(range("copy_range", "input", b, 2, 3).is_ok());
        let e = range("copy_range", "input", b, 3, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("copy_range") && e.contains("5 element"), "{e}");
        assert!(range("copy_range", "input", b, usize::MAX, 2).is_err());
    }
}
