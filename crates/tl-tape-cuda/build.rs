//! With feature `cuda-emu` only: compile the kernel sources `kernels/<family>.cu`, unchanged,
//! for the host with g++ and the emulator runtime of `kernels/emu/` (docs/cuda.md, "The kernel
//! emulator"), into a static library that `src/device/cuda/emu.rs` calls.
//!
//! Each family is compiled in its own translation unit and namespace (the families' helpers may
//! share names, as they may in separate CUDA modules), followed by a table of its kernels. The
//! kernel names come from the family's committed PTX (`.visible .entry NAME(`), the same list
//! the CUDA driver resolves names in; `cargo xtask kernels --check` keeps PTX and sources in
//! step.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda-emu")]
    if let Err(e) = emu::build() {
        eprintln!("error: building the kernel emulator: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "cuda-emu")]
mod emu {
    use std::env;
    use std::fmt::Write as _;
    use std::fs;
    use std::path::{Path, PathBuf};

    /// The kernel names of one family's PTX, in file order.
    fn entries(ptx: &str) -> Vec<&str> {
        ptx.lines()
            .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
            .filter_map(|rest| rest.split('(').next())
            .map(str::trim)
            .collect()
    }

    pub fn build() -> Result<(), String> {
        let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
        let kernels = manifest.join("../../kernels");
        let kernels = kernels
            .canonicalize()
            .map_err(|e| format!("{}: {e}", kernels.display()))?;
        let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
        println!("cargo:rerun-if-changed={}", kernels.display());

        let mut families: Vec<String> = fs::read_dir(&kernels)
            .map_err(|e| format!("{}: {e}", kernels.display()))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".cu").map(str::to_owned)
            })
            .collect();
        families.sort();
        if families.is_empty() {
            return Err(format!("no .cu sources in {}", kernels.display()));
        }

        let mut build = cc::Build::new();
        build
            .cpp(true)
            .std("c++17")
            .opt_level(2)
            // nvcc builds the PTX with --fmad=false: no contraction of a*b + c here either.
            .flag("-ffp-contract=off")
            .flag("-fno-fast-math")
            // TL_GEO_PARAMS is one parameter list shared by kernels that read part of it.
            .flag("-Wno-unused-parameter")
            .include(kernels.join("emu"))
            .include(&kernels)
            .file(kernels.join("emu/runtime.cpp"));
        // (family, source, kernel names): every kernels/<family>.cu, with the names its PTX
        // lists, then the emulator's self-test kernels (no PTX: names read from the source).
        let mut units: Vec<(String, PathBuf, Vec<String>)> = Vec::new();
        for fam in &families {
            let ptx_path = kernels.join("ptx").join(format!("{fam}.ptx"));
            let ptx = fs::read_to_string(&ptx_path)
                .map_err(|e| format!("{}: {e} (run `cargo xtask kernels`)", ptx_path.display()))?;
            let names: Vec<String> = entries(&ptx).into_iter().map(str::to_owned).collect();
            if names.is_empty() {
                return Err(format!("{} lists no kernel", ptx_path.display()));
            }
            units.push((fam.clone(), kernels.join(format!("{fam}.cu")), names));
        }
        let selftest = kernels.join("emu/selftest.cu");
        let src =
            fs::read_to_string(&selftest).map_err(|e| format!("{}: {e}", selftest.display()))?;
        let names = src
            .lines()
            .filter_map(|l| l.strip_prefix("extern \"C\" __global__ void "))
            .filter_map(|rest| rest.split('(').next())
            .map(str::to_owned)
            .collect();
        units.push(("selftest".to_owned(), selftest, names));

        let mut registry = String::from("#include \"cuda_emu.h\"\n\n");
        let mut list = String::new();
        for (fam, source, names) in &units {
            let unit = out.join(format!("emu_{fam}.cpp"));
            fs::write(&unit, family_unit(fam, source, names))
                .map_err(|e| format!("{}: {e}", unit.display()))?;
            build.file(&unit);
            let _ = writeln!(
                registry,
                "extern \"C\" const TlEmuKernel* tl_emu_table_{fam}(std::size_t*);"
            );
            let _ = writeln!(list, "    {{\"{fam}\", tl_emu_table_{fam}}},");
        }
        let _ = write!(
            registry,
            "\nstruct TlEmuFamily {{\n    const char* name;\n    const TlEmuKernel* (*table)(std::size_t* n);\n}};\n\
         extern const TlEmuFamily tl_emu_families[] = {{\n{list}}};\n\
         extern const std::size_t tl_emu_family_count = {};\n",
            units.len()
        );
        let reg = out.join("emu_registry.cpp");
        fs::write(&reg, registry).map_err(|e| format!("{}: {e}", reg.display()))?;
        build.file(&reg);
        // cc links the C++ standard library too; the fibers (ucontext) are libc's.
        build.try_compile("tl_cuda_emu").map_err(|e| e.to_string())
    }

    /// One family's translation unit: the source inside the namespace `tl_emu_<family>`, then the
    /// table of its kernels.
    fn family_unit(fam: &str, source: &Path, names: &[String]) -> String {
        let mut s = format!(
            "#include \"cuda_emu.h\"\n\nnamespace tl_emu_{fam} {{\n#include \"{}\"\n\n\
         static const TlEmuKernel table[] = {{\n",
            source.display()
        );
        for n in names {
            let _ = writeln!(s, "    TL_EMU_KERNEL({n}),");
        }
        let _ = write!(
            s,
            "}};\n}}  // namespace tl_emu_{fam}\n\n\
         extern \"C\" const TlEmuKernel* tl_emu_table_{fam}(std::size_t* n) {{\n\
         \x20   *n = sizeof(tl_emu_{fam}::table) / sizeof(tl_emu_{fam}::table[0]);\n\
         \x20   return tl_emu_{fam}::table;\n}}\n"
        );
        s
    }
}
