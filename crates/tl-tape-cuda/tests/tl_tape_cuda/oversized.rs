//! Issue 14 on the CUDA tape over the simulation device: oversized or wrapping shapes are errors
//! naming the op, refused before the device (or the caching allocator) allocates; the process
//! never aborts. Shape sizes are far above any machine's memory, so the default cap refuses them.

use tl_ir::Op;
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::{CudaTape, Device, SimDevice};

#[test]
fn oversized_outputs_and_buffers_are_errors_not_aborts() {
    let mut t = CudaTape::new(SimDevice::new());
    let a = t
        .upload_leaf(&Tensor::<f32>::zeros([1 << 32, 0]), Some("a"), true)
        .unwrap();
    let b = t
        .upload_leaf(&Tensor::<f32>::zeros([0, 1 << 32]), Some("b"), true)
        .unwrap();
    let x = t
        .upload_leaf(
            &Tensor::<f32>::from_fn([2, 3], |i| i as f32),
            Some("x"),
            true,
        )
        .unwrap();
    let one = t
        .upload_leaf(&Tensor::<f32>::ones([1]), Some("one"), true)
        .unwrap();
    let len = t.len();
    let msg = t.apply(&Op::Matmul, &[a, b]).unwrap_err().to_string();
    assert!(msg.contains("matmul") && msg.contains("too large"), "{msg}");
    let big = Shape::new(&[100_000_000_000]);
    for op in [
        Op::RandUniform {
            shape: Shape::new(&[1 << 62]),
            seed: 0,
            counter: 0,
        },
        Op::RandUniform {
            shape: big.clone(),
            seed: 0,
            counter: 0,
        },
    ] {
        let msg = t.apply(&op, &[]).unwrap_err().to_string();
        assert!(
            msg.contains("randUniform") && msg.contains("too large"),
            "{msg}"
        );
    }
    let msg = t
        .apply(&Op::BroadcastTo(big.clone()), &[one])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("broadcastTo") && msg.contains("allocation cap"),
        "{msg}"
    );
    let msg = t
        .apply(
            &Op::GatherRowsNatVec {
                at: 0,
                k: 100_000_000_000,
            },
            &[x],
        )
        .unwrap_err()
        .to_string();
    assert!(msg.contains("allocation cap"), "{msg}");
    assert_eq!(t.len(), len, "failed applies leave the tape unchanged");
    // swapAdjacent(usize::MAX) is the identity.
    let s = t.apply(&Op::SwapAdjacent(usize::MAX), &[x]).unwrap();
    assert_eq!(t.read::<f32>(s).unwrap(), t.read::<f32>(x).unwrap());
    // The caching allocator refuses a buffer above the cap before asking the device: 2 GB of
    // f32 (within the kernel ABI's u32 lengths) under a 1 GiB cap. This binary holds one test,
    // so lowering the process-wide cap affects nothing else.
    tl_spec::alloc::set_max_alloc_bytes(Some(1 << 30));
    let dev = t.device_mut();
    let before = dev.memory_usage();
    let msg = dev.zeros(500_000_000).unwrap_err().to_string();
    assert!(msg.contains("allocation cap"), "{msg}");
    assert_eq!(
        dev.memory_usage().device_alloc_count,
        before.device_alloc_count
    );
}

#[test]
fn a_spectral_basis_past_the_kernels_limit_is_refused_before_it_is_built() {
    // modes·grid = (2¹⁹ + 1)·2²⁰ basis values (2 TiB of f32), from operands of a few MiB: the
    // basis is checked against the kernels' u32 before it is allocated or computed.
    let mut t = CudaTape::new(SimDevice::new());
    let modes = (1 << 19) + 1;
    let x = t
        .upload_leaf(&Tensor::<f32>::zeros([1 << 20, 1]), Some("x"), true)
        .unwrap();
    let w = t
        .upload_leaf(&Tensor::<f32>::zeros([modes, 1, 1]), Some("w"), true)
        .unwrap();
    let msg = t
        .apply(&Op::SpectralConv1dRfft { modes }, &[x, w, w])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("spectralConv1dRfft") && msg.contains("u32"),
        "{msg}"
    );
}
