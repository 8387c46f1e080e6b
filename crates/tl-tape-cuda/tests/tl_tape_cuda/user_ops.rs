//! User ops on the CUDA tape: the seeds' generic `unary` / `binary` constructors (closures
//! over device buffers, shapes checked dynamically), a user op without a device
//! implementation (its reference in f32 on the host), and bad device implementations (a
//! wrong-length buffer, a wrong cotangent count): errors naming the op, nothing leaked, the
//! tape still usable.

use tl_ir::{GraphBuilder, Op, UserOp, UserOpRef};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::user::{DeviceImpl, with_device};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, SimDevice};

fn tape_with(x: &[f32], dims: &[usize]) -> (CudaTape<SimDevice>, usize) {
    let mut tape = CudaTape::new(SimDevice::new());
    let t = Tensor::new(Shape::new(dims), x.to_vec()).unwrap();
    let id = tape.upload_leaf(&t, Some("x"), true).unwrap();
    (tape, id)
}

fn seed(tape: &mut CudaTape<SimDevice>, dims: &[usize]) -> AnyBuffer {
    AnyBuffer::full(tape.device_mut(), &Shape::new(dims), 1.0).unwrap()
}

#[test]
fn unary_records_a_closure_op_with_its_vjp() {
    let (mut tape, x) = tape_with(&[1.0, -2.0, 3.0], &[3]);
    let s = Shape::new(&[3]);
    // square: x·x forward, 2·x·g backward.
    let y = tape
        .unary(
            "square",
            x,
            (s.clone(), s.clone()),
            |dev, x| dev.mul(x, x),
            |dev, x, g| {
                let t = dev.mul(x, g)?;
                let d = dev.scale(t, 2.0);
                dev.release(t);
                d
            },
        )
        .unwrap();
    let v: Tensor<f32> = tape.read(y).unwrap();
    assert_eq!(v.data(), &[1.0, 4.0, 9.0]);
    let g = seed(&mut tape, &[3]);
    let grads = tape.backward_dense(y, &g).unwrap();
    let dx: Tensor<f32> = grads[x].download(tape.device()).unwrap();
    assert_eq!(dx.data(), &[2.0, -4.0, 6.0]);
    tape.release_grads(grads);
    g.release(tape.device_mut());
    tape.reset();
    assert_eq!(tape.device().memory_usage().live_bytes, 0);
}

#[test]
fn binary_records_a_closure_op_and_checks_its_declared_shapes() {
    let mut tape = CudaTape::new(SimDevice::new());
    let a = tape
        .upload_leaf(&Tensor::<f32>::vector(vec![1.0, 2.0]), None, true)
        .unwrap();
    let b = tape
        .upload_leaf(&Tensor::<f32>::vector(vec![3.0, 5.0]), None, true)
        .unwrap();
    let c = tape
        .upload_leaf(&Tensor::<f32>::vector(vec![1.0, 2.0, 3.0]), None, true)
        .unwrap();
    let s = Shape::new(&[2]);
    let mul = |dev: &mut dyn Device, a, b| dev.mul(a, b);
    let mul_bwd = |dev: &mut dyn Device, a, b, g| {
        let da = dev.mul(g, b)?;
        match dev.mul(g, a) {
            Ok(db) => Ok((da, db)),
            Err(e) => {
                dev.release(da);
                Err(e)
            }
        }
    };
    let y = tape
        .binary(
            "myMul",
            (a, b),
            (s.clone(), s.clone(), s.clone()),
            mul,
            mul_bwd,
        )
        .unwrap();
    assert_eq!(tape.read::<f32>(y).unwrap().data(), &[3.0, 10.0]);
    let g = seed(&mut tape, &[2]);
    let grads = tape.backward_dense(y, &g).unwrap();
    let da: Tensor<f32> = grads[a].download(tape.device()).unwrap();
    let db: Tensor<f32> = grads[b].download(tape.device()).unwrap();
    assert_eq!((da.data(), db.data()), (&[3.0, 5.0][..], &[1.0, 2.0][..]));
    tape.release_grads(grads);
    g.release(tape.device_mut());

    // An operand that is not of the declared shape: an error naming the op and both shapes.
    let n = tape.len();
    let e = tape
        .binary("myMul", (a, c), (s.clone(), s.clone(), s), mul, mul_bwd)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("myMul") && e.contains("[3]") && e.contains("[2]"),
        "{e}"
    );
    assert_eq!(tape.len(), n, "nothing recorded");
}

/// `2x` with no device implementation: the CUDA tape runs its reference in f32 on the host.
struct Double;

impl UserOp for Double {
    fn name(&self) -> &'static str {
        "double"
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        Ok(s[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        Ok(x[0].map(|v| v + v))
    }
    fn vjp<T: Scalar>(
        &self,
        _x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(g.map(|v| v + v))])
    }
    fn jvp<T: Scalar>(&self, _x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        Ok(dx[0].map(|v| v + v))
    }
}

