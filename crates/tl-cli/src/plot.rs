//! `--plot loss.png`: the loss curve as a PNG (plotters' bitmap backend). No text is drawn, so
//! no system fonts are needed: the per-step loss in light blue, the per-epoch mean in red
//! (plotted at each epoch's last step), a frame and horizontal grid lines at a "nice" step
//! (1, 2, 2.5 or 5 times a power of ten) chosen from the range, at most [`MAX_GRID_LINES`] of
//! them whatever the losses ([`grid_lines`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use plotters::prelude::*;

use crate::{CliError, Result};

/// The most horizontal grid lines a plot draws.
pub const MAX_GRID_LINES: usize = 10;

/// Write the curve of `step_losses` and `epoch_losses` (one per `steps_per_epoch` steps) to `path`,
/// atomically: the image is rendered into a scratch file beside `path` (in its directory, the one
/// `tl train` probes before training, under a fresh name created exclusively, so nothing already
/// there, a planted link included, is followed or overwritten), then written to `path` by
/// [`tl_nn::checkpoint::write_atomic`] (a temporary file beside `path`, synced, renamed over it).
/// The scratch file is removed whatever happens; a failed render or write leaves the previous
/// file at `path` intact.
pub fn write_loss_png(path: &Path, step_losses: &[f32], epoch_losses: &[f32]) -> Result<()> {
    let err = |e: String| CliError::new(format!("cannot write plot {}: {e}", path.display()));
    if step_losses.is_empty() {
        return Err(err("no training steps were run".into()));
    }
    let scratch = scratch_beside(path).map_err(err)?;
    let rendered = render(&scratch, step_losses, epoch_losses)
        .map_err(err)
        .and_then(|()| std::fs::read(&scratch).map_err(|e| err(e.to_string())));
    let _ = std::fs::remove_file(&scratch);
    tl_nn::checkpoint::write_atomic(path, &rendered?)
        .map_err(|e| CliError::new(format!("cannot write plot {e}")))
}

static SCRATCH: AtomicU64 = AtomicU64::new(0);

