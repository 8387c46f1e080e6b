//! The text [`Emulator`](crate::Emulator) compiles: a copy of each source and of each header it
//! includes with `#include "..."`, each starting with `#line 1 "<original>"` (so messages name
//! the user's files and lines), with its static `__shared__` declarations poisoned (the module
//! `shared`) and its quoted includes pointed at the headers' copies.
//!
//! A quoted include is found where the compiler would look first: next to the including file
//! (the original, not the copy), then in the include directories, in order. One that is found
//! there is copied once per library (a copy per original file, so `#pragma once` and include
//! guards work as they did) and the directive names the copy by its full path; one that is not
//! found (`"cuda_bf16.h"`: the emulator's stand-in) is left as written. A header that is not
//! UTF-8 is included from where it is, unchanged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::kernels::read;
use crate::{Error, hash, shared};

/// The copies of one library's sources and headers, written into `dir`.
pub(crate) struct Copies<'a> {
    dir: &'a Path,
    search: &'a [PathBuf],
    /// Each header met (its canonical path) and the file a directive should name: its copy,
    /// or itself where it is not UTF-8.
    headers: HashMap<PathBuf, PathBuf>,
}

impl<'a> Copies<'a> {
    /// Copies into `dir`, quoted includes looked up in `search` after the including file's
    /// directory.
    pub(crate) fn new(dir: &'a Path, search: &'a [PathBuf]) -> Self {
        Copies {
            dir,
            search,
            headers: HashMap::new(),
        }
    }

    /// Write the copy of `source` (its text `text`) as `copy`, and the copies of the headers it
    /// includes, theirs, and so on. Prints `cargo:rerun-if-changed` for each header.
    pub(crate) fn source(&mut self, source: &Path, text: &str, copy: &Path) -> Result<(), Error> {
        let out = self.rewrite(source, text)?;
        write(copy, &out)
    }

