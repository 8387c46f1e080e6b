//! The CUDA tape's error type: every message names the op (or API call) and the shapes or
//! lengths involved. Library code returns these; it does not panic on bad input.

use tl_spec::Shape;

/// Result alias of the CUDA tape.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong on the CUDA tape or its device layer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An op's shape rule or parameter check rejected its operands (names the op and shapes).
    /// Boxed, like the shapes below, to keep `Result`s small.
    #[error(transparent)]
    Ir(Box<tl_ir::Error>),
    /// An id that does not name a node of the tape.
    #[error("{what}: unknown id {id} (the tape has {len} nodes)")]
    UnknownId {
        /// The API call or op that referenced the id.
        what: String,
        /// The bad id.
        id: usize,
        /// How many nodes exist.
        len: usize,
    },
    /// A node whose value was released ([`crate::CudaTape::release`]) was read or used as an
    /// operand.
    #[error(
        "{what}: the value of node {id} ({op}) was released: no handle to it was left and no backward reads it"
    )]
    ReleasedValue {
        /// The API call or op that read it.
        what: String,
        /// The node.
        id: usize,
        /// The op that produced it.
        op: String,
    },
    /// A buffer given or expected for an id has the wrong shape (value reads, seeds, gradients).
    #[error("{what}: id {id} has shape {expected}, got {got}")]
    Shape {
        /// The API call or op.
        what: String,
        /// The id concerned.
        id: usize,
        /// The id's shape on the tape.
        expected: Box<Shape>,
        /// The shape given or produced.
        got: Box<Shape>,
    },
    /// A count (of gradients, of nodes, of elements for a shape) does not match.
    #[error("{what}: expected {expected}, got {got}")]
    Count {
        /// The API call or op.
        what: String,
        /// The expected count.
        expected: usize,
        /// The count given.
        got: usize,
    },
    /// A device primitive rejected its arguments (lengths that disagree, a bad permutation,
    /// a rank above the kernel limit, ...).
    #[error("{op}: {detail}")]
    Kernel {
        /// The primitive (kernel) name, e.g. `add` or `permute`.
        op: &'static str,
        /// What was wrong, with the lengths or dims involved.
        detail: String,
    },
    /// A buffer handle was used after its allocation was released.
    #[error("{op}: buffer #{buffer} (len {len}) was already released")]
    Released {
        /// The primitive that was given the handle.
        op: &'static str,
        /// The buffer's id.
        buffer: u64,
        /// The buffer's element count.
        len: usize,
    },
    /// An element count (or dim) does not fit the kernel ABI's `u32`: it is an error, never a
    /// silent wrap.
    #[error("{op}: {what} = {value} does not fit in u32 (the kernel ABI limit is {max})", max = u32::MAX)]
    U32Overflow {
        /// The primitive whose launch was refused.
        op: &'static str,
        /// Which quantity (e.g. `element count`).
        what: &'static str,
        /// The value that does not fit.
        value: u64,
    },
    /// A scalar type without a float32 wire format was uploaded to (or read from) the device.
    #[error(
        "{op}: scalar type {scalar} has no float32 wire format (only f32 and f64 can live on the CUDA tape)"
    )]
    NoWireFormat {
        /// The API call (`upload`, `download`).
        op: &'static str,
        /// The scalar type's name (`Scalar::NAME`).
        scalar: &'static str,
    },
    /// The device (or its memory limit) cannot satisfy an allocation, even after the allocator
    /// returned every cached block.
    #[error(
        "{op}: out of device memory: requested {requested} bytes with {in_use} in use (limit {limit})"
    )]
    OutOfMemory {
        /// The primitive that needed the memory.
        op: &'static str,
        /// Bytes requested (rounded to the size class).
        requested: usize,
        /// Bytes the device already holds.
        in_use: usize,
        /// The device's limit.
        limit: usize,
    },
    /// No CUDA device can be used: the driver reports none (or is the stub of
    /// `cargo xtask cuda-stub`). Tests that need a GPU skip on this error.
    #[error("no CUDA device: {detail}")]
    NoDevice {
        /// What the driver said (cust's error, formatted with `{:?}`).
        detail: String,
    },
    /// A CUDA driver call failed (the driver's error code, formatted with `{:?}`).
    #[error("{op}: CUDA driver error {detail}")]
    Driver {
        /// The primitive or driver step (`init`, `module load`, `launch tl_add`, ...).
        op: &'static str,
        /// The driver's error code.
        detail: String,
    },
    /// The kernel emulator (feature `cuda-emu`) refused a launch, a copy or a kernel name:
    /// what a GPU would show as garbage or a crash (a write past an allocation, arguments the
    /// kernel does not take, a barrier not every thread reaches, ...), or what a driver call
    /// would refuse.
    #[error("{op}: kernel emulator: {detail}")]
    Emulator {
        /// The primitive, kernel or step (`upload`, `download`).
        op: &'static str,
        /// What the emulator found.
        detail: String,
    },
    /// NCCL could not be loaded, or one of its calls failed (features `cuda`, `cuda-emu`: the
    /// `nccl` module): names the call, NCCL's code and message, and the library.
    #[error("{call}: NCCL: {detail}")]
    Nccl {
        /// The NCCL call (`ncclAllReduce`, ...) or step (`load NCCL`).
        call: &'static str,
        /// What went wrong: NCCL's result code and `ncclGetErrorString`, or the loader's error.
        detail: String,
    },
    /// The op exists in the catalogue (IR, spec, CPU tape) but has no CUDA formula yet.
    #[error("{op}: not implemented on the CUDA tape yet (it runs on the CPU tape and the IR)")]
    Unsupported {
        /// The op's name.
        op: &'static str,
    },
}

impl Error {
    /// A [`Error::Kernel`] error for primitive `op`.
    pub fn kernel(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Kernel {
            op,
            detail: detail.into(),
        }
    }

    /// A [`Error::Shape`] error.
    pub fn shape(what: impl Into<String>, id: usize, expected: &Shape, got: &Shape) -> Self {
        Error::Shape {
            what: what.into(),
            id,
            expected: Box::new(expected.clone()),
            got: Box::new(got.clone()),
        }
    }
}

impl From<tl_ir::Error> for Error {
    fn from(e: tl_ir::Error) -> Self {
        Error::Ir(Box::new(e))
    }
}

impl From<tl_spec::Error> for Error {
    fn from(e: tl_spec::Error) -> Self {
        tl_ir::Error::Spec(e).into()
    }
}
