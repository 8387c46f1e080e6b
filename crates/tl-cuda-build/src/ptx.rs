//! What the pipeline reads in PTX and CUDA C: the ISA version and the kernel names.

use crate::Error;

/// The highest PTX ISA version the target driver (580) loads: nvcc 13.0 writes 9.0; 13.1 and
/// newer write PTX that driver refuses.
pub const MAX_PTX_VERSION: (u32, u32) = (9, 0);

/// The `.version` a PTX file declares, as (major, minor).
pub fn version(name: &str, ptx: &str) -> Result<(u32, u32), Error> {
    let v = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".version "))
        .ok_or_else(|| Error::new(format!("{name}: no .version line")))?;
    v.trim()
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| Error::new(format!("{name}: cannot parse .version {v:?}")))
}

/// `Ok` when the PTX declares a `.version` no higher than [`MAX_PTX_VERSION`]; otherwise an
/// error naming the file (`name`) and the version.
pub fn check_version(name: &str, ptx: &str) -> Result<(), Error> {
    let v = version(name, ptx)?;
    if v > MAX_PTX_VERSION {
        return Err(Error::new(format!(
            "{name} declares PTX ISA .version {}.{}, above {}.{} (driver 580 will not load it): \
             rebuild with nvcc 13.0",
            v.0, v.1, MAX_PTX_VERSION.0, MAX_PTX_VERSION.1
        )));
    }
    Ok(())
}

/// The kernel names of a PTX file (`.visible .entry NAME(`), in file order: the names the CUDA
/// driver resolves.
pub fn entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .filter_map(|rest| rest.split('(').next())
        .map(|s| s.trim().to_owned())
        .collect()
}

/// The kernel names of a CUDA C source: every line that starts with
/// `extern "C" __global__ void NAME(` (the project's convention; `__launch_bounds__(..)` may
/// follow `__global__`) and defines the kernel, in file order. A declaration (a prototype: its
/// parameter list, which may span lines, followed by `;` rather than a body) is skipped, so a
/// kernel declared before its definition is named once.
pub fn source_entries(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut start = 0;
    for line in src.split_inclusive('\n') {
        let line_start = start;
        start += line.len();
        let Some(rest) = line.trim_start().strip_prefix("extern \"C\" __global__ ") else {
            continue;
        };
        let rest = rest.trim_start();
        let rest = match rest.strip_prefix("__launch_bounds__(") {
            Some(r) => match r.split_once(')') {
                Some((_, r)) => r.trim_start(),
                None => continue,
            },
            None => rest,
        };
        let Some((name, params)) = rest.strip_prefix("void ").and_then(|r| r.split_once('('))
        else {
            continue;
        };
        let name = name.trim();
        // `params` ends where `line` does: where it starts in `src`, after the `(`.
        let at = line_start + line.len() - params.len();
        if !name.is_empty() && !is_declaration(&src[at..]) {
            names.push(name.to_owned());
        }
    }
    names
}

/// Whether `after_paren`, the text after a function's `(`, is a declaration's: the parameter
/// list closes and the next token (past blanks and comments) is `;`. A definition's is `{`;
/// text that ends first counts as a definition (as it was before declarations were skipped).
fn is_declaration(after_paren: &str) -> bool {
    let mut depth = 1usize;
    let mut close = None;
    for (i, c) in after_paren.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i + 1);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(close) = close else {
        return false;
    };
    let mut rest = &after_paren[close..];
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, r)| r);
        } else {
            return rest.starts_with(';');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_versions_above_nine_zero_are_refused() {
        assert!(check_version("a.ptx", "//\n.version 9.0\n.target sm_80").is_ok());
        assert!(check_version("a.ptx", ".version 8.7\n").is_ok());
        let e = check_version("a.ptx", ".version 9.1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("9.1") && e.contains("a.ptx"), "{e}");
        assert!(check_version("a.ptx", ".version 10.0\n").is_err());
        assert!(check_version("a.ptx", ".target sm_80\n").is_err());
    }

    #[test]
    fn kernel_names_come_from_ptx_entries_and_source_declarations() {
        let ptx = ".visible .entry tl_a(\n\t.param .u64 p\n)\n.visible .entry tl_b(\n";
        assert_eq!(entries(ptx), ["tl_a", "tl_b"]);
        let src = "extern \"C\" __global__ void k1(const float* x) {}\n\
                   static __device__ float h(float v) { return v; }\n\
                   extern \"C\" __global__ __launch_bounds__(256) void k2(float* y,\n";
        assert_eq!(source_entries(src), ["k1", "k2"]);
    }

    /// A prototype before the definition (legal CUDA C) names its kernel once: the emulator's
    /// table listed it twice, and every launch failed.
    #[test]
    fn kernel_prototypes_are_not_entries() {
        let src = "extern \"C\" __global__ void k(float*);\n\
                   extern \"C\" __global__ __launch_bounds__(128) void j(const float* x,\n\
                   \x20   float* y)  /* declared */ ;\n\
                   extern \"C\" __global__ void m(float* (*f)(int)) // a comment\n\
                   ;\n\
                   extern \"C\" __global__ void k(float* y) { y[0] = 1; }\n\
                   extern \"C\" __global__ __launch_bounds__(128) void j(const float* x,\n\
                   \x20   float* y)\n{\n}\n\
                   extern \"C\" __global__ void m(float* (*f)(int)) /* ; */ {}\n";
        assert_eq!(source_entries(src), ["k", "j", "m"]);
    }
}
