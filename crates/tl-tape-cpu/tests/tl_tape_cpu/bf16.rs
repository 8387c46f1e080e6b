//! bf16 autocast (`tl_tape_cpu::precision`): every bf16 kernel this CPU has
//! (`Bf16Kernel::available()`: the portable one today) forced in turn against the reference
//! (`tl_spec::bf16`: the exact product of the bf16-rounded operands, in f64) within the f32
//! accumulation bound, on sizes that leave every kind of ragged panel and odd k, with the
//! thread split forced on; and the tape: the default is the f32 path bit for bit, autocast
//! rounds the operands of every product, forward and backward.

use tl_ir::Op;
use tl_spec::bf16::{accumulation_bound, round};
use tl_spec::{Tensor, ops as spec};
use tl_tape_cpu::gates::{self, Gates};
use tl_tape_cpu::gemm::{matmul, rows, rows_mut};
use tl_tape_cpu::precision::{self, Bf16Kernel, Precision};
use tl_tape_cpu::{Tape, ops};

use crate::common::Rng;

fn fill(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-2.0, 2.0) as f32).collect()
}

/// One product `c ← alpha·a·b (+ c0)` through the public GEMM: bf16 on `kernel` (`None`:
/// plain f32), on `threads` threads with the split forced on from 2.
struct Product<'a> {
    dims: (usize, usize, usize),
    a: &'a [f32],
    /// Row-major (k, n), or row-major (n, k) viewed transposed when `b_t`.
    b: &'a [f32],
    b_t: bool,
    c0: Option<&'a [f32]>,
    alpha: f32,
}

impl<'a> Product<'a> {
    /// `c = a·b` (no transpose, no accumulation, α = 1).
    fn plain(dims: (usize, usize, usize), a: &'a [f32], b: &'a [f32]) -> Self {
        Product {
            dims,
            a,
            b,
            b_t: false,
            c0: None,
            alpha: 1.0,
        }
    }

    fn run(&self, kernel: Option<Bf16Kernel>, threads: usize) -> Vec<f32> {
        let (m, k, n) = self.dims;
        let mut g = Gates {
            threads: Some(threads),
            gemm_parallel_min_work: Some(0),
            ..Gates::DEFAULT
        };
        g.bf16_kernel = kernel;
        let _g = gates::force(g);
        let _p = precision::install(match kernel {
            Some(_) => Precision::Bf16,
            None => Precision::F32,
        });
        let op = Op::Matmul;
        let mut c = self
            .c0
            .map_or_else(|| vec![f32::NAN; m * n], <[f32]>::to_vec);
        let av = rows(&op, self.a, m, k).unwrap();
        let bv = match self.b_t {
            true => rows(&op, self.b, n, k).unwrap().t(),
            false => rows(&op, self.b, k, n).unwrap(),
        };
        let cv = rows_mut(&op, &mut c, m, n).unwrap();
        matmul(&op, cv, self.c0.is_some(), av, bv, self.alpha).unwrap();
        c
    }

    fn b_at(&self, l: usize, j: usize) -> f32 {
        let (_, k, n) = self.dims;
        match self.b_t {
            true => self.b[j * k + l],
            false => self.b[l * n + j],
        }
    }

    /// At each output: the reference `alpha·Σ round(a)·round(b) (+ c0)` in f64 and the bound
    /// on an f32 computation of it.
    fn reference(&self) -> Vec<(f64, f64)> {
        let (m, k, n) = self.dims;
        let mut out = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut abs) = (0.0f64, 0.0f64);
                for l in 0..k {
                    let p = f64::from(round(self.a[i * k + l])) * f64::from(round(self.b_at(l, j)));
                    s += p;
                    abs += p.abs();
                }
                let alpha = f64::from(self.alpha);
                let c0 = self.c0.map_or(0.0, |c| f64::from(c[i * n + j]));
                out.push((
                    alpha * s + c0,
                    accumulation_bound(k, alpha.abs() * abs + c0.abs()),
                ));
            }
        }
        out
    }

    /// Whether `got` is within the bound of the reference everywhere (the first miss if not).
    fn check(&self, got: &[f32]) -> Result<(), String> {
        for (idx, (&g, (want, bound))) in got.iter().zip(self.reference()).enumerate() {
            if (f64::from(g) - want).abs() > bound || g.is_nan() {
                return Err(format!(
                    "{:?} at {idx}: {g} vs reference {want} (bound {bound:e})",
                    self.dims
                ));
            }
        }
        Ok(())
    }
}

