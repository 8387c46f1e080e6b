//! The host build of CUDA C sources for the kernel emulator (tl-tape-cuda's feature
//! `cuda-emu`): each `.cu` compiled by the host C++ compiler after [`CUDA_EMU_H`], in its own
//! translation unit and namespace, followed by the table of its kernels (name, parameter
//! signature, entry point); one static library per [`Emulator`], whose table the function
//! [`Emulator::table_symbol`] returns. The source is compiled as written but for one addition:
//! each static `__shared__` declaration is followed, on its line, by a call that poisons the
//! variable at the start of each block (the module `shared`; [`Emulator::compile`]).
//!
//! The runtime that runs those tables (fibers, barriers, checked memory) is compiled once, into
//! tl-tape-cuda. A user's library is linked into the user's crate and handed to the runtime
//! at run time: `tl_tape_cuda::emu_kernels!(<lib>)` names its table, and the first launch of
//! one of its kernels registers it.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use crate::kernels::{read, stem};
use crate::{Error, Kernels, ptx, shared};

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

    /// Add `cu`, its kernel names read from the source (`extern "C" __global__ void NAME(`).
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
    /// What is compiled is a copy of each source in `OUT_DIR`, starting with
    /// `#line 1 "<source>"` so that messages name the source's own file and lines, in which each
    /// static `__shared__` declaration is followed, on its line, by
    /// `TL_EMU_SHARED_POISON(NAME);`: the first thread of each block that executes the
    /// declaration fills the variable with 0xFF bytes (a NaN), as a GPU leaves shared memory
    /// undefined at a block's start. Declarations the rewrite does not follow (several
    /// declarators in one, `extern __shared__`, a namespace-scope variable, a header's
    /// declarations: headers are not rewritten) keep the emulator's plain `static thread_local`,
    /// which starts at 0 and keeps the previous block's values. A quoted `#include` in the copy
    /// is looked up in the copy's directory, then in the include directories, the source's own
    /// directory among them. A source that is not UTF-8 is compiled unchanged.
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
        for unit in &self.units {
            println!("cargo:rerun-if-changed={}", unit.source.display());
            if let Some(parent) = unit.source.parent() {
                build.include(parent);
            }
        }
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
            // The source with its static shared memory poisoned each block (shared.rs), or the
            // source itself where it is not UTF-8.
            let cu = match String::from_utf8(read(&unit.source)?) {
                Ok(text) => {
                    let copy = dir.join(format!("{ns}.cu"));
                    write(&copy, &poisoned_copy(&unit.source, &text))?;
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
        // fn_fma.
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
             \x20               if (f != nullptr && i < kf) e.fn_fma = f[i].fn;\n\
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
}

/// One source's translation unit: the source inside namespace `ns`, then its table. Each
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
        "\nnamespace {ns} {{\n#include \"{}\"\n\n\
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

/// The text compiled for `source` (its text `text`): a `#line` naming the source, so that the
/// compiler's messages point at the user's file and lines, then the text with each static
/// `__shared__` declaration followed by its poisoning call on the same line
/// ([`shared::poison_shared`]).
fn poisoned_copy(source: &Path, text: &str) -> String {
    let name = source
        .display()
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    format!("#line 1 \"{name}\"\n{}", shared::poison_shared(text))
}

/// `s` with every character that is not a letter, digit or `_` replaced by `_`.
fn ident(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn write(p: &Path, text: &str) -> Result<(), Error> {
    // Unchanged files keep their mtime, so cc's objects are not rebuilt for nothing.
    if fs::read_to_string(p).is_ok_and(|old| old == text) {
        return Ok(());
    }
    fs::write(p, text).map_err(|e| Error::new(format!("{}: {e}", p.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_names_the_source_and_keeps_its_lines() {
        let text = "// k\n{ __shared__ float s[4];\n  s[0] = 1; }\n";
        let copy = poisoned_copy(Path::new("/src/my \"dir\\/k.cu"), text);
        let (first, rest) = copy.split_once('\n').unwrap();
        assert_eq!(first, r#"#line 1 "/src/my \"dir\\/k.cu""#);
        assert_eq!(
            rest,
            "// k\n{ __shared__ float s[4]; TL_EMU_SHARED_POISON(s);\n  s[0] = 1; }\n"
        );
    }

    /// The poisoning macro the rewrite calls is the one the header defines.
    #[test]
    fn the_header_defines_the_poisoning_macro() {
        assert!(CUDA_EMU_H.contains("#define TL_EMU_SHARED_POISON(name)"));
        assert!(RUNTIME_CPP.contains("bool tl_emu_shared_poison(void* p, std::size_t bytes)"));
    }
}
