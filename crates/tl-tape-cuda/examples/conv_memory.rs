//! Device memory of a conv's weight cotangent on the CUDA tape over the simulation device
//! (whose allocator is the GPU's caching allocator, so the telemetry counts what a GPU would
//! hold): the implicit-GEMM kernel (`conv_implicit_dw`, the gate forced on) beside the im2col
//! path (the gate forced off: the permuted cotangent, the column matrix and the GEMM).
//!
//! ```sh
//! cargo run --release -p tl-tape-cuda --example conv_memory              # batch 32
//! cargo run --release -p tl-tape-cuda --example conv_memory -- --batch 4
//! ```
//!
//! The ResNet's two conv shapes (3×3, padding 1, 32×32 images: the stem, 3 → 64 channels, and
//! a block's conv, 64 → 64). Per shape: the forward by the implicit kernel, then the backward
//! with only the weight needing its cotangent, once per gate setting; the peak of the
//! backward above the bytes live before it (peaks are bytes requested by live buffers), and
//! the column matrix `(C·K, N·L)` the im2col path allocates. Both settings give the same bits
//! (checked). Prints a markdown table (docs/performance.md, "GPU").

use tl_ir::Op;
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, SimDevice, gates};

fn batch() -> Result<usize, String> {
    let mut it = std::env::args().skip(1);
    let mut batch = 32;
    while let Some(a) = it.next() {
        match a.as_str() {
            "--batch" => {
                batch = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--batch needs a positive number")?
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(batch)
}

/// (the weight cotangent's bits, the backward's peak above the live bytes before it).
fn run(n: usize, c: usize, a: usize, min_tiles: usize) -> Result<(Vec<u32>, usize), String> {
    let e = |e: tl_tape_cuda::Error| e.to_string();
    let fill = |dims: &[usize], salt: u64| {
        Tensor::<f32>::from_fn(Shape::new(dims), |i| {
            ((tl_spec::rng::unit(salt, i as u64) - 0.5) * 2.0) as f32
        })
    };
    let op = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    let mut t = CudaTape::new(SimDevice::new());
    let leaves = [
        fill(&[a, c, 3, 3], 1),
        fill(&[a], 2),
        fill(&[n, c, 32, 32], 3),
    ];
    let mut ids = Vec::new();
    for (k, v) in leaves.iter().enumerate() {
        ids.push(t.upload_leaf(v, None, k == 0).map_err(e)?);
    }
    let y = {
        let _gate = gates::force_conv_implicit_min_tiles(Some(0));
        t.apply(&op, &ids).map_err(e)?
    };
    let seed = AnyBuffer::upload(t.device_mut(), &fill(&[n, a, 32, 32], 4)).map_err(e)?;
    let before = t.device().memory_usage();
    let _gate = gates::force_conv_implicit_min_tiles(Some(min_tiles));
    let grads = t.backward_dense_owned(y, seed).map_err(e)?;
    let peak = t.device().memory_usage().peak_bytes;
    if peak <= before.peak_bytes {
        return Err("the backward's peak is the forward's: measure a larger conv".into());
    }
    let dw = grads[ids[0]].download::<f32, _>(t.device()).map_err(e)?;
    let bits = dw.data().iter().map(|v| v.to_bits()).collect();
    Ok((bits, peak - before.live_bytes))
}

fn main() -> Result<(), String> {
    let n = batch()?;
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    println!(
        "| conv (batch {n}, 32×32) | column matrix | backward peak, implicit | backward peak, im2col | saved |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (c, a) in [(3, 64), (64, 64)] {
        let (on_bits, on) = run(n, c, a, 0)?;
        let (off_bits, off) = run(n, c, a, usize::MAX)?;
        if on_bits != off_bits {
            return Err(format!("{c} → {a}: the two paths' bits differ"));
        }
        let cols = c * 9 * n * 32 * 32 * 4;
        println!(
            "| {c} → {a} | {:.2} MiB | {:.2} MiB | {:.2} MiB | {:.2} MiB |",
            mib(cols),
            mib(on),
            mib(off),
            mib(off - on)
        );
    }
    Ok(())
}
