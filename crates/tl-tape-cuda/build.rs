//! With feature `cuda-emu` only: compile the kernel sources `kernels/*.cu` (unchanged but for a
//! call after each static `__shared__` declaration that poisons it each block) for the host
//! with the emulator runtime (docs/cuda.md, "The kernel emulator"), into a static library
//! that `src/device/cuda/emu.rs` calls; and the tests' user kernels
//! (`tests/user_kernels/*.cu`) into a library of their own, as a user's `build.rs` would
//! (docs/cuda.md, "Your own kernels").
//!
//! The work is tl-cuda-build's `Emulator`: each source in its own translation unit and
//! namespace, followed by a table of its kernels, whose names come from the committed PTX
//! (`.visible .entry NAME(`), the same list the CUDA driver resolves names in;
//! `cargo xtask kernels --check` keeps PTX and sources in step.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda-emu")]
    if let Err(e) = emu() {
        eprintln!("error: building the kernel emulator: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "cuda-emu")]
fn emu() -> Result<(), tl_cuda_build::Error> {
    use std::path::PathBuf;
    use tl_cuda_build::{Emulator, Kernels};

    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let kernels = manifest.join("../../kernels");
    let set = Kernels::in_dir(&kernels)?;
    set.rerun_if_changed();
    if set.sources().is_empty() {
        return Err(tl_cuda_build::Error::new(format!(
            "no .cu sources in {}",
            kernels.display()
        )));
    }
    // The project's kernels, then the emulator's self-test kernels (deliberately broken ones,
    // shown caught by the unit tests of device/cuda/emu.rs), with the runtime.
    Emulator::new("tl_cuda_emu")
        .kernels(&set)?
        .source(kernels.join("emu/selftest.cu"))?
        .with_runtime()
        .compile()?;

    // The tests' user kernels (tests/tl_tape_cuda/user_kernels.rs), built as a user's crate
    // builds its own: a library whose table the tests name with `emu_kernels!`.
    let user = manifest.join("tests/user_kernels");
    Emulator::new("tl_test_user_kernels")
        .source(user.join("scale2.cu"))?
        .source(user.join("scale2_wrong.cu"))?
        .source(user.join("named_like_ours.cu"))?
        .source(user.join("block_reverse.cu"))?
        .source(user.join("builtins.cu"))?
        .source(user.join("shifted.cu"))?
        .source(user.join("blocks3d.cu"))?
        .source(user.join("shared_unwritten.cu"))?
        .source(user.join("shared_declarators.cu"))?
        .source(user.join("shared_namespace.cu"))?
        .source(user.join("shared_header.cu"))?
        .source(user.join("shared_switch.cu"))?
        .compile()
}
