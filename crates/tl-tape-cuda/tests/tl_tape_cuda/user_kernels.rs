//! User ops whose device side is a kernel from the user's own `.cu`
//! (crates/tl-tape-cuda/tests/user_kernels/*.cu, built for the kernel emulator by build.rs
//! through `tl_cuda_build::Emulator`, as a user's build.rs builds its own, and named here with
//! `emu_kernels!`):
//! - on the emulated `CudaDevice` (feature `cuda-emu`) the kernels run, and give the op's
//!   reference in f32 within 2 ulps; deliberately wrong kernels are caught by that comparison
//!   or by the emulator; errors name the op and the kernel and leave the tape usable;
//! - on the `SimDevice` (every build) the op runs its sim twin: the reference in f32 on the
//!   host, or the twin given.
//!
//! `cargo test -p tl-tape-cuda --features cuda-emu --test tl_tape_cuda user_kernels::`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tl_ir::{Op, Param, UserOp, UserOpRef};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::user::{
    DeviceImpl, ElementwiseKernels, KernelArg, KernelModule, LaunchShape, launch, with_device,
};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, SimDevice};

use crate::common::{Domain, Gen, draw};

/// `y = c·x`, elementwise; a shape rule that may lie about the output (`out`), to reach the
/// kernels' length check.
struct Scale {
    c: f64,
    out: Option<Shape>,
}

impl UserOp for Scale {
    fn name(&self) -> &'static str {
        "scale"
    }
    fn params(&self) -> Vec<(&'static str, Param)> {
        vec![("c", Param::Float(self.c))]
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, shapes: &[&Shape]) -> tl_spec::Result<Shape> {
        Ok(self.out.clone().unwrap_or_else(|| shapes[0].clone()))
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        Ok(x[0].map(|v| T::lit(self.c) * v))
    }
    fn vjp<T: Scalar>(
        &self,
        _x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(g.map(|v| T::lit(self.c) * v))])
    }
    fn jvp<T: Scalar>(&self, _x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        Ok(dx[0].map(|v| T::lit(self.c) * v))
    }
}

/// `y = a·b`, elementwise (two operands).
#[cfg(feature = "cuda-emu")]
struct Mul;

#[cfg(feature = "cuda-emu")]
impl UserOp for Mul {
    fn name(&self) -> &'static str {
        "mul2"
    }
    fn arity(&self) -> usize {
        2
    }
    fn infer_shape(&self, shapes: &[&Shape]) -> tl_spec::Result<Shape> {
        Ok(shapes[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map("mul2", x[1], |a, b| a * b)
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![
            Some(g.zip_map("mul2", x[1], |g, b| g * b)?),
            Some(g.zip_map("mul2", x[0], |g, a| g * a)?),
        ])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        let l = dx[0].zip_map("mul2", x[1], |d, b| d * b)?;
        let r = x[0].zip_map("mul2", dx[1], |a, d| a * d)?;
        l.zip_map("mul2", &r, |l, r| l + r)
    }
}

/// The tests' kernel file in its compiled forms: only the emulator build (no PTX).
fn module() -> KernelModule {
    KernelModule::new("tl_test_user_kernels").emu(tl_tape_cuda::emu_kernels!(tl_test_user_kernels))
}

/// `Scale` with `c = 2` on the kernels `fwd`/`bwd` of the tests' module.
fn scale_op(fwd: &'static str, bwd: &'static str) -> UserOpRef {
    let imp = ElementwiseKernels::new(module(), fwd, bwd)
        .param(2.0)
        .device_impl();
    with_device(UserOpRef::new(Scale { c: 2.0, out: None }), imp)
}

/// The largest distance in ulps between `got` and `want` (NaN anywhere: infinite).
#[cfg(feature = "cuda-emu")]
fn max_ulps(got: &[f32], want: &[f32]) -> u64 {
    assert_eq!(got.len(), want.len());
    let key = |v: f32| {
        let b = v.to_bits() as i64;
        if b < 0x8000_0000 { b } else { 0x8000_0000 - b }
    };
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            if g.is_nan() || w.is_nan() {
                u64::MAX
            } else {
                key(g).abs_diff(key(w))
            }
        })
        .max()
        .unwrap_or(0)
}

