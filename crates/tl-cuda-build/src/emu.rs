//! The host build of CUDA C sources for the kernel emulator (tl-tape-cuda's feature
//! `cuda-emu`): each `.cu` compiled by the host C++ compiler after [`CUDA_EMU_H`], in its own
//! translation unit and namespace, followed by the table of its kernels (name, parameter
//! signature, entry point); one static library per [`Emulator`], whose table the function
//! [`Emulator::table_symbol`] returns. The source is compiled as written but for one addition:
//! each static `__shared__` declaration (in the source and in the headers it includes with
//! `#include "..."`) is followed, on its line, by calls that poison its variables each block
//! (the modules `shared` and `copies`; [`Emulator::compile`]).
//!
//! The runtime that runs those tables (fibers, barriers, checked memory) is compiled once, into
//! tl-tape-cuda. A user's library is linked into the user's crate and handed to the runtime
//! at run time: `tl_tape_cuda::emu_kernels!(<lib>)` names its table, and the first launch of
//! one of its kernels registers it.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use crate::copies::{Copies, write};
use crate::kernels::{read, stem};
use crate::{Error, Kernels, ptx};

/// The CUDA built-ins for the host (`threadIdx`, `__syncthreads`, `__shfl_down_sync`,
/// `atomicAdd`, `__fmaf_rn`, `__nv_bfloat16`, the warp matrix functions `nvcuda::wmma`, ...) and the kernel-table machinery (`TL_EMU_KERNEL`): included
/// before every source.
pub const CUDA_EMU_H: &str = include_str!("../emu/cuda_emu.h");

/// The stand-in for CUDA's `mma.h` and `cuda_bf16.h` in the emulator build: empty, as
/// [`CUDA_EMU_H`] (included before every source) declares `nvcuda::wmma` and `__nv_bfloat16`.
const EMU_STANDIN_H: &str = "// The kernel emulator's stand-in: cuda_emu.h, included before every source,\n\
// declares what this CUDA header would (nvcuda::wmma, __nv_bfloat16).\n#pragma once\n";

/// The emulator's runtime (fibers, barriers, allocations with guard zones, launches, the
/// registry of kernel tables); compiled by [`Emulator::with_runtime`] only (tl-tape-cuda).
pub const RUNTIME_CPP: &str = include_str!("../emu/runtime.cpp");

/// One translation unit: a source and the kernels its table lists.
#[derive(Debug, Clone)]
struct Unit {
    source: PathBuf,
    kernels: Vec<String>,
}

/// A static library of `.cu` sources compiled for the kernel emulator, built from a build
/// script (it writes into `OUT_DIR` and prints cargo's link lines).
#[derive(Debug, Clone)]
pub struct Emulator {
    lib: String,
    units: Vec<Unit>,
    includes: Vec<PathBuf>,
    runtime: bool,
}

impl Emulator {
    /// An empty library named `lib` (a C identifier: letters, digits, `_`), linked as
    /// `lib<lib>.a`; its table is [`table_symbol`](Self::table_symbol).
    pub fn new(lib: &str) -> Self {
        Emulator {
            lib: lib.to_owned(),
            units: Vec::new(),
            includes: Vec::new(),
            runtime: false,
        }
    }

    /// Every source of `set`, each with the kernel names of its committed PTX
    /// (`.visible .entry`: the names the driver resolves) or, where it has no PTX yet, of its
    /// source (`extern "C" __global__ void NAME(`). The set's header directories are searched.
    pub fn kernels(mut self, set: &Kernels) -> Result<Self, Error> {
        for src in set.sources() {
            let ptx_path = set.ptx_path(src);
            let names = match fs::read_to_string(&ptx_path) {
                Ok(text) => ptx::entries(&text),
                Err(_) => ptx::source_entries(&String::from_utf8_lossy(&read(src)?)),
            };
            self = self.source_with(src, names)?;
        }
        for h in set.headers() {
            if let Some(dir) = h.parent() {
                self = self.include(dir);
            }
        }
        Ok(self)
    }

    /// Add `cu`, its kernel names read from the source (each `extern "C" __global__ void NAME(`
    /// that defines a kernel; a prototype ending in `;` is skipped: [`crate::source_entries`]).
    pub fn source(self, cu: impl AsRef<Path>) -> Result<Self, Error> {
        let cu = cu.as_ref();
        let names = ptx::source_entries(&String::from_utf8_lossy(&read(cu)?));
        self.source_with(cu, names)
    }

