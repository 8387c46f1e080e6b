//! `spectralConv1dRfft` against a naive O(grid²) complex DFT written here from SEMANTICS.md
//! (forward transform of the kept bins, complex channel mix, Hermitian extension, inverse
//! transform, real part), on the IR (f64) and the CPU tape (f64 and f32); modes = grid/2 + 1 on
//! even and odd grids; modes out of range is an error; linearity in x.

use tl_ir::{GraphBuilder, Op, rules};
use tl_spec::{Scalar, Tensor};
use tl_tape_cpu::Tape;

type C = (f64, f64);

fn cmul(a: C, b: C) -> C {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

/// The definition, literally: y = Re(ifft(H)) where H holds Z[k] for k < modes, conj(Z[k]) at
/// N − k (the Hermitian mirror, not duplicated for the Nyquist bin), zeros elsewhere.
fn naive(x: &[f64], wr: &[f64], wi: &[f64], n: usize, w: usize, modes: usize) -> Vec<f64> {
    let tau = 2.0 * std::f64::consts::PI;
    let mut full = vec![vec![(0.0, 0.0); w]; n];
    for k in 0..modes {
        for o in 0..w {
            let mut z = (0.0, 0.0);
            for c in 0..w {
                let mut xk = (0.0, 0.0);
                for t in 0..n {
                    let a = -tau * (k * t) as f64 / n as f64;
                    xk.0 += x[t * w + c] * a.cos();
                    xk.1 += x[t * w + c] * a.sin();
                }
                let wk = (wr[(k * w + c) * w + o], wi[(k * w + c) * w + o]);
                let p = cmul(xk, wk);
                z = (z.0 + p.0, z.1 + p.1);
            }
            full[k][o] = z;
            if k > 0 && n - k != k {
                full[n - k][o] = (z.0, -z.1);
            }
        }
    }
    let mut y = vec![0.0; n * w];
    for t in 0..n {
        for o in 0..w {
            let mut s = 0.0;
            for (k, row) in full.iter().enumerate() {
                let a = tau * (k * t) as f64 / n as f64;
                s += cmul(row[o], (a.cos(), a.sin())).0;
            }
            y[t * w + o] = s / n as f64;
        }
    }
    y
}

fn draw(len: usize, salt: usize) -> Vec<f64> {
    (0..len)
        .map(|i| (((i + 1) * (salt * 7 + 13)) as f64 * 0.618).sin() * 1.5)
        .collect()
}

fn cpu<T: Scalar>(op: &Op, args: &[Tensor<f64>]) -> Tensor<f64> {
    let mut tape = Tape::<T>::new();
    let ids: Vec<usize> = args
        .iter()
        .map(|a| tape.leaf(a.cast(), None, true))
        .collect();
    let y = tape.apply(op, &ids).unwrap();
    tape.get(y).unwrap().cast()
}

fn max_err(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max)
}

#[test]
fn matches_the_naive_dft_for_every_mode_count_on_even_and_odd_grids() {
    for (n, w) in [(8usize, 3usize), (9, 2), (2, 2), (1, 1), (16, 4)] {
        for modes in 1..=n / 2 + 1 {
            let x = draw(n * w, n);
            let (wr, wi) = (draw(modes * w * w, 3), draw(modes * w * w, 4));
            let want = naive(&x, &wr, &wi, n, w, modes);
            let args = [
                Tensor::new([n, w], x).unwrap(),
                Tensor::new([modes, w, w], wr).unwrap(),
                Tensor::new([modes, w, w], wi).unwrap(),
            ];
            let op = Op::SpectralConv1dRfft { modes };
            let refs: Vec<&Tensor<f64>> = args.iter().collect();
            let spec = rules::value(&op, &refs, &[]).unwrap();
            let what = format!("grid {n}, width {w}, modes {modes}");
            assert!(max_err(spec.data(), &want) < 1e-12, "spec, {what}");
            assert!(
                max_err(cpu::<f64>(&op, &args).data(), &want) < 1e-12,
                "cpu f64, {what}"
            );
            assert!(
                max_err(cpu::<f32>(&op, &args).data(), &want) < 1e-4,
                "cpu f32, {what}"
            );
        }
    }
}

#[test]
fn batched_input_is_the_op_on_each_slice() {
    let (b, n, w, modes) = (3usize, 6usize, 2usize, 4usize);
    let x = draw(b * n * w, 5);
    let (wr, wi) = (draw(modes * w * w, 6), draw(modes * w * w, 7));
    let op = Op::SpectralConv1dRfft { modes };
    let wt = |v: &[f64]| Tensor::new([modes, w, w], v.to_vec()).unwrap();
    let y = cpu::<f64>(
        &op,
        &[Tensor::new([b, n, w], x.clone()).unwrap(), wt(&wr), wt(&wi)],
    );
    for (s, ys) in x.chunks(n * w).zip(y.data().chunks(n * w)) {
        assert!(max_err(ys, &naive(s, &wr, &wi, n, w, modes)) < 1e-12);
    }
}

#[test]
fn modes_beyond_the_half_spectrum_and_bad_weights_are_errors() {
    for (n, bad) in [(8usize, 6usize), (9, 6), (4, 0)] {
        let mut g = GraphBuilder::new();
        let x = g.leaf([n, 2], None).unwrap();
        let wr = g.leaf([bad, 2, 2], None).unwrap();
        let wi = g.leaf([bad, 2, 2], None).unwrap();
        let e = g
            .apply(Op::SpectralConv1dRfft { modes: bad }, &[x, wr, wi])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("spectralConv1dRfft") && e.contains("modes"),
            "{e}"
        );
    }
    let mut g = GraphBuilder::new();
    let x = g.leaf([8, 2], None).unwrap();
    let wr = g.leaf([3, 2, 2], None).unwrap();
    let wi = g.leaf([3, 2, 3], None).unwrap();
    let e = g
        .apply(Op::SpectralConv1dRfft { modes: 3 }, &[x, wr, wi])
        .unwrap_err()
        .to_string();
    assert!(e.contains("wIm") && e.contains("[3, 2, 3]"), "{e}");
}

#[test]
fn is_linear_in_x() {
    let (n, w, modes) = (10usize, 3usize, 4usize);
    let wt = |s: usize| Tensor::new([modes, w, w], draw(modes * w * w, s)).unwrap();
    let (wr, wi) = (wt(1), wt(2));
    let x1 = Tensor::new([n, w], draw(n * w, 8)).unwrap();
    let x2 = Tensor::new([n, w], draw(n * w, 9)).unwrap();
    let mix = x1.zip_map("t", &x2, |a, b| 2.5 * a - 0.75 * b).unwrap();
    let op = Op::SpectralConv1dRfft { modes };
    let f = |x: &Tensor<f64>| cpu::<f64>(&op, &[x.clone(), wr.clone(), wi.clone()]);
    let (y1, y2, ym) = (f(&x1), f(&x2), f(&mix));
    let lin: Vec<f64> = y1
        .data()
        .iter()
        .zip(y2.data())
        .map(|(a, b)| 2.5 * a - 0.75 * b)
        .collect();
    assert!(max_err(ym.data(), &lin) < 1e-12);
    assert!(
        y1.data().iter().any(|v| v.abs() > 0.1),
        "a non-trivial output"
    );
}