/// Run `op` on `x` on `tape` forward and backward (seed `g`), returning (value, cotangents).
fn run<D: Device>(
    tape: &mut CudaTape<D>,
    op: &UserOpRef,
    x: &[Tensor<f32>],
    g: &Tensor<f32>,
) -> tl_tape_cuda::Result<(Vec<f32>, Vec<Vec<f32>>)> {
    let mut ids = Vec::new();
    for t in x {
        let b = AnyBuffer::upload(tape.device_mut(), t)?;
        ids.push(tape.leaf(b, None, true));
    }
    let y = tape.apply(&Op::User(op.clone()), &ids)?;
    let value: Tensor<f32> = tape.value(y, g.shape())?.download(tape.device())?;
    let seed = AnyBuffer::upload(tape.device_mut(), g)?;
    let grads = tape.backward_dense(y, &seed);
    seed.release(tape.device_mut());
    let grads = grads?;
    let mut dx = Vec::new();
    for id in ids {
        let t: Tensor<f32> = grads[id].download(tape.device())?;
        dx.push(t.data().to_vec());
    }
    tape.release_grads(grads);
    tape.reset();
    Ok((value.data().to_vec(), dx))
}

/// The op's reference in f32: (value, cotangents).
fn reference(op: &UserOpRef, x: &[Tensor<f32>], g: &Tensor<f32>) -> (Vec<f32>, Vec<Vec<f32>>) {
    let refs: Vec<&Tensor<f32>> = x.iter().collect();
    let y = op.value(&refs).unwrap();
    let dx = op.vjp(&refs, g).unwrap();
    (
        y.data().to_vec(),
        dx.into_iter().map(|d| d.unwrap().data().to_vec()).collect(),
    )
}

fn inputs(n: usize, k: usize, seed: u64) -> (Vec<Tensor<f32>>, Tensor<f32>) {
    let mut rng = Gen::new(seed);
    let shape = Shape::new(&[n]);
    let x = (0..k)
        .map(|_| draw(&mut rng, &shape, Domain::Any).cast())
        .collect();
    (x, draw(&mut rng, &shape, Domain::Any).cast())
}

#[test]
fn on_the_simulation_device_a_kernel_op_runs_its_reference_or_its_twin() {
    let (x, g) = inputs(300, 1, 1);
    let op = scale_op("tl_test_scale_fwd", "tl_test_scale_bwd");
    let mut tape = CudaTape::new(SimDevice::new());
    let got = run(&mut tape, &op, &x, &g).unwrap();
    assert_eq!(got, reference(&op, &x, &g));

    // A twin given: it runs (counted), and its values are the tape's.
    let calls = Arc::new(AtomicUsize::new(0));
    let (cf, cb) = (Arc::clone(&calls), Arc::clone(&calls));
    let twin = DeviceImpl::new(
        move |dev, x, _| {
            cf.fetch_add(1, Ordering::SeqCst);
            dev.scale(x[0].buffer(), 2.0)
        },
        move |dev, _, _, g, _| {
            cb.fetch_add(1, Ordering::SeqCst);
            Ok(vec![Some(dev.scale(g.buffer(), 2.0)?)])
        },
    );
    let imp = ElementwiseKernels::new(module(), "tl_test_scale_fwd", "tl_test_scale_bwd")
        .param(2.0)
        .device_impl()
        .with_sim_twin(twin);
    let op = with_device(UserOpRef::new(Scale { c: 2.0, out: None }), imp);
    let got = run(&mut tape, &op, &x, &g).unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the twin's forward and backward ran"
    );
    assert_eq!(got, reference(&op, &x, &g));

    // Launching by hand on the sim is an error naming the op and the kernel.
    let dev = tape.device_mut();
    let b = dev.upload(&[1.0, 2.0]).unwrap();
    let e = launch(
        dev,
        "scale",
        &module(),
        "tl_test_scale_fwd",
        LaunchShape::GridStride(2),
        &[
            KernelArg::In(b),
            KernelArg::Out(0),
            KernelArg::U64(2),
            KernelArg::F32(2.0),
        ],
        &[2],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("scale") && e.contains("tl_test_scale_fwd") && e.contains("no user kernels"),
        "{e}"
    );
    dev.release(b);
    assert_eq!(dev.memory_usage().live_bytes, 0);
}

#[cfg(feature = "cuda-emu")]
mod emulated {
    use super::*;
    use tl_tape_cuda::CudaDevice;

