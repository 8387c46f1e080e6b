//! Train a small MLP on a fixed regression task with the eager session, printing the loss per
//! epoch. `cargo run --release -p tl-session --example train_mlp [-- --backend cuda-sim]`.

use tl_session::models::{Activation, Mlp, regression_grid};
use tl_session::{Backend, Ops, Optimizer, Options, Session};

fn main() -> Result<(), tl_session::Error> {
    let backend = match std::env::args()
        .skip_while(|a| a != "--backend")
        .nth(1)
        .as_deref()
    {
        None | Some("cpu") => Backend::Cpu,
        Some("cuda-sim") => Backend::CudaSim,
        Some("cuda") => Backend::Cuda,
        Some(other) => {
            eprintln!("unknown backend {other:?}: use cpu, cuda-sim or cuda");
            std::process::exit(2);
        }
    };
    let mut s = Session::<f32>::new(Options::backend(backend))?;
    let (x, y) = regression_grid::<f32>(8);
    let mlp = Mlp::new(&mut s, &[2, 32, 32, 1], Activation::Tanh, 42)?;
    let mut opt = Optimizer::adam(0.01)?;
    for epoch in 0..200 {
        let loss = mlp.loss(&mut s, x.clone(), y.clone())?;
        let l = s.value(&loss)?.item()?;
        s.backward(&loss)?;
        s.step(&mut opt)?;
        s.reset();
        if epoch % 10 == 0 || epoch == 199 {
            println!("epoch {epoch:4}  loss {l:.6}  ({})", backend.name());
        }
    }
    Ok(())
}