    /// Add `cu` with the kernels its table lists.
    pub fn source_with(
        mut self,
        cu: impl AsRef<Path>,
        kernels: Vec<String>,
    ) -> Result<Self, Error> {
        let cu = cu.as_ref();
        if kernels.is_empty() {
            return Err(Error::new(format!(
                "{}: no kernel found (a kernel is declared `extern \"C\" __global__ void NAME(`)",
                cu.display()
            )));
        }
        let source = cu
            .canonicalize()
            .map_err(|e| Error::new(format!("{}: {e}", cu.display())))?;
        self.units.push(Unit { source, kernels });
        Ok(self)
    }

    /// Add an include directory.
    pub fn include(mut self, dir: impl Into<PathBuf>) -> Self {
        self.includes.push(dir.into());
        self
    }

    /// Also compile the runtime ([`RUNTIME_CPP`]), with this library's table as the built-in
    /// one. For tl-tape-cuda's build script only: a process holds one runtime.
    #[doc(hidden)]
    pub fn with_runtime(mut self) -> Self {
        self.runtime = true;
        self
    }

    /// The C symbol of this library's kernel table,
    /// `const TlEmuKernel* tl_emu_table_<lib>(size_t* n)`.
    pub fn table_symbol(&self) -> String {
        format!("tl_emu_table_{}", self.lib)
    }

    /// Compile the library into `OUT_DIR` and tell cargo to link it (and the C++ standard
    /// library). Prints `cargo:rerun-if-changed` for each source. A kernel name is looked up in
    /// its library's table, as a GPU looks it up in its module: it must be unique in the
    /// library, and may repeat a name of another library (the runtime's own kernels included).
    ///
    /// For an x86-64 target each source is compiled twice, the second time with `-mfma` (where
    /// `__fmaf_rn` is the FMA instruction instead of a call to the C library's `fmaf`: the same
    /// rounding); the runtime launches that build when the CPU has FMA, the plain one
    /// otherwise.
    ///
    /// What is compiled is a copy of each source in `OUT_DIR`, and of each header it includes
    /// with `#include "..."` (found next to the including file or in the include directories,
    /// the sources' own among them; copied once, the directive naming the copy), each starting
    /// with `#line 1 "<original>"` so that messages name the user's own files and lines, in
    /// which each static `__shared__` declaration is followed, on its line, by a call per
    /// declarator that fills the variable with 0xFF bytes (a NaN) each block, as a GPU leaves
    /// shared memory undefined at a block's start: in a function, at the first thread of each
    /// block that executes the declaration; at namespace scope, and in a function where a
    /// `case`, `default` or `goto` label follows it in its block, at the start of each block
    /// (the latter from the block after the launching thread first passed the declaration).
    /// Declarations the rewrite does not follow (`extern __shared__`, one with an initializer,
    /// one in a class body, those of a file whose braces do not balance; docs/cuda.md, "The
    /// kernel emulator") keep the emulator's plain `static thread_local`, which starts at 0 and
    /// keeps the previous block's values. An include found nowhere (`"cuda_bf16.h"`) is left as
    /// written and looked up in the copy's directory (the emulator's stand-ins), then in the
    /// include directories. A source or header that is not UTF-8 is compiled unchanged.
    pub fn compile(&self) -> Result<(), Error> {
        if self.lib.is_empty()
            || !self
                .lib
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(Error::new(format!(
                "emulator library name {:?}: use letters, digits and `_`",
                self.lib
            )));
        }
        if self.units.is_empty() {
            return Err(Error::new(format!(
                "emulator library {}: no source",
                self.lib
            )));
        }
        self.check_unique_kernels()?;
        let out = PathBuf::from(
            env::var("OUT_DIR")
                .map_err(|_| Error::new("OUT_DIR is not set: call from a build script"))?,
        );
        let dir = out.join(format!("tl_emu_{}", self.lib));
        fs::create_dir_all(&dir).map_err(|e| Error::new(format!("{}: {e}", dir.display())))?;
        write(&dir.join("cuda_emu.h"), CUDA_EMU_H)?;
        // A source's `#include <mma.h>` / `<cuda_bf16.h>` (inside its namespace): what they
        // declare on a GPU, cuda_emu.h already has.
        for h in ["mma.h", "cuda_bf16.h"] {
            write(&dir.join(h), EMU_STANDIN_H)?;
        }

