//! Train the same MLP with the linked session: each epoch records a `GraphData`, takes dense
//! gradients from the IR, and steps the parameters. Prints the loss per epoch.
//! `cargo run --release -p tl-session --example train_mlp_linked [-- --backend cuda-sim]`
//! (the backend is the one the recorded graph is compiled into to cross-check the loss).

use tl_session::models::{Activation, Mlp, regression_grid};
use tl_session::{Backend, LinkedSession, Ops, Optimizer};

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
    let mut s = LinkedSession::<f32>::new();
    let (x, y) = regression_grid::<f32>(8);
    let mlp = Mlp::new(&mut s, &[2, 32, 32, 1], Activation::Tanh, 42)?;
    let mut opt = Optimizer::adam(0.01)?;
    for epoch in 0..200 {
        let loss = mlp.loss(&mut s, x.clone(), y.clone())?;
        let l = s.value(&loss)?.item()?;
        if epoch % 10 == 0 || epoch == 199 {
            // The compiled tape computes the same loss as the pure evaluation.
            let compiled = s.compile(backend)?.values()?[loss.id()].item()?;
            println!(
                "epoch {epoch:4}  loss {l:.6}  (compiled {}: {compiled:.6})",
                backend.name()
            );
        }
        let grads = s.backward_scalar_dense_all(&loss)?;
        s.step(&mut opt, &grads)?;
        s.reset();
    }
    Ok(())
}