/// Sizes around 8-row and 32-column panels (one partial panel, whole ones, whole ones and a
/// partial one: the blockings a packed kernel would have), odd and even k, k = 0, 1 and long, and a
/// matrix-vector product either way.
const SHAPES: [(usize, usize, usize); 16] = [
    (1, 1, 1),
    (1, 2, 1),
    (3, 0, 4),
    (3, 1, 5),
    (7, 3, 31),
    (8, 2, 32),
    (9, 5, 33),
    (16, 64, 64),
    (17, 31, 65),
    (33, 129, 47),
    (1, 300, 70),
    (70, 300, 1),
    (5, 1001, 3),
    (40, 77, 96),
    (12, 6, 32),
    (24, 9, 64),
];

#[test]
fn every_bf16_kernel_matches_the_reference_on_every_edge() {
    let kernels = Bf16Kernel::available();
    eprintln!("bf16 kernels on this CPU: {kernels:?}");
    let mut rng = Rng(39);
    for (m, k, n) in SHAPES {
        let (a, b) = (fill(&mut rng, m * k), fill(&mut rng, k * n));
        let c_init = fill(&mut rng, m * n);
        for b_t in [false, true] {
            for (c0, alpha) in [(None, 1.0), (Some(&c_init[..]), 1.0), (None, 0.375)] {
                let p = Product {
                    dims: (m, k, n),
                    a: &a,
                    b: &b,
                    b_t,
                    c0,
                    alpha,
                };
                for &kernel in &kernels {
                    for threads in [1, 3] {
                        let got = p.run(Some(kernel), threads);
                        if let Err(e) = p.check(&got) {
                            panic!("{kernel:?}, {threads} threads, b transposed {b_t}: {e}");
                        }
                    }
                }
            }
        }
    }
}

/// The check above can tell bf16 from f32: the plain f32 product (unrounded operands) misses
/// the bound, and so does a product of truncated (not rounded) operands.
#[test]
fn the_reference_check_sees_the_rounding() {
    let mut rng = Rng(40);
    let (m, k, n) = (16, 64, 64);
    let (a, b) = (fill(&mut rng, m * k), fill(&mut rng, k * n));
    let p = Product::plain((m, k, n), &a, &b);
    assert!(p.check(&p.run(None, 1)).is_err(), "f32 passed as bf16");
    let trunc = |v: &[f32]| -> Vec<f32> {
        v.iter()
            .map(|x| f32::from_bits(x.to_bits() & 0xffff_0000))
            .collect()
    };
    let (at, bt) = (trunc(&a), trunc(&b));
    let truncated = Product {
        a: &at,
        b: &bt,
        ..p
    };
    assert!(
        p.check(&truncated.run(None, 1)).is_err(),
        "truncation passed"
    );
    for kernel in Bf16Kernel::available() {
        assert_eq!(p.check(&p.run(Some(kernel), 1)), Ok(()), "{kernel:?}");
    }
}

/// Each kernel's bits do not depend on the thread count (row panels split, sums unchanged).
#[test]
fn bf16_results_do_not_depend_on_the_thread_count() {
    let mut rng = Rng(41);
    let (m, k, n) = (70, 130, 90);
    let (a, b) = (fill(&mut rng, m * k), fill(&mut rng, k * n));
    for kernel in Bf16Kernel::available() {
        for b_t in [false, true] {
            let p = Product {
                b_t,
                ..Product::plain((m, k, n), &a, &b)
            };
            let one: Vec<u32> = p.run(Some(kernel), 1).iter().map(|v| v.to_bits()).collect();
            for t in [2, 3, 4] {
                let other: Vec<u32> = p.run(Some(kernel), t).iter().map(|v| v.to_bits()).collect();
                assert!(
                    one == other,
                    "{kernel:?} b_t {b_t}: {t} threads changed the bits"
                );
            }
        }
    }
}

