//! Autocast products (bf16 / TF32) on any device against the f64 reference of the rounded
//! operands (`tl_spec::precision::Precision::round`), within `tl_spec::bf16::accumulation_bound`.

use tl_spec::bf16::accumulation_bound;
use tl_tape_cuda::device::{Batch, GEMM_TILE, Gemm, TC_TILE};
use tl_tape_cuda::{Device, Precision, Result, precision};

use super::Gen;

/// One product's result and, per output element, the reference and its bound.
pub struct Case {
    pub name: String,
    pub got: Vec<f32>,
    pub want: Vec<f64>,
    pub bound: Vec<f64>,
}

impl Case {
    /// The first element outside the bound (or NaN), if any.
    pub fn miss(&self) -> Option<String> {
        let i = self
            .got
            .iter()
            .zip(self.want.iter().zip(&self.bound))
            .position(|(&g, (&w, &b))| g.is_nan() || (f64::from(g) - w).abs() > b)?;
        Some(format!(
            "{} at {i}: {} vs reference {} (bound {:e})",
            self.name, self.got[i], self.want[i], self.bound[i]
        ))
    }
}

/// The reference of `bt.count` products `op(a)·op(b)` (+ `c0`), operands read through
/// `round`, laid out as `bt` and `g` say.
fn reference(
    a: &[f32],
    b: &[f32],
    c0: Option<&[f32]>,
    bt: Batch,
    g: Gemm,
    round: impl Fn(f32) -> f32,
) -> (Vec<f64>, Vec<f64>) {
    let len = bt.count * g.m * g.n;
    let (mut want, mut bound) = (vec![0.0; len], vec![0.0; len]);
    for z in 0..bt.count {
        let (sa, la) = bt.at(0, z, g.stored(0));
        let (sb, lb) = bt.at(1, z, g.stored(1));
        let (sc, lc) = bt.at(2, z, g.stored(2));
        for i in 0..g.m {
            for j in 0..g.n {
                let (mut s, mut abs) = (0.0f64, 0.0f64);
                for p in 0..g.k {
                    let x = if g.ta {
                        a[sa + p * la + i]
                    } else {
                        a[sa + i * la + p]
                    };
                    let y = if g.tb {
                        b[sb + j * lb + p]
                    } else {
                        b[sb + p * lb + j]
                    };
                    let t = f64::from(round(x)) * f64::from(round(y));
                    s += t;
                    abs += t.abs();
                }
                let o = sc + i * lc + j;
                let c = c0.map_or(0.0, |c| f64::from(c[o]));
                want[o] = s + c;
                bound[o] = accumulation_bound(g.k, abs + c.abs());
            }
        }
    }
    (want, bound)
}

