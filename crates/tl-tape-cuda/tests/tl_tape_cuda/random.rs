//! `randUniform`, `bernoulliMask` and `dropout` on the CUDA tape over the simulation device:
//! values and dropout's gradient bit-identical to the CPU tape's f32 path and to the spec in
//! f32; `spectralConv1dRfft` is reported as unsupported (issue 4).

use tl_ir::Op;
use tl_spec::ops::random as spec;
use tl_spec::{Shape, Tensor};
use tl_tape_cpu::Tape;
use tl_tape_cuda::{AnyBuffer, CudaTape, SimDevice};

fn bits(t: &Tensor<f32>) -> Vec<u32> {
    crate::common::bits(t.data())
}

#[test]
fn draws_are_bit_identical_to_the_cpu_f32_path() {
    let shape = Shape::new(&[7, 33]);
    for (seed, counter) in [(0u64, 0u64), (42, 7), (u64::MAX, 3)] {
        let ops = [
            Op::RandUniform {
                shape: shape.clone(),
                seed,
                counter,
            },
            Op::BernoulliMask {
                shape: shape.clone(),
                keep: 0.3,
                seed,
                counter,
            },
        ];
        for op in ops {
            let mut gpu = CudaTape::new(SimDevice::new());
            let id = gpu.apply(&op, &[]).unwrap();
            let got: Tensor<f32> = gpu.read(id).unwrap();
            let mut cpu = Tape::<f32>::new();
            let cid = cpu.apply(&op, &[]).unwrap();
            let want = cpu.get(cid).unwrap();
            assert_eq!(bits(&got), bits(want), "{op:?}");
            let spec_val = match &op {
                Op::RandUniform { .. } => spec::rand_uniform::<f32>(&shape, seed, counter),
                _ => spec::bernoulli_mask::<f32>(&shape, 0.3, seed, counter),
            }
            .unwrap();
            assert_eq!(bits(&got), bits(&spec_val), "{op:?} vs spec");
        }
    }
}

#[test]
fn dropout_value_and_gradient_are_bit_identical_to_the_cpu_f32_path() {
    let x = Tensor::<f32>::from_fn([5, 40], |i| (i as f32 * 0.37).sin() * 3.0);
    let g = Tensor::<f32>::from_fn([5, 40], |i| (i as f32 * 0.11).cos());
    for keep in [0.1, 0.7, 1.0] {
        let op = Op::Dropout {
            keep,
            seed: 5,
            counter: 12,
        };
        let mut gpu = CudaTape::new(SimDevice::new());
        let xi = gpu.upload_leaf(&x, Some("x"), true).unwrap();
        let yi = gpu.apply(&op, &[xi]).unwrap();
        let y: Tensor<f32> = gpu.read(yi).unwrap();
        let seed = AnyBuffer::upload(gpu.device_mut(), &g).unwrap();
        let grads = gpu.backward_dense(yi, &seed).unwrap();
        let dx: Tensor<f32> = grads[xi].download(gpu.device()).unwrap();

        let mut cpu = Tape::<f32>::new();
        let cx = cpu.leaf(x.clone(), Some("x"), true);
        let cy = cpu.apply(&op, &[cx]).unwrap();
        let cgrads = cpu.backward_dense(cy, &g).unwrap();
        assert_eq!(bits(&y), bits(cpu.get(cy).unwrap()), "keep {keep}");
        assert_eq!(bits(&dx), bits(&cgrads[cx]), "keep {keep}");
        // The gradient uses the forward's mask: zero exactly where the value was dropped.
        let nonzero = y.data().iter().zip(x.data()).zip(dx.data());
        for ((&yv, _), &dv) in nonzero.filter(|((_, xv), _)| **xv != 0.0) {
            assert_eq!(yv == 0.0, dv == 0.0);
        }
        gpu.release_grads(grads);
        seed.release(gpu.device_mut());
    }
}