/// NaN and ∞ propagate as in the f32 op on the rounded operands.
#[test]
fn nan_and_infinity_propagate() {
    // Row 0 of a has a NaN, row 1 an ∞ (times a positive column: +∞), row 2 is finite.
    let (m, k, n) = (3, 3, 2);
    let a = [f32::NAN, 1.0, 1.0, f32::INFINITY, 1.0, 2.0, 1.0, 2.0, 3.0];
    let b = [1.0, 2.0, 1.0, 1.0, 1.0, 0.5];
    for kernel in Bf16Kernel::available() {
        let p = Product::plain((m, k, n), &a, &b);
        let c = p.run(Some(kernel), 1);
        assert!(c[0].is_nan() && c[1].is_nan(), "{kernel:?}: {c:?}");
        assert_eq!(
            &c[2..],
            &[f32::INFINITY, f32::INFINITY, 6.0, 5.5],
            "{kernel:?}"
        );
    }
}

fn tensor(rng: &mut Rng, shape: &[usize]) -> Tensor<f32> {
    let n = shape.iter().product();
    Tensor::new(shape, fill(rng, n)).unwrap()
}

fn abs(t: &Tensor<f64>) -> Tensor<f64> {
    t.map(f64::abs)
}

/// `got` within the f32 accumulation bound (`terms` products) of the reference `want`, with
/// `abs_sum` the same computation on absolute values.
fn assert_within(
    what: &str,
    got: &Tensor<f32>,
    want: &Tensor<f64>,
    abs_sum: &Tensor<f64>,
    terms: usize,
) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    for (i, ((&g, &w), &s)) in got
        .data()
        .iter()
        .zip(want.data())
        .zip(abs_sum.data())
        .enumerate()
    {
        let bound = accumulation_bound(terms, s);
        assert!(
            (f64::from(g) - w).abs() <= bound,
            "{what} at {i}: {g} vs {w} (bound {bound:e})"
        );
    }
}

/// The value and the parents' gradients of `op` on a tape at `precision` (`None`: as made).
fn on_tape(
    precision: Option<Precision>,
    op: &Op,
    x: &[Tensor<f32>],
    g: &Tensor<f32>,
) -> Vec<Tensor<f32>> {
    let mut t = Tape::<f32>::new();
    if let Some(p) = precision {
        t.set_precision(p);
        assert_eq!(t.precision(), p);
    }
    let ids: Vec<_> = x.iter().map(|v| t.leaf(v.clone(), None, true)).collect();
    let y = t.apply(op, &ids).unwrap();
    let grads = t.backward_dense(y, g).unwrap();
    let mut out = vec![t.get(y).unwrap().clone()];
    out.extend(ids.iter().map(|&i| grads[i].clone()));
    out
}

