//! `--plot loss.png`: the loss curve as a PNG (plotters' bitmap backend). No text is drawn, so
//! no system fonts are needed: the per-step loss in light blue, the per-epoch mean in red
//! (plotted at each epoch's last step), a frame and horizontal grid lines at every 0.5 of loss.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use plotters::prelude::*;

use crate::{CliError, Result};

/// Write the curve of `step_losses` and `epoch_losses` (one per `steps_per_epoch` steps) to `path`,
/// atomically: the image is rendered into a scratch file in the system's temporary directory,
/// then written to `path` by [`tl_nn::checkpoint::write_atomic`] (a temporary file beside `path`,
/// synced, renamed over it). A failed render or write leaves the previous file at `path` intact.
pub fn write_loss_png(path: &Path, step_losses: &[f32], epoch_losses: &[f32]) -> Result<()> {
    let err = |e: String| CliError::new(format!("cannot write plot {}: {e}", path.display()));
    if step_losses.is_empty() {
        return Err(err("no training steps were run".into()));
    }
    // plotters picks the image format from the extension: the scratch file keeps it.
    let ext = path
        .extension()
        .map_or_else(|| "png".into(), |e| e.to_string_lossy().into_owned());
    let scratch = std::env::temp_dir().join(format!(
        "tl-plot-{}-{}.{ext}",
        std::process::id(),
        SCRATCH.fetch_add(1, Ordering::Relaxed)
    ));
    let rendered = render(&scratch, step_losses, epoch_losses)
        .map_err(err)
        .and_then(|()| std::fs::read(&scratch).map_err(|e| err(e.to_string())));
    let _ = std::fs::remove_file(&scratch);
    tl_nn::checkpoint::write_atomic(path, &rendered?)
        .map_err(|e| CliError::new(format!("cannot write plot {e}")))
}

static SCRATCH: AtomicU64 = AtomicU64::new(0);

/// Draw the curve into the image file `path` (its format from the extension).
fn render(
    path: &Path,
    step_losses: &[f32],
    epoch_losses: &[f32],
) -> std::result::Result<(), String> {
    let steps_per_epoch = step_losses.len() / epoch_losses.len().max(1);
    let n = step_losses.len() as f32;
    let ymax = step_losses.iter().copied().fold(0.0f32, f32::max).max(1e-6) * 1.05;
    let root = BitMapBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .build_cartesian_2d(0f32..n, 0f32..ymax)
        .map_err(|e| e.to_string())?;
    let grid = RGBColor(220, 220, 220);
    let mut y = 0.5f32;
    while y < ymax {
        chart
            .draw_series(LineSeries::new([(0.0, y), (n, y)], grid))
            .map_err(|e| e.to_string())?;
        y += 0.5;
    }
    chart
        .draw_series(LineSeries::new(
            step_losses.iter().enumerate().map(|(i, &l)| (i as f32, l)),
            RGBColor(120, 170, 230),
        ))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(
            epoch_losses
                .iter()
                .enumerate()
                .map(|(e, &l)| (((e + 1) * steps_per_epoch) as f32 - 1.0, l)),
            RED.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?;
    chart
        .plotting_area()
        .draw(&Rectangle::new([(0.0, 0.0), (n, ymax)], BLACK))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
