//! Side-by-side timings on this machine, in one process, same threads, same data: the mlp
//! (784-256-256-10, batch 64) and cnn (28×28, batch 64) training steps (forward, backward, SGD
//! update) in candle (CPU) and in this project (tl-nn's models and `Runtime::step` on the eager
//! session and on the linked session = record, compile to the CPU tape, backward, update;
//! candle starts from the same parameter values), and a 1024×1024 f32 matmul against the `gemm`
//! crate called directly. Prints a table of medians and ratios (ours / peer; ≤ 1.0 is as fast
//! or faster).
//!
//! Run (from the repository root): `cargo run --release --manifest-path benches/peers/Cargo.toml`
//! (`-- --iters 50` for more iterations). Threads: candle and gemm use rayon
//! (`RAYON_NUM_THREADS`, default: all cores); our products use `tl_tape_cpu::threads()`
//! (`TL_NUM_THREADS`, default: the cores this process may run on).

#[path = "../../../crates/tl-session/benches/common/models.rs"]
mod models;

use std::time::Instant;

use candle_core::{DType, Device, Module, Tensor as CTensor, Var};
use candle_nn::{Linear, Optimizer, SGD};
use models::{BenchModel, EagerRun, Kind, LinkedRun};
use tl_ir::Op;
use tl_spec::Tensor;

type CResult<T> = candle_core::Result<T>;

/// The model in candle: the same parameter values (ours, in the model's order), batch and labels.
struct CandleRun {
    kind: Kind,
    vars: Vec<Var>,
    x: CTensor,
    labels: CTensor,
    opt: SGD,
}

fn to_candle(t: &Tensor<f32>, dev: &Device) -> CResult<CTensor> {
    CTensor::from_vec(t.data().to_vec(), t.shape().dims(), dev)
}

impl CandleRun {
    fn new(m: &BenchModel, inits: &[Tensor<f32>]) -> CResult<Self> {
        let dev = Device::Cpu;
        let vars: Vec<Var> = inits
            .iter()
            .map(|t| Var::from_tensor(&to_candle(t, &dev)?))
            .collect::<CResult<_>>()?;
        let labels: Vec<u32> = m.labels.values().iter().map(|&l| l as u32).collect();
        let labels = CTensor::from_vec(labels, m.labels.len(), &dev)?;
        let opt = SGD::new(vars.clone(), 0.01)?;
        Ok(CandleRun {
            kind: m.kind,
            vars,
            x: to_candle(&m.x, &dev)?,
            labels,
            opt,
        })
    }

    fn linear(&self, w: usize, h: &CTensor) -> CResult<CTensor> {
        let l = Linear::new(
            self.vars[w].as_tensor().clone(),
            Some(self.vars[w + 1].as_tensor().clone()),
        );
        l.forward(h)
    }

    fn conv_relu_pool(&self, w: usize, h: &CTensor) -> CResult<CTensor> {
        let c = self.vars[w + 1].dim(0)?;
        let h = h.conv2d(self.vars[w].as_tensor(), 1, 1, 1, 1)?;
        let h = h.broadcast_add(&self.vars[w + 1].as_tensor().reshape((1, c, 1, 1))?)?;
        h.relu()?.max_pool2d(2)
    }

    fn step(&mut self) -> CResult<f32> {
        let logits = match self.kind {
            Kind::Mlp => {
                let h = self.linear(0, &self.x)?.relu()?;
                let h = self.linear(2, &h)?.relu()?;
                self.linear(4, &h)?
            }
            Kind::Cnn => {
                let h = self.conv_relu_pool(0, &self.x)?;
                let h = self.conv_relu_pool(2, &h)?;
                let h = h.flatten_from(1)?;
                self.linear(4, &h)?
            }
            _ => unimplemented!("the peer table covers the mlp and the cnn"),
        };
        let loss = candle_nn::loss::cross_entropy(&logits, &self.labels)?;
        self.opt.backward_step(&loss)?;
        loss.to_dtype(DType::F32)?.to_scalar::<f32>()
    }
}