    /// `text` (of the file `path`) as its copy reads: [`poisoned_copy`] with its quoted
    /// includes resolved (and copied).
    fn rewrite(&mut self, path: &Path, text: &str) -> Result<String, Error> {
        let here = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut failed = None;
        let out = poisoned_copy(path, text, &mut |name| {
            if failed.is_some() {
                return None;
            }
            match self.header(&here, name) {
                Ok(found) => found,
                Err(e) => {
                    failed = Some(e);
                    None
                }
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The file a quoted include of `name` from a file in `here` should name: the copy of the
    /// header it finds (written now if it is new), the header itself where it is not UTF-8, or
    /// `None` where it finds none.
    fn header(&mut self, here: &Path, name: &str) -> Result<Option<PathBuf>, Error> {
        let Some(found) = std::iter::once(here)
            .chain(self.search.iter().map(PathBuf::as_path))
            .map(|d| d.join(name))
            .find(|p| p.is_file())
        else {
            return Ok(None);
        };
        let found = found
            .canonicalize()
            .map_err(|e| Error::new(format!("{}: {e}", found.display())))?;
        if let Some(named) = self.headers.get(&found) {
            return Ok(Some(named.clone()));
        }
        println!("cargo:rerun-if-changed={}", found.display());
        let Ok(text) = String::from_utf8(read(&found)?) else {
            self.headers.insert(found.clone(), found.clone());
            return Ok(Some(found));
        };
        let file = found
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let copy = self.dir.join(format!(
            "h_{}_{file}",
            hash::hex(found.to_string_lossy().as_bytes())
        ));
        // Known before its text is rewritten: a header that includes itself (or a cycle) finds
        // its own copy.
        self.headers.insert(found.clone(), copy.clone());
        let out = self.rewrite(&found, &text)?;
        write(&copy, &out)?;
        Ok(Some(copy))
    }
}

/// The text compiled for `path` (its text `text`): a `#line` naming it, so that the compiler's
/// messages point at the user's file and lines, then the text with each static `__shared__`
/// declaration followed by its poisoning calls on the same line
/// ([`shared::poison_shared`]) and each `#include "NAME"` naming `include(NAME)` instead,
/// where that is `Some` (a path with no `"` or newline; others are left as written).
pub(crate) fn poisoned_copy(
    path: &Path,
    text: &str,
    include: &mut dyn FnMut(&str) -> Option<PathBuf>,
) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        match quoted_include(line) {
            Some((start, end)) => {
                let named = include(&line[start..end])
                    .map(|p| p.display().to_string())
                    .filter(|p| !p.contains(['"', '\n', '\r']));
                match named {
                    Some(p) => {
                        out.push_str(&line[..start]);
                        out.push_str(&p);
                        out.push_str(&line[end..]);
                    }
                    None => out.push_str(line),
                }
            }
            None => out.push_str(line),
        }
    }
    let name = path
        .display()
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    format!("#line 1 \"{name}\"\n{}", shared::poison_shared(&out))
}

/// Where the header name of `line`'s `#include "NAME"` is (the offsets of `NAME`), if the line
/// is one.
fn quoted_include(line: &str) -> Option<(usize, usize)> {
    let rest = line.trim_start_matches([' ', '\t']).strip_prefix('#')?;
    let rest = rest
        .trim_start_matches([' ', '\t'])
        .strip_prefix("include")?
        .trim_start_matches([' ', '\t'])
        .strip_prefix('"')?;
    let start = line.len() - rest.len();
    let len = rest.find(['"', '\n'])?;
    (rest.as_bytes()[len] == b'"' && len > 0).then_some((start, start + len))
}

/// Write `text` to `p`, leaving a file that already holds it untouched (its mtime kept, so
/// cc's objects are not rebuilt for nothing).
pub(crate) fn write(p: &Path, text: &str) -> Result<(), Error> {
    if std::fs::read_to_string(p).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(p, text).map_err(|e| Error::new(format!("{}: {e}", p.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory, fresh for each test.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tl-cuda-build-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_copy_names_the_source_and_keeps_its_lines() {
        let text = "// k\nvoid k() { __shared__ float s[4];\n  s[0] = 1; }\n";
        let copy = poisoned_copy(Path::new("/src/my \"dir\\/k.cu"), text, &mut |_| None);
        let (first, rest) = copy.split_once('\n').unwrap();
        assert_eq!(first, r#"#line 1 "/src/my \"dir\\/k.cu""#);
        assert_eq!(
            rest,
            "// k\nvoid k() { __shared__ float s[4]; TL_EMU_SHARED_POISON(s);\n  s[0] = 1; }\n"
        );
    }

    #[test]
    fn quoted_includes_name_what_the_resolver_gives_and_only_those() {
        let text = "#include \"a.cuh\"\n  #  include\t\"sub/b.cuh\" // b\n#include <mma.h>\n\
                    #include \"missing.h\"\n#include \"bad\"\n#include \"\"\n#define X \"a.cuh\"\n";
        let mut asked = Vec::new();
        let copy = poisoned_copy(Path::new("k.cu"), text, &mut |name| {
            asked.push(name.to_owned());
            match name {
                "a.cuh" => Some(PathBuf::from("/out/h_1_a.cuh")),
                "sub/b.cuh" => Some(PathBuf::from("/out/h_2_b.cuh")),
                "bad" => Some(PathBuf::from("/out/with\"quote")),
                _ => None,
            }
        });
        assert_eq!(asked, ["a.cuh", "sub/b.cuh", "missing.h", "bad"]);
        assert_eq!(
            copy,
            "#line 1 \"k.cu\"\n#include \"/out/h_1_a.cuh\"\n  #  include\t\"/out/h_2_b.cuh\" // b\n\
             #include <mma.h>\n#include \"missing.h\"\n#include \"bad\"\n#include \"\"\n\
             #define X \"a.cuh\"\n"
        );
    }

    /// Headers next to the source, in a subdirectory and in an include directory are copied,
    /// once each (a cycle and a second include find the same copy), with their declarations
    /// poisoned and their own includes pointed at copies; an include found nowhere stays.
    #[test]
    fn local_headers_are_copied_once_and_rewritten() {
        let d = scratch("copies_local_headers");
        let (src, inc, out) = (d.join("src"), d.join("inc"), d.join("out"));
        for p in [src.join("sub"), inc.clone(), out.clone()] {
            std::fs::create_dir_all(p).unwrap();
        }
        let put = |p: PathBuf, t: &str| std::fs::write(p, t).unwrap();
        put(
            src.join("a.cuh"),
            "#pragma once\n#include \"sub/b.cuh\"\n__device__ void f() { __shared__ float a[4]; }\n",
        );
        put(
            src.join("sub/b.cuh"),
            "#pragma once\n#include \"../a.cuh\"\n#include \"c.cuh\"\n__shared__ float b[4];\n",
        );
        put(inc.join("c.cuh"), "#pragma once\n__shared__ int c, d;\n");
        let k = src.join("k.cu");
        let text = "#include \"a.cuh\"\n#include \"sub/b.cuh\"\n#include \"cuda_bf16.h\"\n";
        put(k.clone(), text);
        let search = [inc.clone()];
        let mut copies = Copies::new(&out, &search);
        copies.source(&k, text, &out.join("k.cu")).unwrap();
        let mut files: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files.len(), 4, "{files:?}");
        let read = |name: &str| {
            let f = files.iter().find(|f| f.ends_with(name)).unwrap();
            std::fs::read_to_string(out.join(f)).unwrap()
        };
        let (ka, a, b, c) = (read("k.cu"), read("_a.cuh"), read("_b.cuh"), read("_c.cuh"));
        let path_of = |name: &str| {
            let f = files.iter().find(|f| f.ends_with(name)).unwrap();
            out.join(f).display().to_string()
        };
        assert!(
            ka.contains(&format!("#include \"{}\"", path_of("_a.cuh"))),
            "{ka}"
        );
        assert!(
            ka.contains(&format!("#include \"{}\"", path_of("_b.cuh"))),
            "{ka}"
        );
        assert!(ka.contains("#include \"cuda_bf16.h\""), "{ka}");
        assert!(a.starts_with(&format!(
            "#line 1 \"{}\"\n",
            src.join("a.cuh").canonicalize().unwrap().display()
        )));
        assert!(
            a.contains("__shared__ float a[4]; TL_EMU_SHARED_POISON(a);"),
            "{a}"
        );
        assert!(
            b.contains(&format!("#include \"{}\"", path_of("_a.cuh"))),
            "{b}"
        );
        assert!(
            b.contains(&format!("#include \"{}\"", path_of("_c.cuh"))),
            "{b}"
        );
        assert!(b.contains("TL_EMU_SHARED_POISON_EACH_BLOCK(b);"), "{b}");
        assert!(
            c.contains("TL_EMU_SHARED_POISON_EACH_BLOCK(c); TL_EMU_SHARED_POISON_EACH_BLOCK(d);"),
            "{c}"
        );
    }
}
