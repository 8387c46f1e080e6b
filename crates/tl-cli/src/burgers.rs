//! The FNO's data: the 1-D viscous Burgers' equation `u_t + u u_x = ν u_xx` on a periodic
//! interval [0, L) (L = 2π for `tl train --model fno`'s own data set, L = 1 for the FNO paper's,
//! [`crate::fno_paper`]), solved pseudo-spectrally on a uniform grid.
//!
//! - Space: real FFT (`realfft`, planned in `tl_fft`), bins k = 0..=grid/2 with wavenumbers
//!   κ = 2πk/L; the nonlinear term in conservative form `−(iκ/2)·FFT(u²)`, dealiased by the 2/3
//!   rule (bins k > grid/3 zeroed).
//! - Time: fourth-order Runge–Kutta with an integrating factor `e^{−νκ²t}` for the stiff viscous
//!   term (IFRK4), fixed step `dt`.
//! - Initial conditions: random smooth fields `Σ_{k=1..4} (a_k cos kx + b_k sin kx)/k²`, with
//!   a_k, b_k uniform in ±1 from a fixed seed, scaled to a maximum of 1 on the grid.

use std::sync::Arc;
use tl_fft::{Complex, ComplexToReal, Real, RealToComplex};

/// The stream of uniform draws behind the initial conditions: SplitMix64 stepped by its
/// increment from `seed` (output `k` is `splitmix64(seed + k·0x9E37…)`), the top 53 bits of each
/// output as a uniform in `[0, 1)`.
pub struct Draws(u64);

impl Draws {
    /// The stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Draws(seed)
    }

    /// A uniform value in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let bits = tl_spec::rng::splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        lo + (hi - lo) * ((bits >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// A standard normal value (Box–Muller on two uniforms; the first uniform is taken from
    /// `(0, 1]` so its logarithm is finite).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(0.0, 1.0);
        let u2 = self.uniform(0.0, 1.0);
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Viscosity ν of the dataset.
pub const NU: f64 = 0.1;
/// Final time T of the dataset's pairs (u0 → u(T)).
pub const T_END: f64 = 1.0;
/// Time step of the dataset's solver.
pub const DT: f64 = 0.01;
/// Grid points of the dataset.
pub const GRID: usize = 64;

/// A pseudo-spectral Burgers' solver on `grid` points.
pub struct Solver {
    grid: usize,
    nu: f64,
    /// 2π/L: bin k has wavenumber `k·wave`.
    wave: f64,
    fwd: Arc<dyn RealToComplex<f64>>,
    inv: Arc<dyn ComplexToReal<f64>>,
}

impl Solver {
    /// A solver on `grid` (even, ≥ 4) points of [0, 2π) with viscosity `nu`.
    pub fn new(grid: usize, nu: f64) -> Self {
        Self::with_wave(grid, nu, 1.0)
    }

    /// A solver on `grid` (even, ≥ 4) points of the periodic interval [0, `length`) with
    /// viscosity `nu`.
    pub fn on(grid: usize, nu: f64, length: f64) -> Self {
        Self::with_wave(grid, nu, 2.0 * std::f64::consts::PI / length)
    }

    fn with_wave(grid: usize, nu: f64, wave: f64) -> Self {
        let plans = f64::plans(grid);
        Solver {
            grid,
            nu,
            wave,
            fwd: plans.forward,
            inv: plans.inverse,
        }
    }

    /// The grid's points.
    pub fn grid(&self) -> usize {
        self.grid
    }

    /// The real FFT of `u` (`grid` values): bins 0..=grid/2, unnormalised.
    pub fn to_spectral(&self, u: &[f64]) -> Vec<Complex<f64>> {
        let mut input = u.to_vec();
        let mut out = self.fwd.make_output_vec();
        // Lengths come from the plan, so the transform cannot fail.
        let _ = self.fwd.process(&mut input, &mut out);
        out
    }

    /// The inverse of [`Solver::to_spectral`] (bins 0..=grid/2 to `grid` values, divided by
    /// `grid`; the imaginary parts of the DC and Nyquist bins are ignored).
    pub fn to_physical(&self, uh: &[Complex<f64>]) -> Vec<f64> {
        let mut input = uh.to_vec();
        // The DC and Nyquist bins of a real signal are real.
        input[0].im = 0.0;
        if let Some(last) = input.last_mut() {
            last.im = 0.0;
        }
        let mut out = self.inv.make_output_vec();
        let _ = self.inv.process(&mut input, &mut out);
        let n = self.grid as f64;
        out.iter().map(|v| v / n).collect()
    }

    /// The dealiased nonlinear term `−(iκ/2)·FFT(u²)` of the spectral state.
    fn nonlinear(&self, uh: &[Complex<f64>]) -> Vec<Complex<f64>> {
        let u = self.to_physical(uh);
        let sq: Vec<f64> = u.iter().map(|v| v * v).collect();
        let w = self.to_spectral(&sq);
        let cutoff = self.grid / 3;
        w.iter()
            .enumerate()
            .map(|(k, wk)| {
                if k > cutoff {
                    Complex::new(0.0, 0.0)
                } else {
                    Complex::new(0.0, -(k as f64) * self.wave / 2.0) * wk
                }
            })
            .collect()
    }

