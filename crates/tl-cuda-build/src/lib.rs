//! The CUDA kernel pipeline of torchlean-rs as a library, for a `build.rs` or an xtask: the
//! same code builds the project's `kernels/*.cu` (`cargo xtask kernels [--check]`,
//! tl-tape-cuda's `build.rs`) and a user's own `.cu` files.
//!
//! - [`Nvcc`]: the pinned nvcc 13.0 (pip wheels [`PIP_PINS`]), CUDA C → PTX with
//!   [`NVCC_FLAGS`] (`-ptx -arch=compute_80 --fmad=false -O3 -std=c++17`);
//! - [`Kernels`]: a set of sources with their committed PTX and a hash `MANIFEST`:
//!   [`Kernels::generate_ptx`] (needs nvcc) and [`Kernels::check`] (no nvcc: a source changed
//!   without regenerating, a PTX edited by hand, a PTX ISA above [`MAX_PTX_VERSION`] = 9.0,
//!   which driver 580 would refuse);
//! - [`Emulator`]: the host build of `.cu` files for tl-tape-cuda's kernel emulator (feature
//!   `cuda-emu`), one static library with its own kernel table, which the user's crate hands to
//!   the emulator with `tl_tape_cuda::emu_kernels!`.
//!
//! PTX is generated once, committed, and embedded with `include_str!`, so no build needs nvcc;
//! a GPU machine's driver JITs it. docs/cuda.md, "Your own kernels", has the whole path.
//!
//! # A user's `build.rs`
//!
//! ```no_run
//! // build.rs of a crate with `my_ops.cu` and its committed `my_ops.ptx` + `MANIFEST` in
//! // `kernels/`, and a feature `cuda-emu` that forwards to `tl-tape-cuda/cuda-emu`.
//! use tl_cuda_build::{Emulator, Kernels, Nvcc};
//!
//! fn main() -> Result<(), tl_cuda_build::Error> {
//!     let set = Kernels::new("kernels").source("kernels/my_ops.cu");
//!     set.rerun_if_changed();
//!     // With TL_NVCC=<nvcc 13.0> set, regenerate the PTX; then the committed PTX must match
//!     // the source (hash manifest) and declare PTX ISA <= 9.0.
//!     if let Some(nvcc) = Nvcc::from_env() {
//!         set.generate_ptx(&nvcc?)?;
//!     }
//!     set.check()?;
//!     // The kernel emulator: the same .cu for the host, as the static library `my_ops`
//!     // (its table: `tl_emu_table_my_ops`, named in Rust by `tl_tape_cuda::emu_kernels!(my_ops)`).
//!     if std::env::var_os("CARGO_FEATURE_CUDA_EMU").is_some() {
//!         Emulator::new("my_ops").kernels(&set)?.compile()?;
//!     }
//!     Ok(())
//! }
//! ```

mod copies;
mod emu;
mod hash;
mod kernels;
mod nvcc;
mod ptx;
mod shared;

pub use emu::{CUDA_EMU_H, Emulator, RUNTIME_CPP};
pub use hash::{fnv1a64, hex};
pub use kernels::Kernels;
pub use nvcc::{NVCC_FLAGS, Nvcc, PIP_PINS, RELEASE, bin_in};
pub use ptx::{MAX_PTX_VERSION, check_version, entries, source_entries, version};

/// What went wrong, in one message naming the file, the kernel or the tool. Its `Debug` is the
/// message itself, so a build script's `fn main() -> Result<(), tl_cuda_build::Error>` prints
/// it as written (lines and quotes unescaped).
#[derive(Clone, PartialEq, Eq)]
pub struct Error(String);

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error {
    /// An error with message `msg`.
    pub fn new(msg: impl Into<String>) -> Self {
        Error(msg.into())
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}