    fn tape() -> CudaTape<CudaDevice> {
        CudaTape::new(CudaDevice::new().expect("the kernel emulator needs no device"))
    }

    #[test]
    fn user_kernels_run_on_the_emulator_and_match_the_reference_in_f32() {
        let mut tape = tape();
        // 70 000 elements: more than one block, and a grid stride of more than one trip for
        // none (274 blocks); 1 and 0 elements: the edges.
        for (n, seed) in [(70_000, 2), (1, 3), (0, 4)] {
            let (x, g) = inputs(n, 1, seed);
            let op = scale_op("tl_test_scale_fwd", "tl_test_scale_bwd");
            let before = tape.device().traffic();
            let (y, dx) = run(&mut tape, &op, &x, &g).unwrap();
            let after = tape.device().traffic();
            let (want_y, want_dx) = reference(&op, &x, &g);
            assert!(max_ulps(&y, &want_y) <= 2, "n = {n}: value");
            assert!(max_ulps(&dx[0], &want_dx[0]) <= 2, "n = {n}: cotangent");
            if n > 0 {
                // The kernels ran: two launches (forward, backward); the operands were never
                // downloaded for a host reference (the two downloads are the test's reads).
                assert!(
                    after.launches >= before.launches + 2,
                    "{before:?} -> {after:?}"
                );
                assert_eq!(
                    after.downloads,
                    before.downloads + 2,
                    "{before:?} -> {after:?}"
                );
            }
        }
        // Two operands, a cotangent for each.
        let (x, g) = inputs(1000, 2, 5);
        let imp =
            ElementwiseKernels::new(module(), "tl_test_mul_fwd", "tl_test_mul_bwd").device_impl();
        let op = with_device(UserOpRef::new(Mul), imp);
        let (y, dx) = run(&mut tape, &op, &x, &g).unwrap();
        let (want_y, want_dx) = reference(&op, &x, &g);
        assert!(max_ulps(&y, &want_y) <= 2);
        assert!(max_ulps(&dx[0], &want_dx[0]) <= 2 && max_ulps(&dx[1], &want_dx[1]) <= 2);
        assert_eq!(tape.device().memory_usage().live_bytes, 0);
    }

    /// Kernel names are per module, as on a GPU: the tests' library has a `tl_scale`
    /// (`y = c·x + 1`) as the runtime's kernels do (`y = c·x`); each launch finds its own.
    #[test]
    fn a_user_kernel_may_share_a_name_with_the_runtimes() {
        let mut tape = tape();
        let dev = tape.device_mut();
        let x = dev.upload(&[1.0, -2.0, 3.5]).unwrap();
        let ours = dev.scale(x, 2.0).unwrap();
        let theirs = launch(
            dev,
            "scale",
            &module(),
            "tl_scale",
            LaunchShape::GridStride(3),
            &[
                KernelArg::In(x),
                KernelArg::Out(0),
                KernelArg::U64(3),
                KernelArg::F32(2.0),
            ],
            &[3],
        )
        .unwrap();
        assert_eq!(dev.download(ours).unwrap(), vec![2.0, -4.0, 7.0]);
        assert_eq!(dev.download(theirs[0]).unwrap(), vec![3.0, -3.0, 8.0]);
        // The runtime's kernel still runs after the user's library registered.
        let again = dev.scale(x, 3.0).unwrap();
        assert_eq!(dev.download(again).unwrap(), vec![3.0, -6.0, 10.5]);
        for b in [x, ours, theirs[0], again] {
            dev.release(b);
        }
        assert_eq!(dev.memory_usage().live_bytes, 0);
    }

