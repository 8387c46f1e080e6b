//! Buffer handles ([`Buffer`]) and the dims of a matrix product ([`Gemm`]), the plain data
//! every [`Device`](super::Device) primitive takes.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A handle to a float32 device buffer of `len` elements.
///
/// Ids are unique in the process, so a handle from one device is never mistaken for a buffer of
/// another: it is reported as not live there.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer {
    id: u64,
    len: usize,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Buffer {
    /// A handle with a fresh id, for a device that has just allocated `len` elements.
    pub(crate) fn fresh(len: usize) -> Buffer {
        Buffer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            len,
        }
    }

    /// The buffer's process-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Number of float32 elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of data (`4 · len`).
    pub fn bytes(&self) -> usize {
        self.len * 4
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}[{}]", self.id, self.len)
    }
}

/// Dims of one matrix product `op(a) · op(b)` with `op(a)` of shape (m, k) and `op(b)` of shape
/// (k, n). With `ta`, `a` is stored (k, m) and read transposed; with `tb`, `b` is stored (n, k).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of the result.
    pub m: usize,
    /// The contracted dim.
    pub k: usize,
    /// Columns of the result.
    pub n: usize,
    /// Read `a` transposed.
    pub ta: bool,
    /// Read `b` transposed.
    pub tb: bool,
}

impl Gemm {
    /// `(m, k) · (k, n)`, no transposes.
    pub fn nn(m: usize, k: usize, n: usize) -> Gemm {
        Gemm {
            m,
            k,
            n,
            ta: false,
            tb: false,
        }
    }

    /// The same product with the transpose flags set.
    pub fn with_t(self, ta: bool, tb: bool) -> Gemm {
        Gemm { ta, tb, ..self }
    }
}