fn bits(ts: &[Tensor<f32>]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| t.data().iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// The default tape gives the f32 kernels' bits; `Precision::F32` set explicitly gives the
/// same; `Bf16` gives other values (so the default is not bf16).
#[test]
fn the_default_tape_is_the_f32_path_bit_for_bit() {
    let mut rng = Rng(42);
    let attention = Op::MultiHeadAttention {
        heads: 2,
        mask: None,
        fused: true,
    };
    let cases: Vec<(Op, Vec<Tensor<f32>>, Vec<usize>)> = vec![
        (
            Op::Matmul,
            vec![tensor(&mut rng, &[5, 40]), tensor(&mut rng, &[40, 7])],
            vec![5, 7],
        ),
        (
            Op::Bmm,
            vec![tensor(&mut rng, &[2, 5, 33]), tensor(&mut rng, &[2, 33, 6])],
            vec![2, 5, 6],
        ),
        (
            Op::Linear,
            vec![
                tensor(&mut rng, &[9, 20]),
                tensor(&mut rng, &[9]),
                tensor(&mut rng, &[4, 20]),
            ],
            vec![4, 9],
        ),
        (
            Op::conv2d(1, 1),
            vec![
                tensor(&mut rng, &[4, 3, 3, 3]),
                tensor(&mut rng, &[4]),
                tensor(&mut rng, &[2, 3, 6, 6]),
            ],
            vec![2, 4, 6, 6],
        ),
        (
            attention,
            vec![
                tensor(&mut rng, &[8, 8]),
                tensor(&mut rng, &[8, 8]),
                tensor(&mut rng, &[8, 8]),
                tensor(&mut rng, &[8, 8]),
                tensor(&mut rng, &[5, 8]),
            ],
            vec![5, 8],
        ),
    ];
    for (op, x, out_shape) in cases {
        let g = tensor(&mut rng, &out_shape);
        let plain = {
            let refs: Vec<&Tensor<f32>> = x.iter().collect();
            let y = ops::forward(&op, &refs, &[]).unwrap();
            let grads = ops::backward(&op, &refs, &y, &g, &[]).unwrap();
            let mut v = vec![y];
            v.extend(grads.into_iter().map(|t| t.unwrap()));
            bits(&v)
        };
        let default = bits(&on_tape(None, &op, &x, &g));
        assert_eq!(
            default,
            plain,
            "{}: default tape vs the f32 kernels",
            op.name()
        );
        let explicit = bits(&on_tape(Some(Precision::F32), &op, &x, &g));
        assert_eq!(explicit, plain, "{}", op.name());
        assert_eq!(Tape::<f32>::new().precision(), Precision::F32);
        // The value and at least one operand's gradient change (a bias gradient is a sum of
        // the cotangent, not a product, and stays f32).
        let bf16 = bits(&on_tape(Some(Precision::Bf16), &op, &x, &g));
        assert_ne!(
            bf16[0],
            plain[0],
            "{}: value unchanged under bf16",
            op.name()
        );
        let changed = bf16[1..].iter().zip(&plain[1..]).filter(|(b, p)| b != p);
        assert!(
            changed.count() >= 1,
            "{}: gradients unchanged under bf16",
            op.name()
        );
    }
}

/// Under `Bf16` attention, whose products chain through a softmax, stays within bf16
/// tolerance of f32 and differs from it, on every bf16 kernel this CPU has. (The tape's
/// matmul, linear and conv against the reference: the conformance suite's `autocast::`, one
/// check for every tape.)
#[test]
fn autocast_attention_stays_within_bf16_of_f32() {
    let mut rng = Rng(43);
    for kernel in Bf16Kernel::available() {
        let _k = gates::force(Gates::DEFAULT.with_bf16_kernel(kernel));
        let bf16 = Some(Precision::Bf16);
        // The operands this test drew for the products now checked in the conformance suite,
        // drawn still, so that attention sees the inputs it always has (its 5% is a sanity
        // bound for these inputs, not a derived one).
        let earlier: [&[usize]; 11] = [
            &[9, 37],
            &[37, 33],
            &[9, 33],
            &[11, 45],
            &[11],
            &[6, 45],
            &[6, 11],
            &[4, 3, 3, 3],
            &[4],
            &[2, 3, 7, 6],
            &[2, 4, 7, 6],
        ];
        for shape in earlier {
            tensor(&mut rng, shape);
        }
        // attention: within a few bf16 ulps (2⁻⁸ relative) of f32, not equal to it.
        let op = Op::MultiHeadAttention {
            heads: 2,
            mask: None,
            fused: false,
        };
        let xs: Vec<_> = [[8, 8], [8, 8], [8, 8], [8, 8], [6, 8]]
            .iter()
            .map(|s| tensor(&mut rng, s))
            .collect();
        let gy = tensor(&mut rng, &[6, 8]);
        let lo = on_tape(bf16, &op, &xs, &gy);
        let hi = on_tape(None, &op, &xs, &gy);
        for (i, (l, h)) in lo.iter().zip(&hi).enumerate() {
            let scale = h.data().iter().fold(0.0f32, |s, v| s.max(v.abs()));
            let worst = l
                .data()
                .iter()
                .zip(h.data())
                .fold(0.0f32, |s, (x, y)| s.max((x - y).abs()));
            assert!(
                worst <= 0.05 * scale && worst > 0.0,
                "attention {i}: {worst} of {scale}"
            );
        }
    }
}

/// An f64 tape computes in f64 whatever its precision says.
#[test]
fn an_f64_tape_ignores_autocast() {
    let mut rng = Rng(44);
    let a: Tensor<f64> = tensor(&mut rng, &[4, 9]).cast();
    let b: Tensor<f64> = tensor(&mut rng, &[9, 3]).cast();
    let run = |p: Precision| {
        let mut t = Tape::<f64>::new();
        t.set_precision(p);
        let (ia, ib) = (
            t.leaf(a.clone(), None, false),
            t.leaf(b.clone(), None, false),
        );
        let y = t.apply(&Op::Matmul, &[ia, ib]).unwrap();
        t.get(y).unwrap().clone()
    };
    assert_eq!(run(Precision::Bf16), run(Precision::F32));
}

/// TF32 (the same code path as bf16, its own rounding): every edge shape, both layouts of `b`,
/// α and an existing output, within the accumulation bound of the TF32 reference
/// (`tl_spec::tf32`); the bf16 reference and the unrounded f32 product are not (so the check
/// sees which rounding ran); and on the tape a matmul's value and gradients.
#[test]
fn tf32_products_match_the_tf32_reference() {
    use tl_spec::tf32;
    let mut rng = Rng(45);
    let run = |p: Precision, dims: (usize, usize, usize), a: &[f32], b: &[f32], b_t: bool| {
        let (m, k, n) = dims;
        let _p = precision::install(p);
        let op = Op::Matmul;
        let mut c = vec![0.5f32; m * n];
        let av = rows(&op, a, m, k).unwrap();
        let bv = match b_t {
            true => rows(&op, b, n, k).unwrap().t(),
            false => rows(&op, b, k, n).unwrap(),
        };
        let cv = rows_mut(&op, &mut c, m, n).unwrap();
        matmul(&op, cv, true, av, bv, 0.375).unwrap();
        c
    };
    // The reference misses: (output, how far off in bounds) for a product at `round`.
    let misses = |dims: (usize, usize, usize), a: &[f32], b: &[f32], b_t: bool, got: &[f32]| {
        let (m, k, n) = dims;
        let mut worst = 0.0f64;
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut abs) = (0.0f64, 0.0f64);
                for l in 0..k {
                    let bl = if b_t { b[j * k + l] } else { b[l * n + j] };
                    let p = f64::from(tf32::round(a[i * k + l])) * f64::from(tf32::round(bl));
                    s += p;
                    abs += p.abs();
                }
                let want = 0.375 * s + 0.5;
                let bound = accumulation_bound(k, 0.375 * abs + 0.5);
                worst = worst.max((f64::from(got[i * n + j]) - want).abs() / bound);
            }
        }
        worst
    };
    for dims @ (m, k, n) in SHAPES {
        let (a, b) = (fill(&mut rng, m * k), fill(&mut rng, k * n));
        for b_t in [false, true] {
            let got = run(Precision::Tf32, dims, &a, &b, b_t);
            let w = misses(dims, &a, &b, b_t, &got);
            assert!(w <= 1.0, "tf32 {dims:?} b_t {b_t}: {w} bounds off");
        }
    }
    let dims = (16, 64, 64);
    let (a, b) = (fill(&mut rng, 16 * 64), fill(&mut rng, 64 * 64));
    for other in [Precision::F32, Precision::Bf16] {
        let got = run(other, dims, &a, &b, false);
        assert!(
            misses(dims, &a, &b, false, &got) > 1.0,
            "{other:?} passed as tf32"
        );
    }
    // The tape: matmul's value and both gradients (the cotangent rounded too).
    let (a, b, g) = (
        tensor(&mut rng, &[7, 19]),
        tensor(&mut rng, &[19, 5]),
        tensor(&mut rng, &[7, 5]),
    );
    let r = on_tape(
        Some(Precision::Tf32),
        &Op::Matmul,
        &[a.clone(), b.clone()],
        &g,
    );
    let (ar, br, gr) = (
        tf32::round_tensor(&a).unwrap(),
        tf32::round_tensor(&b).unwrap(),
        tf32::round_tensor(&g).unwrap(),
    );
    let t = |x: &Tensor<f64>| spec::shape::transpose2d(x).unwrap();
    let mm = |x: &Tensor<f64>, y: &Tensor<f64>| spec::linalg::matmul(x, y).unwrap();
    assert_within(
        "tf32 matmul",
        &r[0],
        &mm(&ar, &br),
        &mm(&abs(&ar), &abs(&br)),
        19,
    );
    assert_within(
        "tf32 da",
        &r[1],
        &mm(&gr, &t(&br)),
        &mm(&abs(&gr), &t(&abs(&br))),
        5,
    );
    assert_within(
        "tf32 db",
        &r[2],
        &mm(&t(&ar), &gr),
        &mm(&t(&abs(&ar)), &abs(&gr)),
        7,
    );
}
