//! Checked conversions at the kernel ABI.
//!
//! Kernels take element counts and dims as `u32` ("Checked Nat → UInt32 conversion
//! for CUDA boundaries. Errors if n ≥ 2^32"). Every launch, on the simulation device as on the
//! real one, converts through here first, so a count of 2^32 or more is an
//! [`Error::U32Overflow`] naming the primitive, never a wrapped (and silently wrong) launch.

use crate::{Error, Result};

/// `n` as a `u32`, or [`Error::U32Overflow`] naming `op` and `what` when `n ≥ 2^32`.
pub fn to_u32(op: &'static str, what: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::U32Overflow {
        op,
        what,
        value: n as u64,
    })
}

/// The element count `n` of a launch, checked for the `u32` ABI.
pub fn len_u32(op: &'static str, n: usize) -> Result<u32> {
    to_u32(op, "element count", n)
}

/// Every dim of a shape, checked for the `u32` ABI (the element count is checked separately).
pub fn dims_u32(op: &'static str, dims: &[usize]) -> Result<Vec<u32>> {
    dims.iter().map(|&d| to_u32(op, "dim", d)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_below_two_to_the_32_pass_through() {
        assert_eq!(len_u32("add", 0).unwrap(), 0);
        assert_eq!(len_u32("add", (1 << 32) - 1).unwrap(), u32::MAX);
        assert_eq!(dims_u32("permute", &[2, 3]).unwrap(), vec![2, 3]);
    }

    #[test]
    fn two_to_the_32_is_an_error_not_a_wrap() {
        let e = len_u32("reduce_sum", 1 << 32).unwrap_err();
        assert_eq!(
            e,
            Error::U32Overflow {
                op: "reduce_sum",
                what: "element count",
                value: 1 << 32
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("reduce_sum") && msg.contains("4294967296"),
            "{msg}"
        );
        assert!(dims_u32("permute", &[3, (1 << 32) + 5]).is_err());
    }
}