        let mut build = cc::Build::new();
        build
            .cpp(true)
            .std("c++17")
            .opt_level(2)
            // nvcc builds the PTX with --fmad=false: no contraction of a*b + c here either.
            .flag("-ffp-contract=off")
            .flag("-fno-fast-math")
            // Kernels may take parameter lists they read only part of.
            .flag("-Wno-unused-parameter")
            .include(&dir);
        for i in &self.includes {
            build.include(i);
        }
        // Where a quoted include is looked up after the including file's directory: the
        // compiler's order, less `dir` (the stand-ins and the copies).
        let mut search = self.includes.clone();
        for unit in &self.units {
            println!("cargo:rerun-if-changed={}", unit.source.display());
            if let Some(parent) = unit.source.parent() {
                build.include(parent);
                search.push(parent.to_path_buf());
            }
        }
        let mut copies = Copies::new(&dir, &search);
        // On x86-64 every source is built a second time with -mfma: there __fmaf_rn (the C
        // library's fmaf) is the FMA instruction inline instead of a call, the same rounding,
        // and the kernels with most products run several times faster. The runtime launches
        // that build when the CPU has FMA (docs/cuda.md, "The kernel emulator").
        let fma = env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "x86_64");
        let mut fma_build = build.clone();
        fma_build.flag("-mfma");
        let mut table = String::from("#include \"cuda_emu.h\"\n#include <vector>\n\n");
        let (mut list, mut fma_list) = (String::new(), String::new());
        // Unit `ns` (the source `cu`, the copy of `unit`'s) into `build`, its table declared
        // and listed in `list`.
        let mut add =
            |ns: &str, unit: &Unit, cu: &Path, build: &mut cc::Build, list: &mut String| {
                let path = dir.join(format!("{ns}.cpp"));
                write(&path, &unit_source(ns, cu, &unit.kernels))?;
                build.file(&path);
                let _ = writeln!(
                    table,
                    "extern \"C\" const TlEmuKernel* {ns}_table(std::size_t*);"
                );
                let _ = writeln!(list, "        {ns}_table,");
                Ok::<(), Error>(())
            };
        for (k, unit) in self.units.iter().enumerate() {
            let ns = format!("tl_emu_{}_{k}_{}", self.lib, ident(&stem(&unit.source)));
            // The source and its local headers with their static shared memory poisoned each
            // block (copies.rs, shared.rs), or the source itself where it is not UTF-8.
            let cu = match String::from_utf8(read(&unit.source)?) {
                Ok(text) => {
                    let copy = dir.join(format!("{ns}.cu"));
                    copies.source(&unit.source, &text, &copy)?;
                    copy
                }
                Err(_) => unit.source.clone(),
            };
            add(&ns, unit, &cu, &mut build, &mut list)?;
            if fma {
                add(
                    &format!("{ns}_fma"),
                    unit,
                    &cu,
                    &mut fma_build,
                    &mut fma_list,
                )?;
            } else {
                fma_list.push_str("        nullptr,\n");
            }
        }
        if fma {
            let objects = fma_build
                .try_compile_intermediates()
                .map_err(|e| Error::new(format!("emulator library {} (-mfma): {e}", self.lib)))?;
            build.objects(objects);
        }
        let sym = self.table_symbol();
        // The table: each unit's kernels, with their -mfma build's functions (same order) as
        // fn_fma and its namespace-scope shared variables as statics_fma.
        let _ = write!(
            table,
            "\nextern \"C\" const TlEmuKernel* {sym}(std::size_t* n) {{\n\
             \x20   static const std::vector<TlEmuKernel> all = [] {{\n\
             \x20       typedef const TlEmuKernel* (*Unit)(std::size_t*);\n\
             \x20       const Unit units[] = {{\n{list}        }};\n\
             \x20       const Unit fma_units[] = {{\n{fma_list}        }};\n\
             \x20       std::vector<TlEmuKernel> v;\n\
             \x20       for (std::size_t u = 0; u < sizeof units / sizeof units[0]; ++u) {{\n\
             \x20           std::size_t k = 0, kf = 0;\n\
             \x20           const TlEmuKernel* t = units[u](&k);\n\
             \x20           const TlEmuKernel* f = fma_units[u] ? fma_units[u](&kf) : nullptr;\n\
             \x20           for (std::size_t i = 0; i < k; ++i) {{\n\
             \x20               TlEmuKernel e = t[i];\n\
             \x20               if (f != nullptr && i < kf) {{\n\
             \x20                   e.fn_fma = f[i].fn;\n\
             \x20                   e.statics_fma = f[i].statics;\n\
             \x20               }}\n\
             \x20               v.push_back(e);\n\
             \x20           }}\n\
             \x20       }}\n\
             \x20       return v;\n\
             \x20   }}();\n\
             \x20   *n = all.size();\n\
             \x20   return all.data();\n}}\n"
        );
        if self.runtime {
            let _ = write!(
                table,
                "\nextern \"C\" const TlEmuKernel* tl_emu_builtin_table(std::size_t* n) {{\n\
                 \x20   return {sym}(n);\n}}\n"
            );
            let rt = dir.join("runtime.cpp");
            write(&rt, RUNTIME_CPP)?;
            build.file(&rt);
        }
        let path = dir.join(format!("{sym}.cpp"));
        write(&path, &table)?;
        build.file(&path);
        // cc prints the link lines (the library, the C++ standard library); fibers are libc's.
        build
            .try_compile(&self.lib)
            .map_err(|e| Error::new(format!("emulator library {}: {e}", self.lib)))
    }

    /// Every kernel name once in the library: a name given twice (by two sources, or twice
    /// for one) is an error naming the library, the kernel and both sources, at build time
    /// (the runtime would refuse every launch of the library's kernels).
    fn check_unique_kernels(&self) -> Result<(), Error> {
        let mut seen: std::collections::HashMap<&str, &Path> = std::collections::HashMap::new();
        for unit in &self.units {
            for k in &unit.kernels {
                if let Some(first) = seen.insert(k, &unit.source) {
                    return Err(Error::new(format!(
                        "emulator library {}: kernel {k} is given twice, by {} and by {}; a kernel name must be unique in its library (rename one, or build it into another Emulator library)",
                        self.lib,
                        first.display(),
                        unit.source.display()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// One source's translation unit: the source inside namespace `ns` (after the head of its
/// list of namespace-scope shared variables, `tl_emu_unit_statics`), then its table. Each
/// kernel's C symbol is renamed to `<ns>_<name>` (a macro around the source), so kernels of
/// different sources and libraries may share a name, as kernels of different modules do on a
/// GPU; the table keeps the name as written (`TL_EMU_KERNEL` stringifies its argument before
/// expansion).
fn unit_source(ns: &str, source: &Path, names: &[String]) -> String {
    let mut s = String::from("#include \"cuda_emu.h\"\n\n");
    for n in names {
        let _ = writeln!(s, "#define {n} {ns}_{n}");
    }
    let _ = write!(
        s,
        "\nnamespace {ns} {{\n\
         [[maybe_unused]] static TlEmuStaticShared* tl_emu_unit_statics = nullptr;\n\
         #include \"{}\"\n\n\
         static const TlEmuKernel table[] = {{\n",
        source.display()
    );
    for n in names {
        let _ = writeln!(s, "    TL_EMU_KERNEL({n}),");
    }
    s.push_str("};\n");
    for n in names {
        let _ = writeln!(s, "#undef {n}");
    }
    let _ = write!(
        s,
        "}}  // namespace {ns}\n\n\
         extern \"C\" const TlEmuKernel* {ns}_table(std::size_t* n) {{\n\
         \x20   *n = sizeof({ns}::table) / sizeof({ns}::table[0]);\n\
         \x20   return {ns}::table;\n}}\n"
    );
    s
}

/// `s` with every character that is not a letter, digit or `_` replaced by `_`.
fn ident(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel name given twice in one library is refused when the library is built (before
    /// `OUT_DIR` is looked at), naming the library, the kernel and both sources; a prototype
    /// before the definition is not a second name.
    #[test]
    fn a_kernel_name_twice_in_one_library_is_refused_at_build_time() {
        let d = std::env::temp_dir().join(format!("tl-cuda-build-emu-dup-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let (a, b) = (d.join("a.cu"), d.join("b.cu"));
        fs::write(
            &a,
            "extern \"C\" __global__ void k(float*);\n\
             extern \"C\" __global__ void k(float* y) { y[0] = 1; }\n",
        )
        .unwrap();
        fs::write(&b, "extern \"C\" __global__ void k(float* y) {}\n").unwrap();
        let one = Emulator::new("mine").source(&a).unwrap();
        assert_eq!(one.units[0].kernels, ["k"]);
        let e = one.source(&b).unwrap().compile().unwrap_err().to_string();
        let (a, b) = (a.canonicalize().unwrap(), b.canonicalize().unwrap());
        assert!(
            e.contains("emulator library mine")
                && e.contains("kernel k is given twice")
                && e.contains(&a.display().to_string())
                && e.contains(&b.display().to_string()),
            "{e}"
        );
        let e = Emulator::new("mine")
            .source_with(&a, vec!["k".into(), "k".into()])
            .unwrap()
            .compile()
            .unwrap_err()
            .to_string();
        assert!(e.contains("kernel k is given twice"), "{e}");
        let _ = fs::remove_dir_all(&d);
    }

    /// The runtime defines the functions the poisoning macros call (shared.rs checks the
    /// macros against the header).
    #[test]
    fn the_runtime_defines_the_poisoning_functions() {
        assert!(RUNTIME_CPP.contains("bool tl_emu_shared_poison(void* p, std::size_t bytes)"));
        assert!(
            RUNTIME_CPP.contains("bool tl_emu_shared_poison_jumpable(void* p, std::size_t bytes)")
        );
        assert!(
            unit_source("ns", Path::new("k.cu"), &["k".into()]).contains(
                "static TlEmuStaticShared* tl_emu_unit_statics = nullptr;\n#include \"k.cu\""
            )
        );
    }
}