/// Median seconds of `iters` calls of `f` after `warm` unmeasured calls.
fn median(iters: usize, warm: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warm {
        f();
    }
    let mut t: Vec<f64> = (0..iters)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn fmt_time(s: f64) -> String {
    if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

struct Row {
    what: String,
    ours: &'static str,
    peer: &'static str,
    t_ours: f64,
    t_peer: f64,
}

/// `c ← a·b` for row-major n×n f32 matrices through the `gemm` crate.
fn gemm_direct(n: usize, a: &[f32], b: &[f32], c: &mut [f32], par: gemm::Parallelism) {
    assert!(a.len() == n * n && b.len() == n * n && c.len() == n * n);
    let n_i = n as isize;
    // SAFETY: the three slices hold n·n elements each (checked above), the strides (row stride
    // n, column stride 1) stay inside them, and `c` does not alias `a` or `b` (a `&mut`).
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            c.as_mut_ptr(),
            1,
            n_i,
            false,
            a.as_ptr(),
            1,
            n_i,
            b.as_ptr(),
            1,
            n_i,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

fn main() -> CResult<()> {
    let iters = std::env::args()
        .skip_while(|a| a != "--iters")
        .nth(1)
        .map_or(30, |v| v.parse().expect("--iters takes a number"));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rayon = candle_core::utils::get_num_threads();
    println!(
        "cores {threads}, candle/gemm rayon threads {rayon}, our product threads {} (TL_NUM_THREADS); {iters} timed iterations per cell (median)",
        tl_tape_cpu::threads()
    );
    let mut rows = Vec::new();
    for (name, model) in [
        ("mlp 784-256-256-10 b64 step", BenchModel::mlp(64)),
        ("cnn 28x28 b64 step", BenchModel::cnn(64)),
    ] {
        let mut eager = EagerRun::new(&model);
        let mut linked = LinkedRun::new(&model);
        let inits = eager.param_values().expect("the parameters' values");
        let mut candle = CandleRun::new(&model, &inits)?;
        // Same parameters, same batch: the first losses agree.
        let (le, ll, lc) = (eager.step(), linked.step(), candle.step()?);
        assert!(
            (le - lc).abs() < 1e-3 * lc.abs().max(1.0) && (ll - lc).abs() < 1e-3 * lc.abs().max(1.0),
            "{name}: losses differ: eager {le}, linked {ll}, candle {lc}"
        );
        let warm = 3;
        let tc = median(iters, warm, || {
            candle.step().unwrap();
        });
        let te = median(iters, warm, || {
            eager.step();
        });
        let tl = median(iters, warm, || {
            linked.step();
        });
        for (ours, t) in [("tl eager", te), ("tl linked", tl)] {
            rows.push(Row {
                what: name.into(),
                ours,
                peer: "candle",
                t_ours: t,
                t_peer: tc,
            });
        }
    }
    let n = 1024;
    let a = models::filled(&[n, n], 1, 1.0);
    let b = models::filled(&[n, n], 2, 1.0);
    let mut c = vec![0.0f32; n * n];
    let ours = tl_tape_cpu::ops::forward(&Op::Matmul, &[&a, &b], &[]).unwrap();
    gemm_direct(n, a.data(), b.data(), &mut c, gemm::Parallelism::Rayon(rayon));
    let err = ours
        .data()
        .iter()
        .zip(&c)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(err < 1e-2, "matmul results differ by {err}");
    let mm_iters = iters.min(20);
    let t_ours = median(mm_iters, 2, || {
        std::hint::black_box(tl_tape_cpu::ops::forward(&Op::Matmul, &[&a, &b], &[]).unwrap());
    });
    for (peer, par) in [
        ("gemm (rayon)", gemm::Parallelism::Rayon(rayon)),
        ("gemm (1 thread)", gemm::Parallelism::None),
    ] {
        let t_peer = median(mm_iters, 2, || {
            gemm_direct(n, a.data(), b.data(), &mut c, par);
        });
        rows.push(Row {
            what: "matmul 1024x1024 f32".into(),
            ours: "tl ops::forward",
            peer,
            t_ours,
            t_peer,
        });
    }
    println!();
    println!("| what | ours | time | peer | time | ratio ours/peer |");
    println!("| --- | --- | ---: | --- | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.2} |",
            r.what,
            r.ours,
            fmt_time(r.t_ours),
            r.peer,
            fmt_time(r.t_peer),
            r.t_ours / r.t_peer
        );
    }
    let gflops = 2.0 * (n as f64).powi(3) / 1e9;
    println!();
    println!(
        "matmul: ours {:.1} GFLOP/s = {:.0}% of gemm (rayon)",
        gflops / rows[rows.len() - 2].t_ours,
        100.0 * rows[rows.len() - 2].t_peer / rows[rows.len() - 2].t_ours
    );
    Ok(())
}
