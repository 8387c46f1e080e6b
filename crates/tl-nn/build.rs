//! With feature `cuda-emu` only: the worked example's kernel file
//! (`examples/custom_op/gelu_erf.cu`) compiled for tl-tape-cuda's kernel emulator, as a user's
//! crate builds its own (docs/cuda.md, "Your own kernels"): its committed PTX checked against
//! the source and for PTX ISA <= 9.0, then the static library `tl_nn_gelu_erf`, whose table
//! `examples/custom_op/kernel.rs` names with `tl_tape_cuda::emu_kernels!(tl_nn_gelu_erf)`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda-emu")]
    if let Err(e) = emu() {
        eprintln!("error: the custom_op example's kernel: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "cuda-emu")]
fn emu() -> Result<(), tl_cuda_build::Error> {
    use tl_cuda_build::{Emulator, Kernels};

    let dir = "examples/custom_op";
    let set = Kernels::new(dir).source(format!("{dir}/gelu_erf.cu"));
    set.rerun_if_changed();
    set.check()?;
    Emulator::new("tl_nn_gelu_erf").kernels(&set)?.compile()
}