    /// A user kernel taking a signed int and a double (`KernelArg::I32`, `KernelArg::F64`):
    /// `y[i] = scale·x[(i + shift) mod n]` for shifts of both signs and past n, every element
    /// the host's value; passed as unsigned or as float they are an error naming the kernel
    /// and both parameter lists.
    #[test]
    fn a_user_kernel_takes_signed_ints_and_doubles() {
        let mut tape = tape();
        let dev = tape.device_mut();
        let n = 300usize;
        let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
        let x = dev.upload(&xs).unwrap();
        let scale = 1.0 / 3.0;
        let shifted = |dev: &mut CudaDevice, args: [KernelArg; 2]| {
            let [shift, scale] = args;
            launch(
                dev,
                "shifted",
                &module(),
                "tl_test_shifted",
                LaunchShape::GridStride(n),
                &[
                    KernelArg::In(x),
                    KernelArg::Out(0),
                    KernelArg::U64(n as u64),
                    shift,
                    scale,
                ],
                &[n],
            )
        };
        for shift in [-3i32, 0, 5, -301, 1000] {
            let y = shifted(dev, [KernelArg::I32(shift), KernelArg::F64(scale)]).unwrap();
            let want: Vec<f32> = (0..n as i64)
                .map(|i| {
                    let from = (i + i64::from(shift)).rem_euclid(n as i64) as usize;
                    (scale * f64::from(xs[from])) as f32
                })
                .collect();
            assert_eq!(dev.download(y[0]).unwrap(), want, "shift {shift}");
            dev.release(y[0]);
        }
        for (args, passed) in [
            ([KernelArg::U32(3), KernelArg::F64(scale)], "(ppUud)"),
            ([KernelArg::I32(3), KernelArg::F32(0.5)], "(ppUif)"),
        ] {
            let e = shifted(dev, args).unwrap_err().to_string();
            assert!(
                e.contains("shifted")
                    && e.contains("tl_test_shifted")
                    && e.contains(&format!(
                        "takes parameters (ppUid) but the launch passed {passed}"
                    )),
                "{e}"
            );
        }
        dev.release(x);
        assert_eq!(dev.memory_usage().live_bytes, 0);
    }

    /// A user kernel calling the warp shuffles (`__shfl_sync`, `__shfl_xor_sync`,
    /// `__shfl_up_sync`, on floats and ints), `warpSize`, `__ldg`, `__saturatef`, `__popc`,
    /// `rsqrtf`, `__fdividef` and `__frcp_rn` runs on the emulator with CUDA's results
    /// (`tests/user_kernels/builtins.cu`; exact values).
    #[test]
    fn a_user_kernel_calls_warp_shuffles_and_built_ins() {
        let mut tape = tape();
        let dev = tape.device_mut();
        let n = 64usize;
        let xs: Vec<f32> = (0..n).map(|i| (i as f32 * 7.0) % 11.0 - 5.0).collect();
        let x = dev.upload(&xs).unwrap();
        let y = launch(
            dev,
            "builtins",
            &module(),
            "tl_test_warp_builtins",
            LaunchShape::Grid {
                grid: [1, 1, 1],
                block: [64, 1, 1],
                shared: 0,
            },
            &[
                KernelArg::In(x),
                KernelArg::Out(0),
                KernelArg::U32(n as u32),
            ],
            &[4 * n],
        )
        .unwrap();
        let got = dev.download(y[0]).unwrap();
        for i in 0..n {
            let warp = &xs[i / 32 * 32..i / 32 * 32 + 32];
            let lane = i % 32;
            let want = [
                warp.iter().sum::<f32>(),
                warp[0],
                warp[lane.saturating_sub(1)],
                (0.25 * xs[i]).clamp(0.0, 1.0)
                    + i.count_ones() as f32
                    + 0.5
                    + 1000.0 * (i ^ 1) as f32,
            ];
            assert_eq!(got[4 * i..4 * i + 4], want, "element {i}");
        }
        dev.release(y[0]);
        dev.release(x);
    }

