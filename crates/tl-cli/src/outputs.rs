//! `tl train`'s output paths (`--save`, `--plot`), checked before anything trains: a path in a
//! missing directory, a directory, a place this process cannot write or a plot that is not a
//! PNG is one error line at the start, not after the run (twenty minutes for `--preset
//! fno-paper`). What the path alone gets wrong (a plot that is not a PNG, a path that names no
//! file) and two outputs naming one file are usage errors; what the file system refuses is a
//! runtime error.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::{CliError, Result};

/// Check `save` and `plot` (each if given) for a run of `epochs` epochs: each names a file
/// (absent, or a regular file to replace) in an existing directory this process can create a
/// file in (a probe file is made and removed there), the plot ends in `.png` (or has no
/// extension, written as PNG), a plot needs at least one epoch to draw, and the two name
/// different files (the plot, written last, would replace the checkpoint).
pub fn check(save: Option<&Path>, plot: Option<&Path>, epochs: usize) -> Result<()> {
    let saved = match save {
        Some(p) => Some(writable("--save", p)?),
        None => None,
    };
    if let Some(p) = plot {
        let png = p.extension().is_none_or(|e| e.eq_ignore_ascii_case("png"));
        if !png {
            return Err(CliError::usage(format!(
                "--plot {}: the loss curve is written as a PNG; give a path ending in .png",
                p.display()
            )));
        }
        if epochs == 0 {
            return Err(CliError::usage(format!(
                "--plot {}: --epochs 0 trains nothing to plot",
                p.display()
            )));
        }
        let plotted = writable("--plot", p)?;
        if let (Some(s), Some(saved)) = (save, &saved)
            && *saved == plotted
        {
            return Err(CliError::usage(format!(
                "--save {} and --plot {} name the same file: the plot would replace the checkpoint; give two paths",
                s.display(),
                p.display()
            )));
        }
    }
    Ok(())
}

/// The file an atomic write of `path` replaces: its directory, canonicalized (`.`, `..` and
/// links resolved), and its name. Two paths with the same identity are one output: the rename
/// of the second write replaces the first's file. (A link named by the path itself is
/// replaced, not followed, so its name, not its target, is what counts.)
fn identity(dir: &Path, name: &std::ffi::OsStr) -> std::io::Result<(PathBuf, OsString)> {
    Ok((dir.canonicalize()?, name.to_owned()))
}

/// `path` can be written by `flag`'s atomic write (a file created beside it, renamed over it);
/// its [`identity`].
fn writable(flag: &str, path: &Path) -> Result<(PathBuf, OsString)> {
    let bad = |why: String| CliError::new(format!("{flag} {}: {why}", path.display()));
    let Some(name) = path.file_name() else {
        return Err(CliError::usage(format!(
            "{flag} {}: the path names no file",
            path.display()
        )));
    };
    if let Ok(m) = std::fs::metadata(path)
        && !m.is_file()
    {
        return Err(bad(
            "not a regular file (a directory?); give a file path".into()
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(bad(format!(
            "the directory {} does not exist",
            dir.display()
        )));
    }
    let probe = dir.join(format!(
        ".{}.probe-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe);
    match made {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&probe);
            identity(dir, name).map_err(|e| bad(format!("cannot resolve {}: {e}", dir.display())))
        }
        Err(e) => Err(bad(format!(
            "cannot create a file in {}: {e}",
            dir.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--save` and `--plot` naming one file, however spelled, are refused up front, naming both
    /// flags; different files in one directory are fine.
    #[test]
    fn save_and_plot_naming_one_file_are_refused() {
        let dir = std::env::temp_dir().join(format!("tl-outputs-same-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let out = dir.join("out.png");
        let spellings = [
            out.clone(),
            dir.join(".").join("out.png"),
            dir.join("sub").join("..").join("out.png"),
        ];
        for (i, a) in spellings.iter().enumerate() {
            for b in &spellings[i..] {
                let e = check(Some(a), Some(b), 1).unwrap_err();
                assert!(e.is_usage(), "{e}");
                let m = e.to_string();
                assert!(
                    m.contains(&format!("--save {}", a.display()))
                        && m.contains(&format!("--plot {}", b.display()))
                        && m.contains("same file"),
                    "{m}"
                );
            }
        }
        // An existing checkpoint under that name: the same.
        std::fs::write(&out, "checkpoint").unwrap();
        assert!(check(Some(&out), Some(&spellings[2]), 1).is_err());
        #[cfg(unix)]
        {
            // A link to the directory is the directory.
            let link = dir.join("link");
            std::os::unix::fs::symlink(&dir, &link).unwrap();
            assert!(check(Some(&out), Some(&link.join("out.png")), 1).is_err());
        }
        // Different names, or one flag alone: fine.
        check(Some(&dir.join("m.safetensors")), Some(&out), 1).unwrap();
        check(Some(&out), Some(&dir.join("sub").join("out.png")), 1).unwrap();
        check(Some(&out), None, 1).unwrap();
        check(None, Some(&out), 1).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "checkpoint");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