/// A new, empty file in `path`'s directory to render into, created exclusively (`create_new`: a
/// name that exists, as a file or a link, is never opened; the next number is tried). Its name
/// is `.<name>.tmp-<pid>-plot<n>.<ext>`: plotters picks the image format from the extension, so
/// the scratch keeps `path`'s; and the prefix is [`tl_nn::checkpoint::write_atomic`]'s, whose
/// clean-up removes the scratch a killed run left (its process gone) at the next write of `path`.
fn scratch_beside(path: &Path) -> std::result::Result<PathBuf, String> {
    let name = path
        .file_name()
        .ok_or("the path names no file")?
        .to_string_lossy()
        .into_owned();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let ext = path
        .extension()
        .map_or_else(|| "png".into(), |e| e.to_string_lossy().into_owned());
    let mut last = None;
    for _ in 0..100 {
        let scratch = dir.join(format!(
            ".{name}.tmp-{}-plot{}.{ext}",
            std::process::id(),
            SCRATCH.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&scratch)
        {
            Ok(_) => return Ok(scratch),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(format!(
                    "cannot create a scratch file in {}: {e}",
                    dir.display()
                ));
            }
        }
    }
    Err(format!(
        "cannot create a scratch file in {}: {}",
        dir.display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

/// The heights of the horizontal grid lines of a plot whose y axis runs from 0 to `ymax`: the
/// multiples of a "nice" step (1, 2, 2.5 or 5 times a power of ten, the smallest that gives at
/// most [`MAX_GRID_LINES`] lines) above 0 and below `ymax`, computed in f64. None for a `ymax`
/// that is not finite and positive. (The grid was every 0.5 of loss: a run whose loss grew to
/// 10⁸ drew millions of lines, and the f32 loop never ended once 0.5 no longer changed y.)
pub fn grid_lines(ymax: f64) -> Vec<f64> {
    if !(ymax.is_finite() && ymax > 0.0) {
        return Vec::new();
    }
    // The step is at least `raw`, so the lines below `ymax` are at most MAX_GRID_LINES.
    let raw = ymax / MAX_GRID_LINES as f64;
    let pow = 10f64.powi(raw.log10().floor() as i32);
    // (10 and 20: `log10` may round a power of ten's exponent down by one.)
    let step = [1.0, 2.0, 2.5, 5.0, 10.0, 20.0]
        .iter()
        .map(|m| m * pow)
        .find(|&s| s >= raw && s > 0.0 && s.is_finite())
        .unwrap_or(raw);
    if step <= 0.0 {
        // `ymax` within ten times the smallest subnormal: no room for a line.
        return Vec::new();
    }
    (1..=MAX_GRID_LINES)
        .map(|k| k as f64 * step)
        .take_while(|&y| y < ymax)
        .collect()
}

/// Draw the curve into the image file `path` (its format from the extension).
fn render(
    path: &Path,
    step_losses: &[f32],
    epoch_losses: &[f32],
) -> std::result::Result<(), String> {
    let steps_per_epoch = step_losses.len() / epoch_losses.len().max(1);
    let n = step_losses.len() as f64;
    // In f64: a loss near f32::MAX, times 1.05, is past f32's range.
    let top = step_losses
        .iter()
        .map(|&l| f64::from(l))
        .filter(|l| l.is_finite())
        .fold(0.0f64, f64::max);
    let ymax = top.max(1e-6) * 1.05;
    let root = BitMapBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .build_cartesian_2d(0f64..n, 0f64..ymax)
        .map_err(|e| e.to_string())?;
    let grid = RGBColor(220, 220, 220);
    for y in grid_lines(ymax) {
        chart
            .draw_series(LineSeries::new([(0.0, y), (n, y)], grid))
            .map_err(|e| e.to_string())?;
    }
    chart
        .draw_series(LineSeries::new(
            step_losses
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as f64, f64::from(l))),
            RGBColor(120, 170, 230),
        ))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(
            epoch_losses
                .iter()
                .enumerate()
                .map(|(e, &l)| (((e + 1) * steps_per_epoch) as f64 - 1.0, f64::from(l))),
            RED.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?;
    chart
        .plotting_area()
        .draw(&Rectangle::new([(0.0, 0.0), (n, ymax)], BLACK))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grid of a typical loss is every 0.25 to 1; a huge or tiny range gets a bounded
    /// number of nice steps (the loop of 0.5 steps never ended above 2²³ in f32).
    #[test]
    fn grid_lines_are_few_and_nice_on_any_range() {
        assert_eq!(
            grid_lines(4.0 * 1.05),
            [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
        );
        assert_eq!(grid_lines(2.3 * 1.05)[..2], [0.25, 0.5]);
        assert_eq!(
            grid_lines(8.0 * 1.05),
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
        );
        for ymax in [
            1.05e-6,
            3e-3,
            0.07,
            1.0,
            7.5,
            99.0,
            1e9,
            // A loss that blew up but stayed finite: 2²³ and beyond, up to f32's largest.
            f64::from(8_388_608f32) * 1.05,
            1e30,
            f64::from(f32::MAX) * 1.05,
            f64::MAX,
            f64::MIN_POSITIVE,
        ] {
            let g = grid_lines(ymax);
            assert!(
                (1..=MAX_GRID_LINES).contains(&g.len()),
                "{ymax:e}: {} lines",
                g.len()
            );
            assert!(g.iter().all(|&y| y > 0.0 && y < ymax), "{ymax:e}: {g:?}");
            // Evenly spaced by a step of 1, 2, 2.5 or 5 times a power of ten.
            let step = g[0];
            for (k, y) in g.iter().enumerate() {
                assert_eq!(*y, (k + 1) as f64 * step, "{ymax:e}: {g:?}");
            }
            if ymax > 1e-300 {
                let m = step / 10f64.powi(step.log10().floor() as i32);
                assert!(
                    [1.0, 2.0, 2.5, 5.0, 10.0]
                        .iter()
                        .any(|n| (m - n).abs() < 1e-9),
                    "{ymax:e}: step {step:e}"
                );
            }
        }
        assert!(grid_lines(5e-324).len() <= MAX_GRID_LINES);
        for bad in [0.0, -1.0, f64::INFINITY, f64::NAN] {
            assert!(grid_lines(bad).is_empty(), "{bad}");
        }
    }

    /// The scratch image is made in the plot's own directory, exclusively, under a name the
    /// final write's clean-up knows; an existing name (a planted link) is skipped, not followed.
    #[test]
    fn the_scratch_file_is_created_exclusively_beside_the_plot() {
        let dir = std::env::temp_dir().join(format!("tl-plot-scratch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let plot = dir.join("loss.png");
        // Plant a link under the next name this process would use.
        let next = SCRATCH.load(Ordering::Relaxed);
        let planted = dir.join(format!(
            ".loss.png.tmp-{}-plot{next}.png",
            std::process::id()
        ));
        let target = dir.join("victim");
        std::fs::write(&target, "kept").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        #[cfg(not(unix))]
        std::fs::write(&planted, "kept").unwrap();
        let s = scratch_beside(&plot).unwrap();
        assert_ne!(s, planted);
        assert_eq!(s.parent(), Some(dir.as_path()));
        let name = s.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(".loss.png.tmp-") && name.ends_with(".png"),
            "{name}"
        );
        assert_eq!(std::fs::read(&s).unwrap(), b"");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");
        // A whole render and write: the image lands at `plot`, the scratch is gone.
        write_loss_png(&plot, &[3.0, 2.0, 1e30, 1.0], &[2.5, 1e30]).unwrap();
        assert!(std::fs::read(&plot).unwrap().starts_with(b"\x89PNG"));
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let planted_name = planted.file_name().unwrap().to_string_lossy().into_owned();
        let mut want = vec![
            name,
            planted_name,
            "loss.png".to_owned(),
            "victim".to_owned(),
        ];
        want.sort();
        // The empty scratch of `scratch_beside` above is this test's; the render's is removed.
        assert_eq!(left, want);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
