//! The plans of `tl_fft`, through the library as its users link it (an integration test: a
//! unit-test build of the crate would compile rustfft's planner a second time, which is what
//! the crate exists to avoid; its `[lib]` has `test = false`).

use tl_fft::Real;

/// A round trip through both plans returns `n` times the input, at odd and even lengths
/// (realfft's two code paths) and for both types; a cosine lands in its bin.
#[test]
fn forward_then_inverse_scales_by_n_and_a_cosine_lands_in_its_bin() {
    fn check<F: Real + Into<f64>>(n: usize, tol: f64) {
        let plans = F::plans(n);
        let x: Vec<F> = (0..n)
            .map(|t| {
                let angle = 2.0 * std::f64::consts::PI * 3.0 * t as f64 / n as f64;
                F::from_f64(angle.cos() + 0.25).unwrap_or_else(F::zero)
            })
            .collect();
        let mut spectrum = plans.forward.make_output_vec();
        plans
            .forward
            .process(&mut x.clone(), &mut spectrum)
            .unwrap();
        assert_eq!(spectrum.len(), n / 2 + 1);
        let at = |k: usize| -> (f64, f64) { (spectrum[k].re.into(), spectrum[k].im.into()) };
        let (dc, bin3, bin2) = (at(0), at(3), at(2));
        assert!(
            (dc.0 - 0.25 * n as f64).abs() < tol * n as f64,
            "{n}: dc {dc:?}"
        );
        assert!(
            (bin3.0 - 0.5 * n as f64).abs() < tol * n as f64,
            "{n}: bin 3 {bin3:?}"
        );
        assert!(
            bin2.0.abs().max(bin2.1.abs()) < tol * n as f64,
            "{n}: bin 2 {bin2:?}"
        );
        let mut back = plans.inverse.make_output_vec();
        plans.inverse.process(&mut spectrum, &mut back).unwrap();
        for (t, (&b, &x)) in back.iter().zip(&x).enumerate() {
            let (b, x): (f64, f64) = (b.into(), x.into());
            assert!(
                (b - n as f64 * x).abs() < tol * n as f64,
                "{n}: t {t}: {b} vs {x}"
            );
        }
    }
    for n in [8, 15, 64, 97] {
        check::<f32>(n, 1e-5);
        check::<f64>(n, 1e-12);
    }
}
