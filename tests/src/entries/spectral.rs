//! Case generators for the spectral family: `spectralConv1dRfft`.

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::Shape;

use crate::OpCase;
use crate::generate::{Size, tensors};

/// `spectralConv1dRfft { modes }` on x (grid, width) or (B, grid, width) with grid 1–8 (large:
/// 1–48), width 1–3 (large: 1–8), B 1–2, every valid `modes` in `1..=grid/2+1`, so the DC and
/// Nyquist bins and odd grids are all drawn.
pub fn spectral_conv1d(z: Size) -> BoxedStrategy<OpCase> {
    let grid = 1..=z.pick(8, 48);
    let width = 1..=z.pick(3, 8);
    (grid, width, prop::option::of(1usize..=2))
        .prop_flat_map(|(n, w, b)| {
            let x = match b {
                None => Shape::new(&[n, w]),
                Some(b) => Shape::new(&[b, n, w]),
            };
            (1..=n / 2 + 1).prop_flat_map(move |modes| {
                let ws = Shape::new(&[modes, w, w]);
                tensors(vec![x.clone(), ws.clone(), ws], crate::ANY)
                    .prop_map(move |inputs| OpCase::new(Op::SpectralConv1dRfft { modes }, inputs))
            })
        })
        .boxed()
}
