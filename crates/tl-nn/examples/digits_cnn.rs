//! A digits CNN: two conv → relu → max-pool blocks (batch norm in the first) and a linear head,
//! trained, evaluated, saved and reloaded.
//!
//! `cargo run --release -p tl-nn --example digits_cnn`. To run it linked, change the first line
//! of `main` to `let mut rt = Runtime::new(tl_session::LinkedSession::<f32>::with_seed(0));`.

use tl_nn::{Activation::Relu, BatchNorm, CLASSES, Conv, ConvConfig, Flatten, Linear, MaxPool};
use tl_nn::{Module, Runtime, Sequential, data};
use tl_session::{Optimizer, Options, Session};

fn main() -> tl_nn::Result<()> {
    let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);
    let (v, same) = (rt.vars(), ConvConfig::padded(1));
    let model = Sequential::new()
        .add(Conv::conv2d(&v.pp(0), 1, 16, 3, same)?)
        .add(BatchNorm::new(&v.pp(1), 16)?)
        .add(Relu)
        .add(MaxPool::new(&[2, 2])?) // 8×8 → 4×4
        .add(Conv::conv2d(&v.pp(4), 16, 32, 3, same)?)
        .add(Relu)
        .add(MaxPool::new(&[2, 2])?) // 4×4 → 2×2
        .add(Flatten)
        .add(Linear::new(&v.pp(8), 32 * 2 * 2, CLASSES)?);
    println!("{model}\n{}", rt.summary(&model)?); // layers, shapes, parameter counts

    let (train, test) = data::digits()?;
    let (train, test) = (train.shaped(&[1, 8, 8])?, test.shaped(&[1, 8, 8])?);
    let mut opt = Optimizer::adam(3e-3)?;
    for epoch in 0..8 {
        let mut loss = 0.0;
        let batches = train.batches::<f32>(32, CLASSES, epoch)?;
        for (x, labels) in &batches {
            loss += rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x.clone())?)?.cross_entropy(labels)
            })?;
        }
        println!("epoch {epoch}: loss {:.4}", loss / batches.len() as f64);
    }
    let (x_test, y_test) = (test.features(), test.labels(CLASSES)?);
    let acc = rt.accuracy(&model, &x_test, &y_test, 120)?;
    println!("test accuracy {:.2}%", 100.0 * acc);

    let path = std::env::temp_dir().join("digits_cnn.safetensors");
    rt.save(&model, &path)?; // batch norm's running statistics included
    rt.load(&model, &path)?;
    assert_eq!(rt.accuracy(&model, &x_test, &y_test, 120)?, acc);
    println!("saved to {} and reloaded", path.display());
    Ok(())
}
