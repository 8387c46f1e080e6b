//! `cargo xtask nccl-stub`: a one-rank stand-in for NCCL, so the NCCL path of tl-tape-cuda
//! (`nccl` module) and tl-nn (`dist::Nccl`) runs in CI without a GPU or NCCL.
//!
//! The C source is `nccl_stub.c` beside this file (embedded): the calls the `nccl` module loads,
//! with nccl.h's signatures, for one rank (an all-reduce or a broadcast copies send to receive;
//! more than one rank is `ncclInvalidUsage` with a message saying that the real library is
//! needed; with `TL_NCCL_STUB_HANG=k` set, a communicator's collectives after the first k never
//! finish: a lost rank, for the tests of the collectives' timeout). gcc builds it as `target/nccl-stub/libnccl-stub.so`; the command prints the
//! `export TL_NCCL_LIBRARY=…` line that makes `Nccl::load` open it. NCCL is loaded at run time,
//! so nothing links against the stub, and it is never on the loader's path.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use crate::util;

/// The stub's C source.
const SOURCE: &str = include_str!("nccl_stub.c");

/// The stub library's path.
pub fn library() -> PathBuf {
    util::root().join("target/nccl-stub/libnccl-stub.so")
}

/// Build the stub; returns the line of the env var to print.
pub fn build() -> Result<String, String> {
    let lib = library();
    let dir = lib
        .parent()
        .ok_or_else(|| format!("{} has no parent", lib.display()))?;
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let c_path = dir.join("nccl_stub.c");
    fs::write(&c_path, SOURCE).map_err(|e| format!("{}: {e}", c_path.display()))?;
    // Built beside, then renamed: a program loading the old stub never sees half a file.
    let tmp = dir.join(format!(".libnccl-stub.so.{}", std::process::id()));
    util::status(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&tmp)
            .arg(&c_path),
    )?;
    fs::rename(&tmp, &lib).map_err(|e| format!("{} -> {}: {e}", tmp.display(), lib.display()))?;
    eprintln!("nccl-stub: one-rank NCCL -> {}", lib.display());
    Ok(env_line(&lib))
}

/// The env var that makes `Nccl::load` open the stub.
fn env_line(lib: &std::path::Path) -> String {
    format!("export TL_NCCL_LIBRARY={}", lib.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stub_defines_every_call_the_nccl_module_loads() {
        // The names of the module's `sym!("ncclX", ..)` lines: every symbol it resolves.
        const MODULE: &str = include_str!("../../crates/tl-tape-cuda/src/device/cuda/nccl.rs");
        let calls: Vec<&str> = MODULE
            .split("sym!(\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .filter(|name| name.starts_with("nccl"))
            .collect();
        assert!(calls.len() >= 9, "{calls:?}");
        for call in calls {
            assert!(
                SOURCE.contains(&format!("int {call}(")) || SOURCE.contains(&format!("*{call}(")),
                "{call}"
            );
        }
        assert_eq!(
            env_line(std::path::Path::new("/r/target/nccl-stub/libnccl-stub.so")),
            "export TL_NCCL_LIBRARY=/r/target/nccl-stub/libnccl-stub.so"
        );
    }
}