    /// `u0` advanced to time `t_end` with steps of (at most) `dt`.
    pub fn solve(&self, u0: &[f64], t_end: f64, dt: f64) -> Vec<f64> {
        let steps = (t_end / dt).ceil().max(1.0) as usize;
        let h = t_end / steps as f64;
        let decay = |k: usize, t: f64| {
            let kappa = k as f64 * self.wave;
            (-self.nu * kappa * kappa * t).exp()
        };
        let e: Vec<f64> = (0..=self.grid / 2).map(|k| decay(k, h)).collect();
        let e2: Vec<f64> = (0..=self.grid / 2).map(|k| decay(k, h / 2.0)).collect();
        let mut uh = self.to_spectral(u0);
        let comb = |a: &[Complex<f64>], f: &dyn Fn(usize, Complex<f64>) -> Complex<f64>| {
            a.iter()
                .enumerate()
                .map(|(k, &v)| f(k, v))
                .collect::<Vec<_>>()
        };
        for _ in 0..steps {
            let k1 = comb(&self.nonlinear(&uh), &|_, v| v * h);
            let a = comb(&uh, &|k, v| (v + k1[k] / 2.0) * e2[k]);
            let k2 = comb(&self.nonlinear(&a), &|_, v| v * h);
            let b = comb(&uh, &|k, v| v * e2[k] + k2[k] / 2.0);
            let k3 = comb(&self.nonlinear(&b), &|_, v| v * h);
            let c = comb(&uh, &|k, v| v * e[k] + k3[k] * e2[k]);
            let k4 = comb(&self.nonlinear(&c), &|_, v| v * h);
            uh = comb(&uh, &|k, v| {
                v * e[k] + (k1[k] * e[k] + (k2[k] + k3[k]) * (2.0 * e2[k]) + k4[k]) / 6.0
            });
        }
        self.to_physical(&uh)
    }
}

/// The grid points `x_j = 2πj/grid`.
pub fn grid_points(grid: usize) -> Vec<f64> {
    (0..grid)
        .map(|j| 2.0 * std::f64::consts::PI * j as f64 / grid as f64)
        .collect()
}

/// A random smooth periodic field on `grid` points (see the module doc), maximum |u| = 1.
pub fn initial_condition(grid: usize, rng: &mut Draws) -> Vec<f64> {
    let coef: Vec<(f64, f64)> = (1..=4)
        .map(|_| (rng.uniform(-1.0, 1.0), rng.uniform(-1.0, 1.0)))
        .collect();
    let u: Vec<f64> = grid_points(grid)
        .iter()
        .map(|&x| {
            coef.iter()
                .enumerate()
                .map(|(i, (a, b))| {
                    let k = (i + 1) as f64;
                    (a * (k * x).cos() + b * (k * x).sin()) / (k * k)
                })
                .sum()
        })
        .collect();
    let peak = u.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-12);
    u.iter().map(|v| v / peak).collect()
}

