//! [`SpectralConv1d`]: the Fourier layer of a 1-D Fourier neural operator (Li et al. 2021).

use tl_session::{Param, Train};
use tl_spec::Shape;

use super::At;
use crate::error::usage;
use crate::{Init, Module, Parameters, Result, Var, Vars};

/// The FNO's spectral convolution over a channels-last field x (grid, width) or
/// (B, grid, width): real FFT along the grid, keep the first `modes` bins, multiply each kept
/// bin's `width` channels by its own complex (width, width) matrix `weight_re + i·weight_im`,
/// inverse real FFT back to the grid. The output has x's shape. The weights are (modes, width,
/// width), indexed (bin, in, out), drawn uniform in `[0, 1/width²)` as the reference FNO code
/// does (`scale * torch.rand(...)`, `scale = 1/(in·out)`). `modes` must lie in
/// `1..=grid/2 + 1` (checked when the op is recorded). PyTorch: the reference `SpectralConv1d`
/// of `neuraloperator` with channels last.
#[derive(Debug, Clone)]
pub struct SpectralConv1d {
    /// Real parts (modes, width, width), named `weight_re`.
    pub weight_re: Param,
    /// Imaginary parts (modes, width, width), named `weight_im`.
    pub weight_im: Param,
    /// Kept real-FFT bins.
    pub modes: usize,
}

impl SpectralConv1d {
    /// A spectral convolution over `width` channels keeping `modes` bins.
    pub fn new<O: Train>(vars: &Vars<'_, O>, width: usize, modes: usize) -> Result<Self> {
        if width == 0 || modes == 0 {
            return Err(usage(
                "SpectralConv1d::new",
                format!("need width ≥ 1 and modes ≥ 1, got width {width}, modes {modes}"),
            ));
        }
        // The weights' size checked first: width² then cannot overflow.
        let dims = [modes, width, width];
        tl_spec::alloc::check_shape::<O::T>("SpectralConv1d::new", &Shape::new(&dims))?;
        let init = Init::Uniform {
            lo: 0.0,
            hi: 1.0 / (width * width) as f64,
        };
        Ok(SpectralConv1d {
            weight_re: vars.param("weight_re", &dims, init)?,
            weight_im: vars.param("weight_im", &dims, init)?,
            modes,
        })
    }
}

impl Parameters for SpectralConv1d {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight_re);
        f(&self.weight_im);
    }
    fn extra_repr(&self) -> String {
        format!(
            "width={}, modes={}",
            self.weight_re.shape().dims().get(1).copied().unwrap_or(0),
            self.modes
        )
    }
}

impl<O: Train> Module<O> for SpectralConv1d {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let (re, im) = (g.param(&self.weight_re)?, g.param(&self.weight_im)?);
        let modes = self.modes;
        let at = At::new(g.rt, self, &self.weight_re);
        // A public field: a weight of another rank is an error naming the layer.
        let layout = "(modes, width, width)";
        let what = "SpectralConv1d::forward";
        let width = at.param_dims(what, "weight_re", &self.weight_re, 3..=3, layout)?[1];
        if !matches!(x.dims(), [_, w] | [_, _, w] if *w == width) {
            return Err(at.input(format!(
                "input {} must be (grid, {width}) or (B, grid, {width}): channels last",
                x.shape()
            )));
        }
        x.op("SpectralConv1d::forward", &[&re, &im], |s| {
            s.spectral_conv1d_rfft(x.tensor_ref(), re.tensor_ref(), im.tensor_ref(), modes)
        })
        .map_err(|e| at.op_error(e))
    }
}

#[cfg(test)]
mod tests {
    use tl_session::{LinkedSession, Options, Session};
    use tl_spec::Tensor;

    use super::*;
    use crate::Runtime;

    /// A field of `grid` points and `width` channels: channel c is `cos(k_c·2πt/grid)`.
    fn field(grid: usize, freqs: &[usize]) -> Tensor<f64> {
        let w = freqs.len();
        Tensor::from_fn([1, grid, w], |i| {
            let (t, c) = (i / w, i % w);
            let a = 2.0 * std::f64::consts::PI * (freqs[c] * t) as f64 / grid as f64;
            a.cos()
        })
    }

    #[test]
    fn keeps_the_low_modes_scales_them_and_drops_the_rest() {
        let rt = Runtime::new(Session::<f64>::new(Options::default()).unwrap());
        let layer = SpectralConv1d::new(&rt.vars().pp("spec"), 2, 3).unwrap();
        let names: Vec<String> = rt.named_params().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["spec.weight_re", "spec.weight_im"]);
        // The initial weights lie in [0, 1/width²).
        let w0 = rt.value_of(&layer.weight_re).unwrap();
        assert!(w0.data().iter().all(|&v| (0.0..0.25).contains(&v)));
        assert!(w0.data().iter().any(|&v| v != w0.data()[0]));
        // Weights: identity·2 on every kept bin (real), zero imaginary part. Channel 0 carries
        // bin 1 (kept: doubled), channel 1 bin 5 (dropped: zero).
        let eye2 = Tensor::from_fn(
            [3, 2, 2],
            |i| if i % 4 == 0 || i % 4 == 3 { 2.0 } else { 0.0 },
        );
        rt.set_value(&layer.weight_re, eye2).unwrap();
        rt.set_value(&layer.weight_im, Tensor::zeros([3, 2, 2]))
            .unwrap();
        let x = field(16, &[1, 5]);
        let y = rt
            .eval(&layer, |g| layer.forward(&g.input(x.clone())?))
            .unwrap();
        assert_eq!(y.shape().dims(), [1, 16, 2]);
        for t in 0..16 {
            let (x0, y0, y1) = (x.data()[2 * t], y.data()[2 * t], y.data()[2 * t + 1]);
            assert!((y0 - 2.0 * x0).abs() < 1e-9, "t={t}: {y0} vs {}", 2.0 * x0);
            assert!(y1.abs() < 1e-9, "t={t}: bin 5 must be dropped, got {y1}");
        }
    }

    #[test]
    fn eager_and_linked_agree_and_bad_modes_are_errors() {
        let eager = Runtime::new(Session::<f64>::new(Options::default()).unwrap());
        let linked = Runtime::new(LinkedSession::<f64>::new());
        let a = SpectralConv1d::new(&eager.vars(), 3, 4).unwrap();
        let b = SpectralConv1d::new(&linked.vars(), 3, 4).unwrap();
        let x = Tensor::from_fn([2, 8, 3], |i| ((i * 7) % 11) as f64 / 11.0 - 0.5);
        let ya = eager.eval(&a, |g| a.forward(&g.input(x.clone())?)).unwrap();
        let yb = linked
            .eval(&b, |g| b.forward(&g.input(x.clone())?))
            .unwrap();
        assert_eq!(ya.shape().dims(), [2, 8, 3]);
        assert!(
            ya.data()
                .iter()
                .zip(yb.data())
                .all(|(p, q)| (p - q).abs() < 1e-12)
        );
        // 4 modes need a grid of at least 6 points.
        let short = Tensor::zeros([1, 4, 3]);
        assert!(eager.eval(&a, |g| a.forward(&g.input(short)?)).is_err());
        assert!(SpectralConv1d::new(&eager.vars().pp("z"), 3, 0).is_err());
    }
}
