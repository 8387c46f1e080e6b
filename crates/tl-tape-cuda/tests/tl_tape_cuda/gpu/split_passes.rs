//! The sim counts what the CUDA device's split passes cost: where a product splits along k or
//! a norm splits its sums over blocks, the device runs a second kernel and takes a pool
//! workspace for the parts; the sim computes the parts in host temporaries but counts the same
//! launches and the same pool allocations, frees, fresh allocations and peak, so the step
//! proxies (`gpu_proxies`, docs/performance.md) are the device's. Each case runs on a fresh
//! device of each kind and compares the two counts.

use tl_tape_cuda::device::NormLayout;
use tl_tape_cuda::{Device, Gemm, Precision, Result, SimDevice};

use super::gpu;
use crate::conv_implicit;

/// Launches, pool allocations, frees, fresh device allocations and the pool's peak bytes.
type Counts = [u64; 5];

fn counts<D: Device>(d: &D) -> Counts {
    let u = d.memory_usage();
    [
        d.traffic().launches,
        u.alloc_count,
        u.free_count,
        u.device_alloc_count,
        u.peak_bytes as u64,
    ]
}

/// `f` on a fresh `D`: what it cost.
fn cost<D: Device>(mut d: D, f: &dyn Fn(&mut dyn FnDevice) -> Result<()>) -> Counts {
    f(&mut d).unwrap();
    counts(&d)
}

/// The operations a case runs, object-safe over both devices.
trait FnDevice {
    fn matmul(&mut self, a: &[f32], b: &[f32], g: Gemm) -> Result<()>;
    fn matmul_acc(&mut self, a: &[f32], b: &[f32], g: Gemm) -> Result<()>;
    fn norm(&mut self, x: &[f32], l: NormLayout) -> Result<()>;
    fn conv_dw(&mut self, c: &conv_implicit::Case, g: &[f32], x: &[f32]) -> Result<()>;
}

impl<D: Device> FnDevice for D {
    fn matmul(&mut self, a: &[f32], b: &[f32], g: Gemm) -> Result<()> {
        let (a, b) = (self.upload(a)?, self.upload(b)?);
        let c = self.matmul(a, b, g)?;
        self.release_all([a, b, c]);
        Ok(())
    }

    fn matmul_acc(&mut self, a: &[f32], b: &[f32], g: Gemm) -> Result<()> {
        let (a, b) = (self.upload(a)?, self.upload(b)?);
        let c = self.zeros(g.m * g.n)?;
        self.matmul_acc(c, a, b, g)?;
        self.release_all([a, b, c]);
        Ok(())
    }

    /// The statistics, `batchMoments`, the input cotangent and dγ/dβ of `l`.
    fn norm(&mut self, x: &[f32], l: NormLayout) -> Result<()> {
        let f = l.features();
        let (xb, g) = (self.upload(x)?, self.upload(x)?);
        let ga = self.upload(&x[..f])?;
        let st = self.norm_stats(xb, l, 1e-5)?;
        let mo = self.norm_moments(xb, l)?;
        let dx = self.norm_bwd_x(xb, st, ga, g, l)?;
        let (dg, db) = self.norm_bwd_affine(xb, st, g, l)?;
        self.release_all([xb, g, ga, st, mo, dx, dg, db]);
        Ok(())
    }

    fn conv_dw(&mut self, c: &conv_implicit::Case, g: &[f32], x: &[f32]) -> Result<()> {
        conv_implicit::implicit_dw(self, c, g, x).map(drop)
    }
}

/// Every split kind beside its unsplit twin, in f32 and under bf16 autocast (whose products
/// split by their own tile count): the sim's counts are the emulated device's, and each split
/// case takes at least one pool allocation more than its outputs and operands (the workspace
/// the sim did not count before).
#[test]
fn the_sim_counts_the_split_passes_launches_and_workspaces() {
    let Some(_) = gpu() else { return };
    let data: Vec<f32> = (0..40_000)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    let deep = Gemm::nn(4, 8192, 4);
    let shallow = Gemm::nn(4, 16, 4);
    let (a, b) = (&data[..4 * 8192], &data[..8192 * 4]);
    let split = NormLayout::channels(2, 3, 5000);
    let unsplit = NormLayout::channels(2, 5, 100);
    assert!(split.split_parts() > 1 && split.affine_split() && unsplit.split_parts() == 1);
    let conv = conv_implicit::cases();
    let dw_split = conv.iter().find(|c| c.name == "1d dw split k").unwrap();
    let (g, x) = (
        conv_implicit::cotangent(dw_split, 3),
        conv_implicit::operands(dw_split, 3).1,
    );
    type Case<'a> = (&'a str, Box<dyn Fn(&mut dyn FnDevice) -> Result<()> + 'a>);
    let cases: Vec<Case> = vec![
        ("matmul split", Box::new(|d| d.matmul(a, b, deep))),
        (
            "matmul",
            Box::new(|d| d.matmul(&a[..64], &b[..64], shallow)),
        ),
        ("matmul_acc split", Box::new(|d| d.matmul_acc(a, b, deep))),
        (
            "matmul_acc",
            Box::new(|d| d.matmul_acc(&a[..64], &b[..64], shallow)),
        ),
        (
            "norm split",
            Box::new(|d| d.norm(&data[..2 * 3 * 5000], split)),
        ),
        ("norm", Box::new(|d| d.norm(&data[..2 * 5 * 100], unsplit))),
        ("conv dw split", Box::new(|d| d.conv_dw(dw_split, &g, &x))),
    ];
    let mut bad = Vec::new();
    for prec in [Precision::F32, Precision::Bf16] {
        let _p = tl_tape_cuda::precision::install(prec);
        for (name, f) in &cases {
            let sim = cost(SimDevice::new(), f.as_ref());
            let dev = cost(gpu().unwrap(), f.as_ref());
            if sim != dev {
                bad.push(format!(
                    "{name} {prec:?}: sim [launches, allocs, frees, fresh, peak] {sim:?}, device {dev:?}"
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // The split cases' workspaces are in the counts: one allocation more than the unsplit
    // twin's (two for the norm's statistics and moments: two workspaces each, plus one each
    // for dx and dγ/dβ).
    let sim = |i: usize| cost(SimDevice::new(), cases[i].1.as_ref());
    assert_eq!(sim(0)[1], sim(1)[1] + 1, "matmul");
    assert_eq!(sim(2)[1], sim(3)[1] + 1, "matmul_acc");
    assert_eq!(sim(4)[1], sim(5)[1] + 6, "norm");
}
