//! The catalogue beyond the first op set through the `Ops` surface: a small conv → pool →
//! linear → cross-entropy program (labels from the Nat environment) runs in the eager CPU
//! session and the linked session, and both agree with the IR reference in value and in every
//! input gradient.

use tl_ir::{GraphBuilder, Op};
use tl_session::{Backend, LinkedSession, Ops, Options, Session, TensorRef};
use tl_spec::Tensor;

fn inputs() -> Vec<Tensor<f64>> {
    let f = |n: usize, k: f64| move |i: usize| ((i * 7 + n) % 13) as f64 * k - 0.4;
    vec![
        Tensor::from_fn([2, 1, 3, 3], f(1, 0.07)), // conv weight (outC, inC, kH, kW)
        Tensor::from_fn([2], f(2, 0.1)),           // conv bias
        Tensor::from_fn([2, 1, 6, 6], f(3, 0.09)), // input batch (N, C, H, W)
        Tensor::from_fn([3, 8], f(4, 0.05)),       // linear weight: 2 channels · 2 · 2 → 3 classes
        Tensor::from_fn([3], f(5, 0.1)),           // linear bias
    ]
}

/// conv(stride 1, pad 1) → relu → maxPool(3, stride 3) → flatten per sample → linear →
/// crossEntropy against labels [2, 0].
fn program<S: Ops<T = f64>>(s: &mut S, labels_at: usize) -> Vec<TensorRef> {
    let x: Vec<TensorRef> = inputs()
        .into_iter()
        .map(|t| s.input(t, true).unwrap())
        .collect();
    let c = s.conv(&x[0], &x[1], &x[2], vec![1, 1], vec![1, 1]).unwrap();
    let r = s.relu(&c).unwrap();
    let p = s.max_pool(&r, vec![3, 3], vec![3, 3], vec![0, 0]).unwrap();
    let h = s.reshape(&p, tl_spec::Shape::new(&[2, 8])).unwrap();
    let logits = s.linear(&x[3], &x[4], &h).unwrap();
    let loss = s.cross_entropy(&logits, labels_at).unwrap();
    let mut out = x;
    out.push(loss);
    out
}

fn reference(labels: &[usize]) -> (f64, Vec<Tensor<f64>>) {
    let leaves = inputs();
    let mut b = GraphBuilder::new();
    let ids: Vec<_> = leaves
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None).unwrap())
        .collect();
    let c = b
        .apply(
            Op::Conv {
                stride: vec![1, 1],
                padding: vec![1, 1],
            },
            &[ids[0], ids[1], ids[2]],
        )
        .unwrap();
    let r = b.apply(Op::Relu, &[c]).unwrap();
    let p = b
        .apply(
            Op::MaxPool {
                kernel: vec![3, 3],
                stride: vec![3, 3],
                padding: vec![0, 0],
            },
            &[r],
        )
        .unwrap();
    let h = b
        .apply(Op::Reshape(tl_spec::Shape::new(&[2, 8])), &[p])
        .unwrap();
    let l = b.apply(Op::Linear, &[ids[3], ids[4], h]).unwrap();
    let loss = b.apply(Op::CrossEntropy { labels_at: 0 }, &[l]).unwrap();
    let g = b.finish();
    let v = g.eval(&leaves, labels).unwrap()[loss].item().unwrap();
    let grads = g
        .backprop_all(&leaves, labels, loss, &Tensor::scalar(1.0))
        .unwrap();
    (v, grads[..leaves.len()].to_vec())
}

fn close(a: &Tensor<f64>, b: &Tensor<f64>) {
    assert_eq!(a.shape(), b.shape());
    for (x, y) in a.data().iter().zip(b.data()) {
        assert!((x - y).abs() <= 1e-10 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

#[test]
fn eager_and_linked_run_the_catalogue_like_the_ir() {
    let labels = [2, 0];
    let (want_loss, want_grads) = reference(&labels);
    assert!(
        want_grads
            .iter()
            .any(|g| g.data().iter().any(|v| *v != 0.0))
    );

    let mut s = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    let at = s.record_nat_vec(&labels).pos();
    let refs = program(&mut s, at);
    let loss = refs.last().unwrap().clone();
    close(&s.value(&loss).unwrap(), &Tensor::scalar(want_loss));
    s.backward(&loss).unwrap();
    for (r, g) in refs.iter().zip(&want_grads) {
        close(&s.grad_of(r).unwrap(), g);
    }

    let mut l = LinkedSession::<f64>::new();
    let at = l.record_nat_vec(&labels).pos();
    let refs = program(&mut l, at);
    let loss = refs.last().unwrap().clone();
    close(&l.value(&loss).unwrap(), &Tensor::scalar(want_loss));
    let dense = l.backward_scalar_dense_all(&loss).unwrap();
    for (r, g) in refs.iter().zip(&want_grads) {
        close(&l.grad_of(&dense, r).unwrap(), g);
    }
}
