//! `tl train`'s output paths (`--save`, `--plot`), checked before anything trains: a path in a
//! missing directory, a directory, a place this process cannot write or a plot that is not a
//! PNG is one error line at the start, not after the run (twenty minutes for `--preset
//! fno-paper`). What the path alone gets wrong (a plot that is not a PNG, a path that names no
//! file) is a usage error; what the file system refuses is a runtime error.

use std::path::Path;

use crate::{CliError, Result};

/// Check `save` and `plot` (each if given) for a run of `epochs` epochs: each names a file
/// (absent, or a regular file to replace) in an existing directory this process can create a
/// file in (a probe file is made and removed there), the plot ends in `.png` (or has no
/// extension, written as PNG), and a plot needs at least one epoch to draw.
pub fn check(save: Option<&Path>, plot: Option<&Path>, epochs: usize) -> Result<()> {
    if let Some(p) = save {
        writable("--save", p)?;
    }
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
        writable("--plot", p)?;
    }
    Ok(())
}

/// `path` can be written by `flag`'s atomic write (a file created beside it, renamed over it).
fn writable(flag: &str, path: &Path) -> Result<()> {
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
            Ok(())
        }
        Err(e) => Err(bad(format!(
            "cannot create a file in {}: {e}",
            dir.display()
        ))),
    }
}