    /// A user kernel with dynamic shared memory (`LaunchShape::Grid`'s `shared`): 64 KiB a
    /// block, past the 48 KiB of static arrays, gives each block's run reversed; more bytes
    /// than a block may have, or fewer than the kernel uses, are errors naming the kernel.
    #[test]
    fn a_user_kernel_takes_dynamic_shared_memory() {
        let mut tape = tape();
        let dev = tape.device_mut();
        let words: u32 = 16 * 1024;
        let n = 2 * words as usize;
        let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let x = dev.upload(&xs).unwrap();
        let reverse = |dev: &mut CudaDevice, shared: u32| {
            launch(
                dev,
                "block_reverse",
                &module(),
                "tl_test_block_reverse",
                LaunchShape::Grid {
                    grid: [2, 1, 1],
                    block: [256, 1, 1],
                    shared,
                },
                &[KernelArg::In(x), KernelArg::Out(0), KernelArg::U32(words)],
                &[n],
            )
        };
        let y = reverse(dev, 4 * words).unwrap();
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let (b, w) = (i / words as usize, i % words as usize);
                xs[b * words as usize + words as usize - 1 - w]
            })
            .collect();
        assert_eq!(dev.download(y[0]).unwrap(), want);
        dev.release(y[0]);
        for (shared, says) in [
            (228 * 1024, "more than a block may have"),
            (4 * words - 4, "wrote outside its"),
        ] {
            let e = reverse(dev, shared).unwrap_err().to_string();
            assert!(
                e.contains("block_reverse")
                    && e.contains("tl_test_block_reverse")
                    && e.contains(says),
                "{e}"
            );
        }
        dev.release(x);
        assert_eq!(dev.memory_usage().live_bytes, 0);
    }

    /// A tiled transpose with 2-D blocks of 32 × 8 threads and a static shared tile
    /// (`tests/user_kernels/blocks3d.cu`): the exact transpose at sizes that are and are not
    /// multiples of the tile, with the threads of each block run forward and in reverse.
    #[test]
    fn a_user_kernel_runs_with_two_dimensional_blocks() {
        let mut tape = tape();
        let dev = tape.device_mut();
        for (rows, cols) in [(64usize, 96usize), (45, 70), (1, 33), (1, 1)] {
            let xs: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 9.0).collect();
            let x = dev.upload(&xs).unwrap();
            let want: Vec<f32> = (0..rows * cols)
                .map(|i| xs[(i % rows) * cols + i / rows])
                .collect();
            for reverse in [false, true] {
                let mut go = || {
                    launch(
                        &mut *dev,
                        "transpose",
                        &module(),
                        "tl_test_transpose_tiled",
                        LaunchShape::Grid {
                            grid: [cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1],
                            block: [32, 8, 1],
                            shared: 0,
                        },
                        &[
                            KernelArg::In(x),
                            KernelArg::Out(0),
                            KernelArg::U32(rows as u32),
                            KernelArg::U32(cols as u32),
                        ],
                        &[rows * cols],
                    )
                };
                let y = if reverse {
                    tl_tape_cuda::in_reverse_schedule(go)
                } else {
                    go()
                }
                .unwrap();
                let got = dev.download(y[0]).unwrap();
                assert_eq!(got, want, "{rows} × {cols}, reverse {reverse}");
                dev.release(y[0]);
            }
            dev.release(x);
        }
        assert_eq!(dev.memory_usage().live_bytes, 0);
    }

    /// The column sums every `tests/user_kernels/shared_*.cu` kernel computes on 3 blocks of
    /// 128 threads and 5 rows: x, the exact sums (halves: exact in any order), and a launch of
    /// `kernel` in the given thread order that returns its output.
    struct SharedSums {
        xs: Vec<f32>,
        want: Vec<f32>,
    }

    const SHARED_BLOCKS: usize = 3;
    const SHARED_THREADS: usize = 128;
    const SHARED_ROWS: usize = 5;

    impl SharedSums {
        fn new() -> Self {
            let (blocks, threads, rows) = (SHARED_BLOCKS, SHARED_THREADS, SHARED_ROWS);
            let xs: Vec<f32> = (0..blocks * rows * threads)
                .map(|i| (i % 97) as f32 * 0.5 - 20.0)
                .collect();
            // Column threads - 1 - t of block b, summed over its rows.
            let want = (0..blocks * threads)
                .map(|i| {
                    let (b, t) = (i / threads, i % threads);
                    (0..rows)
                        .map(|r| xs[(b * rows + r) * threads + threads - 1 - t])
                        .sum()
                })
                .collect();
            SharedSums { xs, want }
        }

        /// `kernel`'s output, its threads run in reverse order or forward.
        fn launch(&self, dev: &mut CudaDevice, kernel: &'static str, reverse: bool) -> Vec<f32> {
            let x = dev.upload(&self.xs).unwrap();
            let mut go = || {
                launch(
                    &mut *dev,
                    "shared_sums",
                    &module(),
                    kernel,
                    LaunchShape::Grid {
                        grid: [SHARED_BLOCKS as u32, 1, 1],
                        block: [SHARED_THREADS as u32, 1, 1],
                        shared: 0,
                    },
                    &[
                        KernelArg::In(x),
                        KernelArg::Out(0),
                        KernelArg::U32(SHARED_ROWS as u32),
                    ],
                    &[SHARED_BLOCKS * SHARED_THREADS],
                )
            };
            let y = if reverse {
                tl_tape_cuda::in_reverse_schedule(go)
            } else {
                go()
            }
            .unwrap();
            let got = dev.download(y[0]).unwrap();
            dev.release(y[0]);
            dev.release(x);
            got
        }

        /// Each of `wrong` gives NaN in every block and each of `right`
        /// the exact sums, in both thread orders.
        fn check(&self, dev: &mut CudaDevice, wrong: &[&'static str], right: &[&'static str]) {
            for reverse in [false, true] {
                for kernel in wrong {
                    let got = self.launch(dev, kernel, reverse);
                    for (b, block) in got.chunks(SHARED_THREADS).enumerate() {
                        assert!(
                            block.iter().all(|v| v.is_nan()),
                            "{kernel}, reverse {reverse}: block {b} has numbers: {:?}",
                            &block[..4]
                        );
                    }
                }
                for kernel in right {
                    let got = self.launch(dev, kernel, reverse);
                    assert_eq!(got, self.want, "{kernel}, reverse {reverse}");
                }
            }
            assert_eq!(dev.memory_usage().live_bytes, 0);
        }
    }

    /// Static shared memory starts each block as the poison (a NaN), as it starts undefined on
    /// a GPU (`tests/user_kernels/shared_unwritten.cu`): an accumulator read before it is
    /// written (set to 0 after use, for the next block) gives NaN in every block, block 0
    /// included (with shared arrays that start at 0 and keep their values, every block gave
    /// the right sums), while its twin that sets it to 0 first (its declaration passed again
    /// each trip of a loop, after other threads wrote it) gives the exact sums; in both thread
    /// orders.
    #[test]
    fn static_shared_memory_read_before_written_is_nan_in_every_block() {
        let mut tape = tape();
        SharedSums::new().check(
            tape.device_mut(),
            &["tl_test_shared_unwritten"],
            &["tl_test_shared_written"],
        );
    }

    /// Every declarator of one declaration is poisoned (`tests/user_kernels/shared_declarators.cu`):
    /// an accumulator declared second, after a 2-D array, and a scalar declared after an array,
    /// each read before written, give NaN in every block; the twin with every declarator
    /// written (volatile, over two lines) the exact sums.
    #[test]
    fn every_declarator_of_a_shared_declaration_is_poisoned() {
        let mut tape = tape();
        SharedSums::new().check(
            tape.device_mut(),
            &[
                "tl_test_shared_declarators_second_unwritten",
                "tl_test_shared_declarators_scalar_unwritten",
            ],
            &["tl_test_shared_declarators_written"],
        );
    }

    /// Shared variables declared at namespace scope (`tests/user_kernels/shared_namespace.cu`:
    /// the file, a namespace, an `extern "C"` block) are poisoned at the start of every block,
    /// before its threads run: read before written they give NaN in every block; written by
    /// each thread and read by others after a barrier, the exact sums.
    #[test]
    fn namespace_scope_shared_memory_is_poisoned_at_each_block() {
        let mut tape = tape();
        SharedSums::new().check(
            tape.device_mut(),
            &[
                "tl_test_shared_namespace_unwritten",
                "tl_test_shared_namespace_scalar_unwritten",
                "tl_test_shared_extern_c_unwritten",
            ],
            &["tl_test_shared_namespace_written"],
        );
    }

    /// Shared memory declared in a local header (`tests/user_kernels/shared_header.cuh`,
    /// included by `shared_header.cu` with `#include "..."`) is poisoned as a source's: a
    /// function's and a namespace-scope accumulator read before written give NaN in every
    /// block; the twin the exact sums.
    #[test]
    fn shared_memory_declared_in_a_local_header_is_poisoned() {
        let mut tape = tape();
        SharedSums::new().check(
            tape.device_mut(),
            &[
                "tl_test_shared_header_unwritten",
                "tl_test_shared_header_global_unwritten",
            ],
            &["tl_test_shared_header_written"],
        );
    }

    /// Shared memory declared in a `switch` with a `case` label after it compiles, and
    /// (`tests/user_kernels/shared_switch.cu`) is poisoned at the start of each block after the
    /// launching thread first passed the declaration: read before written it gives NaN in
    /// every block but the first launch's block 0 (where it was registered), then in every
    /// block of every later launch, both orders; the twin, whose odd threads write it after
    /// jumping past the declaration (in reverse order before any thread passes it), gives
    /// the exact sums.
    #[test]
    fn shared_memory_declared_in_a_switch_is_poisoned_from_its_first_block_on() {
        // A thread of its own: the test's launches are the first of these kernels on it.
        let run = std::thread::spawn(|| {
            let mut tape = tape();
            let dev = tape.device_mut();
            let sums = SharedSums::new();
            let right = sums.launch(dev, "tl_test_shared_switch_written", true);
            assert_eq!(right, sums.want, "the first launch, reverse");
            let first = sums.launch(dev, "tl_test_shared_switch_unwritten", false);
            for (b, block) in first.chunks(SHARED_THREADS).enumerate().skip(1) {
                assert!(
                    block.iter().all(|v| v.is_nan()),
                    "the first launch: block {b} has numbers: {:?}",
                    &block[..4]
                );
            }
            sums.check(
                dev,
                &["tl_test_shared_switch_unwritten"],
                &["tl_test_shared_switch_written"],
            );
        });
        if let Err(panic) = run.join() {
            std::panic::resume_unwind(panic);
        }
    }

    /// Every thread of a 3-D block sees its own `threadIdx` (x fastest) and the block's
    /// `blockDim`, and its warp is the run of 32 linear ids it falls in (shuffles by lane), in
    /// every block of a 3-D grid; a block beyond CUDA's limits is refused naming the kernel
    /// and the limit, before anything is allocated.
    #[test]
    fn three_dimensional_blocks_number_threads_and_warps_as_cuda() {
        let mut tape = tape();
        let dev = tape.device_mut();
        let coords = |dev: &mut CudaDevice, grid: [u32; 3], block: [u32; 3], n: usize| {
            launch(
                dev,
                "coords",
                &module(),
                "tl_test_block_coords",
                LaunchShape::Grid {
                    grid,
                    block,
                    shared: 0,
                },
                &[KernelArg::Out(0)],
                &[n],
            )
        };
        for (grid, block) in [([1, 1, 1], [4, 4, 4]), ([2, 1, 2], [16, 2, 3])] {
            let threads = (block[0] * block[1] * block[2]) as usize;
            let blocks = (grid[0] * grid[1] * grid[2]) as usize;
            let y = coords(dev, grid, block, 5 * threads * blocks).unwrap();
            let got = dev.download(y[0]).unwrap();
            for b in 0..blocks {
                for t in 0..threads {
                    let (bx, by) = (block[0] as usize, block[1] as usize);
                    let (x, yy, z) = (t % bx, t / bx % by, t / (bx * by));
                    let warp0 = t / 32 * 32;
                    let want = [
                        t as f32,
                        (x + 100 * yy + 10_000 * z) as f32,
                        (warp0..warp0 + 32).sum::<usize>() as f32,
                        warp0 as f32,
                        if t % 32 == 31 { t } else { t + 1 } as f32,
                    ];
                    let at = 5 * (b * threads + t);
                    assert_eq!(got[at..at + 5], want, "block {b}, thread {t}");
                }
            }
            dev.release(y[0]);
        }
        let live = dev.memory_usage().live_bytes;
        for (block, says) in [
            ([32, 32, 2], "at most 1024 threads in all"),
            ([1, 1, 65], "64 along z"),
            ([2048, 1, 1], "1024 threads along x"),
            ([16, 0, 1], "at least 1"),
        ] {
            let e = coords(dev, [1, 1, 1], block, 5 * 1024)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("coords")
                    && e.contains("tl_test_block_coords")
                    && e.contains("outside CUDA's limits")
                    && e.contains(says),
                "{e}"
            );
            assert_eq!(dev.memory_usage().live_bytes, live);
        }
        assert_eq!(live, 0);
    }

    #[test]
    fn wrong_kernels_are_caught() {
        let mut tape = tape();
        let (x, g) = inputs(1000, 1, 6);
        // A forward that writes only its first 100 elements: the rest keep the NaN poison.
        let op = scale_op("tl_test_scale_wrong_fwd", "tl_test_scale_bwd");
        let (y, _) = run(&mut tape, &op, &x, &g).unwrap();
        let (want_y, want_dx) = reference(&op, &x, &g);
        assert!(y[..100] == want_y[..100] && y[100..].iter().all(|v| v.is_nan()));
        assert_eq!(max_ulps(&y, &want_y), u64::MAX);
        // Backward off by a relative 2^-21: a few ulps, more than the 2 allowed.
        let op = scale_op("tl_test_scale_fwd", "tl_test_scale_wrong_bwd");
        let (_, dx) = run(&mut tape, &op, &x, &g).unwrap();
        let off = max_ulps(&dx[0], &want_dx[0]);
        assert!((3..64).contains(&off), "{off} ulps");
    }

    /// A forward that runs one element past the end, at a length whose buffers have no room
    /// past it (128 floats, 512 bytes): it writes a NaN read past x's end into y's guard zone,
    /// and the launch fails naming the kernel. (With one guard pattern for every allocation,
    /// that NaN was taken for y's untouched guard.)
    #[test]
    fn an_off_by_one_kernel_is_caught_at_an_exact_size() {
        let mut tape = tape();
        let (x, g) = inputs(128, 1, 8);
        let op = scale_op("tl_test_scale_obo_fwd", "tl_test_scale_bwd");
        let e = run(&mut tape, &op, &x, &g).unwrap_err().to_string();
        assert!(
            e.contains("tl_test_scale_obo_fwd") && e.contains("wrote outside an allocation"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_op_and_the_kernel_and_leave_the_tape_usable() {
        let mut tape = tape();
        let (x, g) = inputs(64, 1, 7);
        let leaf = AnyBuffer::upload(tape.device_mut(), &x[0]).unwrap();
        let id = tape.leaf(leaf, None, true);
        let live = tape.device().memory_usage().live_bytes;
        let nodes = tape.len();
        let expect = |tape: &mut CudaTape<CudaDevice>, op: UserOpRef, words: &[&str]| {
            let e = tape.apply(&Op::User(op), &[id]).unwrap_err().to_string();
            for w in words {
                assert!(e.contains(w), "{w:?} missing from: {e}");
            }
            assert_eq!(tape.len(), nodes, "{e}");
            assert_eq!(tape.device().memory_usage().live_bytes, live, "{e}");
        };
        // No such kernel in the module's library.
        expect(
            &mut tape,
            scale_op("tl_test_nope", "tl_test_scale_bwd"),
            &[
                "scale",
                "tl_test_nope",
                "no kernel tl_test_nope in this library",
                "tl_test_scale_fwd",
            ],
        );
        // Arguments the kernel does not take (u64 length where it takes u32).
        expect(
            &mut tape,
            scale_op("tl_test_scale_bad_sig", "tl_test_scale_bwd"),
            &[
                "scale",
                "tl_test_scale_bad_sig",
                "takes parameters (ppuf) but the launch passed (ppUf)",
            ],
        );
        // Operands not of the output's length (a shape rule that lies).
        let imp = ElementwiseKernels::new(module(), "tl_test_scale_fwd", "tl_test_scale_bwd")
            .param(2.0)
            .device_impl();
        let op = UserOpRef::new(Scale {
            c: 2.0,
            out: Some(Shape::new(&[1])),
        });
        expect(
            &mut tape,
            with_device(op, imp),
            &[
                "scale",
                "tl_test_scale_fwd",
                "operand 0 has 64 elements",
                "output's 1",
            ],
        );
        // A module with no emulator build.
        let imp =
            ElementwiseKernels::new(KernelModule::new("bare"), "k_fwd", "k_bwd").device_impl();
        let op = with_device(UserOpRef::new(Scale { c: 2.0, out: None }), imp);
        expect(
            &mut tape,
            op,
            &["scale", "k_fwd", "module bare", "no emulator build"],
        );

        // The tape goes on: the right kernels on the same leaf, forward and backward.
        let op = scale_op("tl_test_scale_fwd", "tl_test_scale_bwd");
        let y = tape.apply(&Op::User(op.clone()), &[id]).unwrap();
        let seed = AnyBuffer::upload(tape.device_mut(), &g).unwrap();
        let grads = tape.backward_dense(y, &seed).unwrap();
        let dx: Tensor<f32> = grads[id].download(tape.device()).unwrap();
        assert!(max_ulps(dx.data(), &reference(&op, &x, &g).1[0]) <= 2);
        seed.release(tape.device_mut());
        tape.release_grads(grads);
    }
}
