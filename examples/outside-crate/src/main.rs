//! The digits MLP from a crate outside the workspace: what a user who depends on `tl-nn` and
//! `tl-session` by version writes. Trains 64 → 128 → 10 with Adam on the UCI digits shipped
//! inside `tl-nn`, and fails unless the test accuracy reaches 95%.

use tl_nn::{Activation, CLASSES, Linear, Module, PIXELS, Runtime, Sequential, data};
use tl_session::{Optimizer, Options, Session};

/// The accuracy the README promises for this model (the `tl train` default reaches ~97%).
const MIN_ACCURACY: f64 = 0.95;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);
    let v = rt.vars();
    let model = Sequential::new()
        .add(Linear::new(&v.pp(0), PIXELS, 128)?)
        .add(Activation::Relu)
        .add(Linear::new(&v.pp(2), 128, CLASSES)?);
    let (train, test) = data::digits()?;
    let mut opt = Optimizer::adam(3e-3)?;
    for epoch in 0..20 {
        for (x, labels) in train.batches::<f32>(32, CLASSES, epoch)? {
            rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x)?)?.cross_entropy(&labels)
            })?;
        }
    }
    let acc = rt.accuracy(&model, &test.features(), &test.labels(CLASSES)?, 128)?;
    println!(
        "outside crate: digits MLP test accuracy {:.2}%",
        100.0 * acc
    );
    if acc < MIN_ACCURACY {
        return Err(format!("test accuracy {acc:.4} is below {MIN_ACCURACY}").into());
    }
    Ok(())
}