/// `n` pairs (u0, u(T)) on the dataset's grid from `seed`, each a row of [`GRID`] values.
pub fn pairs(n: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let solver = Solver::new(GRID, NU);
    let mut rng = Draws::new(seed);
    let (mut x, mut y) = (Vec::with_capacity(n * GRID), Vec::with_capacity(n * GRID));
    for _ in 0..n {
        let u0 = initial_condition(GRID, &mut rng);
        y.extend(solver.solve(&u0, T_END, DT));
        x.extend(u0);
    }
    (x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean(u: &[f64]) -> f64 {
        u.iter().sum::<f64>() / u.len() as f64
    }
    fn energy(u: &[f64]) -> f64 {
        u.iter().map(|v| v * v).sum::<f64>() / u.len() as f64
    }

    /// The draws are the reference SplitMix64 sequence (seeded with 0: e220a8397b1dcdaf,
    /// 6e789e6aa1b965f4, …), so the dataset is the one the README's FNO figures were trained on.
    #[test]
    fn draws_follow_the_reference_splitmix64_sequence() {
        let mut d = Draws::new(0);
        let unit = |bits: u64| (bits >> 11) as f64 / (1u64 << 53) as f64;
        assert_eq!(d.uniform(0.0, 1.0), unit(0xe220_a839_7b1d_cdaf));
        assert_eq!(
            d.uniform(-1.0, 1.0),
            -1.0 + 2.0 * unit(0x6e78_9e6a_a1b9_65f4)
        );
    }

    #[test]
    fn conserves_the_mean_and_decays_energy() {
        let s = Solver::new(64, NU);
        let mut rng = Draws::new(1);
        let u0: Vec<f64> = initial_condition(64, &mut rng)
            .iter()
            .map(|v| v + 0.3)
            .collect();
        let mut prev = u0.clone();
        for _ in 0..4 {
            let u = s.solve(&prev, 0.25, DT);
            assert!((mean(&u) - mean(&u0)).abs() < 1e-12, "{}", mean(&u));
            // The fluctuation's energy decays (the mean's part is conserved).
            assert!(
                energy(&u) < energy(&prev),
                "{} !< {}",
                energy(&u),
                energy(&prev)
            );
            prev = u;
        }
        assert!(
            energy(&prev) - 0.09 > 0.05,
            "not all decayed: {}",
            energy(&prev)
        );
    }

    #[test]
    fn small_amplitudes_follow_the_heat_equation() {
        // u0 = ε(sin x + cos 3x): the nonlinear term is O(ε²), so u(T) ≈ ε(e^{−νT} sin x +
        // e^{−9νT} cos 3x) with a relative error of order ε.
        let (eps, nu, t) = (1e-5, 0.1, 1.0);
        let s = Solver::new(64, nu);
        let xs = grid_points(64);
        let u0: Vec<f64> = xs
            .iter()
            .map(|&x| eps * (x.sin() + (3.0 * x).cos()))
            .collect();
        let u = s.solve(&u0, t, DT);
        for (j, &x) in xs.iter().enumerate() {
            let want = eps * ((-nu * t).exp() * x.sin() + (-9.0 * nu * t).exp() * (3.0 * x).cos());
            assert!(
                (u[j] - want).abs() < 1e-4 * eps,
                "x={x}: {} vs {want}",
                u[j]
            );
        }
    }

    #[test]
    fn a_steepening_wave_moves_like_burgers_not_like_heat() {
        // u0 = sin x: where u > 0 the profile moves right, so at T = 1 the value at x = π/2 has
        // dropped well below the heat equation's e^{−ν}, and the solution is no longer odd
        // about π/2 — a nonlinearity check with the sign of the advection.
        let s = Solver::new(64, NU);
        let xs = grid_points(64);
        let u0: Vec<f64> = xs.iter().map(|x| x.sin()).collect();
        let u = s.solve(&u0, 1.0, DT);
        let heat = (-NU).exp();
        assert!(u[16] < heat - 0.05, "u(π/2) = {} vs heat {heat}", u[16]);
        // Mass moved right of π/2: u(π/2 + 0.5) > u(π/2 − 0.5).
        assert!(u[21] > u[11], "{} vs {}", u[21], u[11]);
    }

    /// Cole–Hopf: for φ > 0 solving the heat equation φ_t = νφ_xx, u = −2νφ_x/φ solves
    /// Burgers' equation. With φ = a + Σ_k (b_k cos 2πkx + c_k sin 2πkx)·e^{−ν(2πk)²t} on (0, 1)
    /// the solution is known in closed form at every t.
    fn cole_hopf(x: f64, t: f64, nu: f64) -> f64 {
        let (a, terms) = (2.0, [(1, 0.6, 0.3), (2, 0.2, -0.4), (3, 0.0, 0.15)]);
        let tau = 2.0 * std::f64::consts::PI;
        let (mut phi, mut phi_x) = (a, 0.0);
        for (k, b, c) in terms {
            let w = tau * k as f64;
            let e = (-nu * w * w * t).exp();
            phi += (b * (w * x).cos() + c * (w * x).sin()) * e;
            phi_x += w * (-b * (w * x).sin() + c * (w * x).cos()) * e;
        }
        -2.0 * nu * phi_x / phi
    }

    /// The solver on (0, 1) with the FNO paper's ν and step reproduces the Cole–Hopf solution
    /// at T = 1 to 1e-8 (absolute; 1e-6 of u(1)'s size, 3e-8 of u0's), on 64, 256 and 8192
    /// points.
    #[test]
    fn matches_the_cole_hopf_solution_on_the_unit_interval() {
        let (nu, dt) = (0.1, crate::fno_paper::PAPER_DT);
        for n in [64, 256, 8192] {
            let s = Solver::on(n, nu, 1.0);
            let xs: Vec<f64> = (0..n).map(|j| j as f64 / n as f64).collect();
            let u0: Vec<f64> = xs.iter().map(|&x| cole_hopf(x, 0.0, nu)).collect();
            let u = s.solve(&u0, 1.0, dt);
            let want: Vec<f64> = xs.iter().map(|&x| cole_hopf(x, 1.0, nu)).collect();
            let size = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            let err = u
                .iter()
                .zip(&want)
                .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(size > 1e-3, "a trivial solution: {size}");
            // u0's size is about 0.4, u(1)'s 0.008 (ν = 0.1 on (0, 1) damps mode 1 by e^{−0.4π²}).
            assert!(
                err < 1e-8 && err < 1e-6 * size,
                "n = {n}: max error {err:e} of {size}"
            );
        }
    }

    #[test]
    fn pairs_are_deterministic_and_bounded() {
        let (x, y) = pairs(3, 7);
        assert_eq!((x.len(), y.len()), (3 * GRID, 3 * GRID));
        assert_eq!(pairs(3, 7), (x.clone(), y.clone()));
        assert!(x.iter().all(|v| v.abs() <= 1.0 + 1e-12));
        assert!(y.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
    }
}
