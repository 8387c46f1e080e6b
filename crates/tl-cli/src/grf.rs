//! Gaussian random fields on the periodic interval (0, 1): the initial conditions of the FNO
//! paper's Burgers data set ([`crate::fno_paper`]).
//!
//! The field with covariance operator `C = σ²(−Δ + τ²I)^(−γ)` and mean zero, by its
//! Karhunen–Loève expansion in the eigenfunctions of −Δ on (0, 1) (orthonormal in L²(0, 1):
//! `√2 cos 2πkx`, `√2 sin 2πkx`, eigenvalue 4π²k²):
//!
//! `u(x) = Σ_{k=1}^{K} √λ_k (ξ_k √2 cos 2πkx + η_k √2 sin 2πkx)`,
//! `λ_k = σ² (4π²k² + τ²)^(−γ)`, ξ_k, η_k independent standard normals,
//!
//! on a grid of n points with K = n/2 − 1 (every bin below the Nyquist bin; the constant mode is
//! left out: m = 0). This is the paper's `GRF1(N, m = 0, gamma, tau, sigma, "periodic")`
//! (data_generation/burgers/GRF1.m of the FNO repository, whose eigenvalues are
//! `√2·σ·((2πk)² + τ²)^(−γ/2)`, the `√(2λ_k)` above; its shift by 1/2 does not change the law).
//! With σ = 25, τ = 5, γ = 2 the covariance is the paper's `625(−Δ + 25I)^(−2)`.
//!
//! Each bin's expected power is `E|û_k/n|² = λ_k` (û the unnormalised DFT), which the tests
//! check against the sample mean of many draws.

use tl_fft::Complex;

use crate::burgers::{Draws, Solver};

/// A Gaussian random field's covariance `σ²(−Δ + τ²I)^(−γ)` on (0, 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grf {
    /// σ (the covariance scales as σ²).
    pub sigma: f64,
    /// τ (the shift τ²I).
    pub tau: f64,
    /// γ (the power).
    pub gamma: f64,
}

/// The FNO paper's field: `N(0, 625(−Δ + 25I)^(−2))`.
pub const PAPER_GRF: Grf = Grf {
    sigma: 25.0,
    tau: 5.0,
    gamma: 2.0,
};

impl Grf {
    /// λ_k, the covariance's eigenvalue at wavenumber k (k ≥ 1): `σ²(4π²k² + τ²)^(−γ)`.
    pub fn eigenvalue(&self, k: usize) -> f64 {
        let kappa = 2.0 * std::f64::consts::PI * k as f64;
        self.sigma * self.sigma * (kappa * kappa + self.tau * self.tau).powf(-self.gamma)
    }

    /// One draw on `solver`'s grid (which must cover (0, 1)'s n points `j/n`): for k = 1, 2, …,
    /// n/2 − 1 in turn, ξ_k then η_k from `rng`.
    pub fn sample(&self, solver: &Solver, rng: &mut Draws) -> Vec<f64> {
        let n = solver.grid();
        let mut uh = vec![Complex::new(0.0, 0.0); n / 2 + 1];
        for (k, bin) in uh.iter_mut().enumerate().take(n / 2).skip(1) {
            let (xi, eta) = (rng.normal(), rng.normal());
            let a = n as f64 * (2.0 * self.eigenvalue(k)).sqrt() / 2.0;
            // u_j = (2/n)·Re(û_k e^{2πijk/n}) = √(2λ_k)(ξ cos + η sin) for û_k = a(ξ − iη).
            *bin = Complex::new(a * xi, -a * eta);
        }
        solver.to_physical(&uh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eigenvalues_are_the_papers_covariance() {
        let l1 = 625.0 / (4.0 * std::f64::consts::PI.powi(2) + 25.0).powi(2);
        assert!((PAPER_GRF.eigenvalue(1) - l1).abs() < 1e-15, "{l1}");
        assert!(PAPER_GRF.eigenvalue(2) < PAPER_GRF.eigenvalue(1) / 5.0);
    }

    /// The sample mean of |û_k/n|² over 4000 draws is λ_k within 8% (a sample mean of an
    /// exponential variable: standard error 1/√4000 ≈ 1.6%, so 8% is five of them), for every
    /// bin below Nyquist; the constant and Nyquist bins are empty; the pointwise variance is
    /// Σ 2λ_k.
    #[test]
    fn the_spectrum_matches_the_covariance() {
        let n = 32;
        let solver = Solver::on(n, 0.1, 1.0);
        let mut rng = Draws::new(11);
        let draws = 4000;
        let mut power = vec![0.0; n / 2 + 1];
        let mut var = 0.0;
        for _ in 0..draws {
            let u = PAPER_GRF.sample(&solver, &mut rng);
            var += u.iter().map(|v| v * v).sum::<f64>() / n as f64;
            for (p, c) in power.iter_mut().zip(solver.to_spectral(&u)) {
                *p += (c / n as f64).norm_sqr() / draws as f64;
            }
        }
        assert!(power[0] < 1e-28 && power[n / 2] < 1e-28, "{power:?}");
        for (k, p) in power.iter().enumerate().take(n / 2).skip(1) {
            let want = PAPER_GRF.eigenvalue(k);
            assert!((p / want - 1.0).abs() < 0.08, "bin {k}: {p} vs λ = {want}");
        }
        let want: f64 = (1..n / 2).map(|k| 2.0 * PAPER_GRF.eigenvalue(k)).sum();
        let got = var / draws as f64;
        assert!((got / want - 1.0).abs() < 0.08, "variance {got} vs {want}");
    }

    #[test]
    fn normals_have_mean_zero_and_variance_one() {
        let mut rng = Draws::new(3);
        let xs: Vec<f64> = (0..20000).map(|_| rng.normal()).collect();
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        let v = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / xs.len() as f64;
        // Standard errors: 0.007 (mean), 0.01 (variance).
        assert!(m.abs() < 0.035 && (v - 1.0).abs() < 0.05, "{m} {v}");
    }
}
