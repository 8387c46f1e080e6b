//! Train a small MLP (tl-nn's `models::mlp`, 2-32-32-1 tanh) on a fixed regression task with
//! the eager session, or with `--linked` the linked session (each step records a graph and
//! compiles it to the backend's tape), printing the loss every ten epochs. The training loop is
//! the same for both: `Runtime::step`.
//!
//! `cargo run --release -p tl-session --example train_mlp [-- --linked] [--backend cuda-sim]`

#[path = "../tests/common/grid.rs"]
mod grid;

use tl_nn::models::mlp;
use tl_nn::{Activation, Module, Runtime};
use tl_session::{Backend, LinkedSession, Optimizer, Options, Session, Train};

/// 200 epochs of Adam on the 8 × 8 grid, full batch.
fn train<O: Train<T = f32>>(session: O, backend: Backend) -> tl_nn::Result<()> {
    let mut rt = Runtime::new(session);
    let net = mlp(&rt.vars(), &[2, 32, 32, 1], Activation::Tanh)?;
    let (x, y) = grid::regression_grid::<f32>(8);
    let mut opt = Optimizer::adam(0.01)?;
    for epoch in 0..200 {
        let loss = rt.step(&net, &mut opt, |g| {
            net.forward(&g.input(x.clone())?)?
                .mse_loss(&g.input(y.clone())?)
        })?;
        if epoch % 10 == 0 || epoch == 199 {
            println!("epoch {epoch:4}  loss {loss:.6}  ({})", backend.name());
        }
    }
    Ok(())
}

fn main() -> tl_nn::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = match args.iter().skip_while(|a| *a != "--backend").nth(1) {
        None => Backend::Cpu,
        Some(b) if b == "cpu" => Backend::Cpu,
        Some(b) if b == "cuda-sim" => Backend::CudaSim,
        Some(b) if b == "cuda" => Backend::Cuda,
        Some(other) => {
            eprintln!("unknown backend {other:?}: use cpu, cuda-sim or cuda");
            std::process::exit(2);
        }
    };
    if args.iter().any(|a| a == "--linked") {
        let mut s = LinkedSession::<f32>::new();
        s.set_backend(backend)?;
        train(s, backend)
    } else {
        train(Session::<f32>::new(Options::backend(backend))?, backend)
    }
}
