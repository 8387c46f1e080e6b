//! `cargo xtask kernels [--check]`: CUDA C → PTX with the pinned nvcc, and the check CI runs,
//! over the kernel sets of this repository. The pipeline itself is the library
//! `tl-cuda-build` (crates/tl-cuda-build), which tl-tape-cuda's `build.rs` and a user's
//! `build.rs` call too.
//!
//! nvcc comes from pip, pinned to 13.0 (DESIGN.md "CUDA": PTX ISA 9.0 is what driver 580 JITs),
//! installed on demand into `target/nvcc/site-packages` (git-ignored with the rest of
//! `target/`). The sets:
//! - `kernels/`: every `kernels/*.cu`, hashed with every `kernels/*.cuh`; PTX and MANIFEST in
//!   `kernels/ptx/`;
//! - the worked example's kernel, `crates/tl-nn/examples/custom_op/gelu_erf.cu`, with its PTX
//!   and MANIFEST next to it.

use tl_cuda_build::{Kernels, Nvcc};

use crate::util;

/// Every kernel set of the repository, with a name for messages.
fn sets() -> Result<Vec<(&'static str, Kernels)>, String> {
    let root = util::root();
    let project = Kernels::in_dir(root.join("kernels")).map_err(|e| e.to_string())?;
    let example = root.join("crates/tl-nn/examples/custom_op");
    let gelu = Kernels::new(&example).source(example.join("gelu_erf.cu"));
    Ok(vec![("kernels/", project), ("examples/custom_op/", gelu)])
}

/// `cargo xtask kernels`: every set's stale sources to PTX (current ones kept), then each set's
/// manifest.
pub fn build() -> Result<(), String> {
    let site = util::root().join("target/nvcc/site-packages");
    let nvcc = Nvcc::install_pinned(&site).map_err(|e| e.to_string())?;
    for (name, set) in sets()? {
        let written = set
            .generate_ptx(&nvcc)
            .map_err(|e| format!("{name}: {e}"))?;
        eprintln!(
            "{name}: {} PTX file(s) compiled, {} current and kept; {}",
            written.len(),
            set.sources().len() - written.len(),
            set.manifest_path().display()
        );
    }
    Ok(())
}

/// `cargo xtask kernels --check`: in every set, sources, PTX and manifest agree; every PTX
/// declares ISA ≤ 9.0. Needs no nvcc.
pub fn check() -> Result<(), String> {
    let mut problems = Vec::new();
    for (name, set) in sets()? {
        match set.check() {
            Ok(n) => println!("kernels --check: {name}: {n} source(s), PTX up to date"),
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}\nregenerate with `cargo xtask kernels` and commit the PTX and MANIFEST",
            problems.join("\n")
        ))
    }
}