#[test]
fn a_user_op_without_a_device_implementation_runs_its_reference_and_replays() {
    // Through the IR: GraphData::replay into the CUDA tape ("compile").
    let mut gb = GraphBuilder::new();
    let x = gb.leaf([2], Some("x")).unwrap();
    let y = gb.apply(Op::user(Double), &[x]).unwrap();
    let s = gb.apply(Op::Sum, &[y]).unwrap();
    let graph = gb.finish();
    let mut tape = CudaTape::new(SimDevice::new());
    let ids = graph
        .replay(&mut tape, &[Tensor::<f64>::vector(vec![1.5, -4.0])], &[])
        .unwrap();
    assert_eq!(tape.read::<f32>(ids[y]).unwrap().data(), &[3.0, -8.0]);
    let g = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    let grads = tape.backward_dense(ids[s], &g).unwrap();
    let dx: Tensor<f32> = grads[ids[x]].download(tape.device()).unwrap();
    assert_eq!(dx.data(), &[2.0, 2.0]);
    // The host round trip is counted like any copy.
    assert!(tape.device().traffic().downloads > 0);
}

/// A device implementation whose forward returns a buffer one element short, and whose
/// backward returns two cotangents for one operand.
fn broken() -> UserOpRef {
    let imp = DeviceImpl::new(
        |dev, x, out| dev.zeros(out.numel().max(x[0].shape().numel()) - 1),
        |dev, x, _, _, _| {
            let n = x[0].shape().numel();
            Ok(vec![Some(dev.zeros(n)?), Some(dev.zeros(n)?)])
        },
    );
    with_device(UserOpRef::new(Double), imp)
}

#[test]
fn a_wrong_device_implementation_is_an_error_and_the_tape_stays_usable() {
    let (mut tape, x) = tape_with(&[1.0, 2.0, 3.0], &[3]);
    let live = tape.device().memory_usage().live_bytes;
    let e = tape
        .apply(&Op::User(broken()), &[x])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("double") && e.contains("3") && e.contains("2"),
        "{e}"
    );
    assert_eq!(tape.device().memory_usage().live_bytes, live, "released");

    // The backward's extra cotangent: recorded through a forward that is right.
    let fwd_ok = DeviceImpl::new(
        |dev, x, _| dev.scale(x[0].buffer(), 2.0),
        |dev, x, _, _, _| {
            let n = x[0].shape().numel();
            Ok(vec![Some(dev.zeros(n)?), Some(dev.zeros(n)?)])
        },
    );
    let y = tape
        .apply(&Op::User(with_device(UserOpRef::new(Double), fwd_ok)), &[x])
        .unwrap();
    let g = seed(&mut tape, &[3]);
    let before = tape.device().memory_usage().live_bytes;
    let e = tape.backward_dense(y, &g).unwrap_err().to_string();
    assert!(e.contains("double") && e.contains("cotangents"), "{e}");
    assert_eq!(tape.device().memory_usage().live_bytes, before, "released");

    // Still usable: a catalogue op and its backward.
    let z = tape.apply(&Op::Exp, &[x]).unwrap();
    let grads = tape.backward_dense(z, &g).unwrap();
    let dx: Tensor<f32> = grads[x].download(tape.device()).unwrap();
    assert_eq!(dx.data(), &[1f32.exp(), 2f32.exp(), 3f32.exp()]);
}

#[test]
fn a_device_implementation_must_return_fresh_buffers() {
    let (mut tape, x) = tape_with(&[1.0, 2.0], &[2]);
    // The forward hands back its operand (an identity "without a copy").
    let aliasing = DeviceImpl::new(
        |_, x, _| Ok(x[0].buffer()),
        |_, _, _, g, _| Ok(vec![Some(g.buffer())]),
    );
    let e = tape
        .apply(
            &Op::User(with_device(UserOpRef::new(Double), aliasing)),
            &[x],
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("double") && e.contains("fresh"), "{e}");
    // The operand is intact.
    assert_eq!(tape.read::<f32>(x).unwrap().data(), &[1.0, 2.0]);

    // The backward hands back the cotangent itself.
    let aliasing_bwd = DeviceImpl::new(
        |dev, x, _| dev.scale(x[0].buffer(), 2.0),
        |_, _, _, g, _| Ok(vec![Some(g.buffer())]),
    );
    let y = tape
        .apply(
            &Op::User(with_device(UserOpRef::new(Double), aliasing_bwd)),
            &[x],
        )
        .unwrap();
    let g = seed(&mut tape, &[2]);
    let e = tape.backward_dense(y, &g).unwrap_err().to_string();
    assert!(e.contains("double") && e.contains("fresh"), "{e}");
    // The seed is still live and readable.
    assert!(tape.device().is_live(g.buffer()));
    let grads = tape.backward_dense(x, &g).unwrap();
    assert_eq!(
        grads[x].download::<f32, _>(tape.device()).unwrap().data(),
        &[1.0, 1.0]
    );
}
