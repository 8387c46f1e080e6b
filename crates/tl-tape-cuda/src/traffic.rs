//! [`Traffic`]: what a device has been asked to do since it was made — kernel launches and
//! host↔device copies — the GPU cost proxies of a training step that can be counted without a
//! GPU (docs/performance.md, "GPU proxies").
//!
//! Both devices count at the point where the work happens: the CUDA device (and the kernel
//! emulator, which runs the same launch code) at every kernel launch and every copy; the
//! simulation device at every primitive it runs and every copy. A primitive is one kernel on
//! the device except the full reductions (`reduce_sum`, `reduce_mean`, `mse_loss`: a partials
//! pass and a final pass, or an atomic pass plus a division) and the few primitives that chain
//! kernels, so the sim's launch count is a lower bound of the device's; the emulator gives the
//! exact figure (`--features cuda-emu`). PyTorch comparison: the kernel and memcpy rows of
//! `torch.profiler`.

use std::cell::Cell;
use std::ops::Sub;

/// Counters of kernel launches and host↔device copies. Subtract two readings for the work in
/// between ([`Device::traffic`](crate::Device::traffic) before and after a step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Kernel launches (on the simulation device: primitives run; see the module docs).
    pub launches: u64,
    /// Host → device copies (`upload`).
    pub uploads: u64,
    /// Bytes copied host → device.
    pub upload_bytes: u64,
    /// Device → host copies (`download`).
    pub downloads: u64,
    /// Bytes copied device → host.
    pub download_bytes: u64,
}

impl Sub for Traffic {
    type Output = Traffic;
    /// The work between two readings (`later − earlier`, saturating at 0).
    fn sub(self, earlier: Traffic) -> Traffic {
        Traffic {
            launches: self.launches.saturating_sub(earlier.launches),
            uploads: self.uploads.saturating_sub(earlier.uploads),
            upload_bytes: self.upload_bytes.saturating_sub(earlier.upload_bytes),
            downloads: self.downloads.saturating_sub(earlier.downloads),
            download_bytes: self.download_bytes.saturating_sub(earlier.download_bytes),
        }
    }
}

/// The counters a device keeps. Interior mutability, because `download` takes `&self`; boxed,
/// so a device (held in the sessions' backend enums) stays one pointer larger, not five words.
#[derive(Debug, Default)]
pub(crate) struct TrafficCounter(Box<Cell<Traffic>>);

impl TrafficCounter {
    /// The current reading.
    pub(crate) fn get(&self) -> Traffic {
        self.0.get()
    }

    fn update(&self, f: impl FnOnce(&mut Traffic)) {
        let mut t = self.0.get();
        f(&mut t);
        self.0.set(t);
    }

    /// One kernel launch.
    pub(crate) fn launch(&self) {
        self.update(|t| t.launches += 1);
    }

    /// One host → device copy of `elements` f32 values.
    pub(crate) fn upload(&self, elements: usize) {
        self.update(|t| {
            t.uploads += 1;
            t.upload_bytes += 4 * elements as u64;
        });
    }

    /// One device → host copy of `elements` f32 values.
    pub(crate) fn download(&self, elements: usize) {
        self.update(|t| {
            t.downloads += 1;
            t.download_bytes += 4 * elements as u64;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_differences() {
        let c = TrafficCounter::default();
        c.launch();
        let before = c.get();
        c.launch();
        c.upload(3);
        c.download(5);
        c.download(1);
        let d = c.get() - before;
        assert_eq!(
            d,
            Traffic {
                launches: 1,
                uploads: 1,
                upload_bytes: 12,
                downloads: 2,
                download_bytes: 24,
            }
        );
        assert_eq!(before - c.get(), Traffic::default(), "saturates at 0");
    }
}