/// Every kind of device product run at `run` (installed on this thread) on `d`, each with the
/// reference at `reference`: matmul over every transpose pair on sizes that are and are not
/// multiples of 16, 64 and 128 (K < 16, K = 0, an empty output; outputs past one 128×128 tile of
/// the tensor-core kernel, with row strides that are and are not multiples of 4 for its 16-byte
/// loads), a product split along k whose last run is not a multiple of 16 (one tile, and several
/// with `matmul_acc`; a `bmm` split only as the kernel counts its 128×128 tiles), `matmul_acc`,
/// `bmm`, and `bmm_heads` with head-merged operands (matrices
/// whose starts are and are not 16-byte aligned, groups of four that cross the matrix's edge).
pub fn product_cases<D: Device>(
    d: &mut D,
    run: Precision,
    reference_at: Precision,
) -> Result<Vec<Case>> {
    let _p = precision::install(run);
    let mut rnd = Gen::new(0x7c0 + run as u64);
    let mut data =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rnd.range(-2.0, 2.0) as f32).collect() };
    let mut cases = Vec::new();
    let mut one = |d: &mut D,
                   name: String,
                   bt: Batch,
                   g: Gemm,
                   acc: bool,
                   (av, bv, cv): (Vec<f32>, Vec<f32>, Vec<f32>)|
     -> Result<()> {
        let (a, b) = (d.upload(&av)?, d.upload(&bv)?);
        let out = match (acc, bt.heads > 1 || bt.merged.iter().any(|&m| m)) {
            (true, _) => {
                let c = d.upload(&cv)?;
                d.matmul_acc(c, a, b, g)?;
                c
            }
            (false, true) => d.bmm_heads(a, b, bt, g)?,
            (false, false) if bt.count == 1 => d.matmul(a, b, g)?,
            (false, false) => d.bmm(a, b, bt.count, g)?,
        };
        let got = d.download(out)?;
        d.release_all([a, b, out]);
        let (want, bound) = reference(&av, &bv, acc.then_some(&cv[..]), bt, g, |x| {
            reference_at.round(x)
        });
        cases.push(Case {
            name,
            got,
            want,
            bound,
        });
        Ok(())
    };
    for (m, k, n) in [
        (1, 1, 1),
        (3, 0, 4),
        (0, 4, 3),
        (5, 7, 3),
        (16, 16, 16),
        (17, 31, 65),
        (70, 13, 75),
        (132, 40, 200),
        (129, 17, 130),
        (1, 24, 257),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let g = Gemm::nn(m, k, n).with_t(ta, tb);
            let ops = (data(m * k), data(k * n), Vec::new());
            one(
                d,
                format!("matmul {m}x{k}x{n} ta={ta} tb={tb}"),
                Batch::plain(1),
                g,
                false,
                ops,
            )?;
        }
    }
    // Split along k (one 128×128 tile, k = 1000): runs of 144, the last of 136 (padded).
    let g = Gemm::nn(16, 1000, 24);
    let kc = g.k_chunk_tiled(1, TC_TILE);
    assert!(g.k_splits_tiled(1, TC_TILE) > 1 && !(1000 % kc).is_multiple_of(16));
    let ops = (data(16 * 1000), data(1000 * 24), Vec::new());
    one(d, "matmul split k".into(), Batch::plain(1), g, false, ops)?;
    for (m, k, n) in [(70, 13, 75), (133, 20, 131)] {
        let g = Gemm::nn(m, k, n).with_t(false, true);
        let ops = (data(m * k), data(k * n), data(m * n));
        one(
            d,
            format!("matmul_acc {m}x{k}x{n}"),
            Batch::plain(1),
            g,
            true,
            ops,
        )?;
    }
    // Split along k over 2×2 128×128 tiles (k = 600: runs of 160, the last of 120), into.
    let g = Gemm::nn(130, 600, 140).with_t(true, true);
    let kc = g.k_chunk_tiled(1, TC_TILE);
    assert!(g.k_splits_tiled(1, TC_TILE) > 1 && !(600 % kc).is_multiple_of(16));
    let ops = (data(130 * 600), data(600 * 140), data(130 * 140));
    one(
        d,
        "matmul_acc split k".into(),
        Batch::plain(1),
        g,
        true,
        ops,
    )?;
    let g = Gemm::nn(9, 20, 11).with_t(true, false);
    let ops = (data(3 * 9 * 20), data(3 * 20 * 11), Vec::new());
    one(d, "bmm".into(), Batch::plain(3), g, false, ops)?;
    let g = Gemm::nn(130, 20, 132);
    let ops = (data(2 * 130 * 20), data(2 * 20 * 132), Vec::new());
    one(d, "bmm 130x20x132".into(), Batch::plain(2), g, false, ops)?;
    // Split along k only as the tensor-core kernel counts its tiles: 16 products of 65×70 are
    // 64 tiles of 64 (the f32 GEMM's count: no split) but 16 of 128: runs of 160 and 140.
    let g = Gemm::nn(65, 300, 70).with_t(false, true);
    assert_eq!(g.k_splits_tiled(16, GEMM_TILE), 1);
    assert_eq!(g.k_chunk_tiled(16, TC_TILE), 160);
    let ops = (data(16 * 65 * 300), data(16 * 70 * 300), Vec::new());
    one(
        d,
        "bmm split k 16x65x300x70".into(),
        Batch::plain(16),
        g,
        false,
        ops,
    )?;
    let g = Gemm::nn(5, 8, 4).with_t(false, true);
    let bt = Batch::heads(2, 3, [true, true, true]);
    let ops = (data(6 * 5 * 8), data(6 * 4 * 8), Vec::new());
    one(d, "bmm_heads".into(), bt, g, false, ops)?;
    // Two heads of 6 columns (row stride 12, head 1's start 6 floats in) and of 130 / 140.
    for (ta, tb) in [(false, true), (true, false)] {
        let g = Gemm::nn(130, 6, 140).with_t(ta, tb);
        let bt = Batch::heads(1, 2, [true, true, true]);
        let ops = (data(2 * 130 * 6), data(2 * 6 * 140), Vec::new());
        one(
            d,
            format!("bmm_heads 130x6x140 ta={ta} tb={tb}"),
            bt,
            g,
            false,
            ops,
        )?;
    }
    Ok(cases)
}
