//! The digits MLP: model, training loop, test accuracy, save and reload.
//!
//! `cargo run --release -p tl-nn --example digits_mlp`. To run it linked (the recorded graph
//! compiled into a tape each step), change the first line of
//! `main` to `let mut rt = Runtime::new(tl_session::LinkedSession::<f32>::with_seed(0));`.

use tl_nn::{Activation, CLASSES, Linear, Module, PIXELS, Runtime, Sequential, data};
use tl_session::{Optimizer, Options, Session};

fn main() -> tl_nn::Result<()> {
    let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);
    let v = rt.vars();
    let model = Sequential::new()
        .add(Linear::new(&v.pp(0), PIXELS, 128)?)
        .add(Activation::Relu)
        .add(Linear::new(&v.pp(2), 128, CLASSES)?);
    println!("{model}\n{}", rt.summary(&model)?); // layers, shapes, parameter counts

    let (train, test) = data::digits()?;
    let mut opt = Optimizer::adam(1e-3)?;
    for epoch in 0..20 {
        let mut loss = 0.0;
        let batches = train.batches::<f32>(32, CLASSES, epoch)?;
        for (x, labels) in &batches {
            loss += rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x.clone())?)?.cross_entropy(labels)
            })?;
        }
        println!(
            "epoch {epoch:2}: train loss {:.4}",
            loss / batches.len() as f64
        );
    }
    let (x_test, y_test) = (test.features(), test.labels(CLASSES)?);
    let acc = rt.accuracy(&model, &x_test, &y_test, 128)?;
    println!("test accuracy {:.2}%", 100.0 * acc);

    let path = std::env::temp_dir().join("digits_mlp.safetensors");
    rt.save(&model, &path)?;
    rt.load(&model, &path)?;
    let reloaded = rt.accuracy(&model, &x_test, &y_test, 128)?;
    println!(
        "saved to {}, reloaded: {:.2}%",
        path.display(),
        100.0 * reloaded
    );
    assert_eq!(acc, reloaded);
    Ok(())
}
