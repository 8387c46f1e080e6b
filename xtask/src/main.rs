//! `cargo xtask <subcommand>`: project automation, std only so it builds in a second.
//!
//! - [`coverage`]: the op × check table of the verification harness.
//! - [`kernels`]: `kernels/*.cu` → `kernels/ptx/*.ptx` with the pinned pip nvcc, and the
//!   `--check` that needs no nvcc (hash manifest, PTX ISA version).
//! - [`stub`]: a stub `libcuda.so` so `--features cuda` links (and GPU tests skip) without a GPU.
//! - [`nccl_stub`]: a one-rank stub NCCL so the NCCL path runs (on the kernel emulator) in CI.
//! - [`bundle`]: stripped GPU test binaries plus a `run.sh` for the GPU machine.
//! - [`mutants`]: planted single-point bugs, one at a time, against the harness.
//! - [`readme`]: every command of the README's tour, run (or skipped by a marker that says why).

mod bundle;
mod coverage;
mod doc_tables;
mod kernels;
mod mutants;
mod nccl_stub;
mod readme;
mod stub;
mod util;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <subcommand> [args]

subcommands:
  coverage [--release] [--cases N] [--seed S] [--only OP]...
      run every harness check for every op (tl-verify --coverage ..., as
      cargo test --workspace [--release] builds it); fails if any cell fails or an
      applicable cell ran zero cases
  kernels
      build kernels/*.cu to kernels/ptx/<name>.ptx (and the worked example's
      crates/tl-nn/examples/custom_op/gelu_erf.cu next to it) with nvcc 13.0
      (pip-installed into target/nvcc if missing) and write each set's MANIFEST
  kernels --check
      fail if a .cu changed since its PTX was generated (MANIFEST hash) or a PTX file
      declares .version > 9.0; needs no nvcc
  cuda-stub
      build target/cuda-stub/lib64/libcuda.so (SONAME libcuda.so.1; every cu* symbol
      returns CUDA_ERROR_NO_DEVICE) and print the env vars that use it
  nccl-stub
      build target/nccl-stub/libnccl-stub.so (a one-rank NCCL: copies send to receive;
      several ranks are refused) and print the TL_NCCL_LIBRARY line that loads it
  gpu-bundle
      build the stub, the --features cuda test binaries in release, and gather them,
      stripped, with run.sh into gpu-bundle/ for a GPU machine
  mutants [--list] [--check] [--only ID|AREA]... [--cases N] [--timeout S]
      plant each bug of xtask/src/mutants/catalogue.rs in turn, run the harness
      (tl-conformance; with cuda-emu for kernels), restore; report caught / missed
  readme [--features F] [--list]
      run every command of README.md's tour on the dev-profile test build (those whose
      features are all in F; with no F, those without features); `# ci: skip, <why>`
      above a command skips it; fails on the first non-zero exit";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(sub) = args.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest: Vec<String> = args.collect();
    let result = match sub.as_str() {
        "coverage" => return coverage::run(&rest),
        "mutants" => return mutants::run(&rest),
        "readme" => return readme::run(&rest),
        "kernels" => match rest.as_slice() {
            [] => kernels::build(),
            [flag] if flag == "--check" => kernels::check(),
            _ => Err(format!("kernels: unexpected arguments {rest:?}\n\n{USAGE}")),
        },
        "cuda-stub" => stub::build().map(|env| {
            println!("{env}");
        }),
        "nccl-stub" => nccl_stub::build().map(|env| {
            println!("{env}");
        }),
        "gpu-bundle" => bundle::build(),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => Err(format!("unknown subcommand {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {sub}: {e}");
            ExitCode::FAILURE
        }
    }
}
