//! A user op through both sessions: the eager session on the CPU tape and the CUDA sim, the
//! linked session's pure eval, backprop and JVP, and its compiled tapes (CPU and CUDA sim) —
//! all against the op's hand-computed values.

use tl_ir::{UserOp, UserOpRef};
use tl_session::{Backend, LinkedSession, Ops, Options, Session};
use tl_spec::{Scalar, Shape, Tensor};

/// `a·b + a` elementwise: ∂/∂a = b + 1, ∂/∂b = a.
struct MulAdd;

impl UserOp for MulAdd {
    fn name(&self) -> &'static str {
        "mulAdd"
    }
    fn arity(&self) -> usize {
        2
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        if s[0] != s[1] {
            return Err(tl_spec::Error::shape(
                "mulAdd",
                format!("{} vs {}", s[0], s[1]),
            ));
        }
        Ok(s[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map("mulAdd", x[1], |a, b| a * b + a)
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let da = x[1].zip_map("mulAdd", g, |b, g| (b + T::one()) * g)?;
        let db = x[0].zip_map("mulAdd", g, |a, g| a * g)?;
        Ok(vec![Some(da), Some(db)])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        let t = x[1].zip_map("mulAdd", dx[0], |b, d| (b + T::one()) * d)?;
        t.add(&x[0].zip_map("mulAdd", dx[1], |a, d| a * d)?)
    }
}

const A: [f64; 3] = [1.0, -2.0, 0.5];
const B: [f64; 3] = [3.0, 4.0, -1.0];

fn record<S: Ops<T = f64>>(s: &mut S) -> (tl_session::TensorRef, [tl_session::TensorRef; 2]) {
    let op = UserOpRef::new(MulAdd);
    let a = s.input(Tensor::vector(A.to_vec()), true).unwrap();
    let b = s.input(Tensor::vector(B.to_vec()), true).unwrap();
    let y = s.user(&op, &[&a, &b]).unwrap();
    let l = s.sum(&y).unwrap();
    (l, [a, b])
}

#[test]
fn the_eager_session_runs_a_user_op_on_every_backend() {
    for backend in [Backend::Cpu, Backend::CudaSim] {
        let mut s = Session::<f64>::new(Options::backend(backend)).unwrap();
        let (l, [a, b]) = record(&mut s);
        // Σ a·b + a = 3 − 8 − 0.5 + 1 − 2 + 0.5
        assert_eq!(s.value(&l).unwrap().item().unwrap(), -6.0, "{backend:?}");
        s.backward(&l).unwrap();
        let da = s.grad_of(&a).unwrap();
        let db = s.grad_of(&b).unwrap();
        assert_eq!(da.data(), &[4.0, 5.0, 0.0], "{backend:?}");
        assert_eq!(db.data(), &A, "{backend:?}");
    }
}

#[test]
fn the_linked_session_records_compiles_and_differentiates_a_user_op_forward_and_reverse() {
    let mut s = LinkedSession::<f64>::new();
    let (l, [a, b]) = record(&mut s);
    assert_eq!(s.value(&l).unwrap().item().unwrap(), -6.0);
    let grads = s.backward_scalar_dense_all(&l).unwrap();
    assert_eq!(s.grad_of(&grads, &a).unwrap().data(), &[4.0, 5.0, 0.0]);
    // Forward mode: d loss along a = (1, 1, 1) is Σ (b + 1) = 9.
    let t = s.jvp_leaf(&a, Tensor::ones([3]), &l).unwrap();
    assert_eq!(t.item().unwrap(), 9.0);
    let t = s.jvp_leaf(&b, Tensor::ones([3]), &l).unwrap();
    assert_eq!(t.item().unwrap(), A.iter().sum::<f64>());
    for backend in [Backend::Cpu, Backend::CudaSim] {
        let mut c = s.compile(backend).unwrap();
        assert_eq!(c.value(l.id()).unwrap().item().unwrap(), -6.0);
        let g = c.backward_dense(l.id(), &Tensor::scalar(1.0)).unwrap();
        assert_eq!(g[b.id()].data(), &A, "{backend:?}");
    }
}
