//! Values no handle reaches: once the last copy of a node's handle is dropped, the session
//! lets the node's value go unless a backward can read it (PyTorch frees a tensor nothing
//! refers to, and under `torch.no_grad()` that is every intermediate value). A chain recorded
//! without gradients then holds two or three values at a time instead of all of them, on
//! every session and backend, with the same bits as a chain whose handles are all kept; a
//! value a backward reads stays, and a view keeps the buffer it views.

use tl_session::{Backend, LinkedSession, Ops, Optimizer, Options, Session, TensorRef, Train};
use tl_spec::{Shape, Tensor};

/// Elements of each value in the chain (64 KiB of f32).
pub(crate) const N: usize = 64 * 256;
/// Ops in the chain.
pub(crate) const K: usize = 12;

fn sim() -> Session<f32> {
    Session::new(Options::backend(Backend::CudaSim)).unwrap()
}

fn linked_on(backend: Backend) -> LinkedSession<f32> {
    let mut s = LinkedSession::new();
    s.set_backend(backend).unwrap();
    s
}

/// `k` alternating tanh and scale ops on a [64, 256] input, recorded without gradients;
/// `keep` holds every handle until the output is read, else each is dropped as the next op
/// takes its place. Returns the output's bits and `held(&session)` read after the output.
pub(crate) fn chain<S: Train<T = f32>>(
    mut s: S,
    k: usize,
    keep: bool,
    held: impl Fn(&S) -> usize,
) -> (Vec<u32>, usize) {
    s.set_grad_enabled(false);
    let x = Tensor::from_fn([64, 256], |i| (i as f32 * 0.013).sin());
    let mut h = s.input(x, true).unwrap();
    let mut kept: Vec<TensorRef> = Vec::new();
    for i in 0..k {
        let next = match i % 2 {
            0 => s.tanh(&h).unwrap(),
            _ => s.scale(&h, 1.5).unwrap(),
        };
        let prev = std::mem::replace(&mut h, next);
        if keep {
            kept.push(prev);
        }
    }
    let bits = s
        .read(&h)
        .unwrap()
        .data()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let held = held(&s);
    drop(kept);
    (bits, held)
}

#[test]
fn a_chain_without_gradients_frees_each_value_its_handles_let_go() {
    // The CPU tape: buffers drawn fresh (pool misses); the sim: the device's peak live bytes.
    let misses = |s: &Session<f32>| s.pool_stats().unwrap().missed as usize;
    let linked_misses = |s: &LinkedSession<f32>| s.pool_stats().unwrap().missed as usize;
    let peak = |s: &Session<f32>| s.memory_usage().unwrap().peak_bytes;
    let linked_peak = |s: &LinkedSession<f32>| s.memory_usage().unwrap().peak_bytes;
    let cpu = || Session::<f32>::new(Options::default()).unwrap();
    let bytes = N * 4;
    type Run = (
        &'static str,
        (Vec<u32>, usize),
        (Vec<u32>, usize),
        usize,
        usize,
    );
    // The CPU: after the first two ops every buffer comes from the pool (what the value two
    // ops back let go), so the whole chain draws as many fresh buffers as its first two ops
    // do; with every handle kept, each op draws its own.
    let first_two = chain(cpu(), 2, true, misses).1;
    let linked_first_two = chain(LinkedSession::new(), 2, true, linked_misses).1;
    let runs: [Run; 4] = [
        (
            "eager cpu",
            chain(cpu(), K, false, misses),
            chain(cpu(), K, true, misses),
            first_two,
            K,
        ),
        (
            "linked cpu",
            chain(LinkedSession::new(), K, false, linked_misses),
            chain(LinkedSession::new(), K, true, linked_misses),
            linked_first_two,
            K,
        ),
        // The device: the input, the last value and the one an op writes, against every value.
        (
            "eager cuda-sim",
            chain(sim(), K, false, peak),
            chain(sim(), K, true, peak),
            3 * bytes,
            (K + 1) * bytes,
        ),
        (
            "linked cuda-sim",
            chain(linked_on(Backend::CudaSim), K, false, linked_peak),
            chain(linked_on(Backend::CudaSim), K, true, linked_peak),
            3 * bytes,
            (K + 1) * bytes,
        ),
    ];
    for (name, (bits, freed), (kept_bits, kept), at_most, at_least) in runs {
        assert_eq!(bits, kept_bits, "{name}: the same values");
        println!("{name}: {freed} with handles dropped, {kept} with every handle kept");
        assert!(freed <= at_most, "{name}: {freed} > {at_most}");
        assert!(kept >= at_least, "{name}: {kept} < {at_least}");
    }
}

/// `m = tanh(tanh(c))` of a constant (no gradient), `y = sum(w · m)`: `m`'s handle and the
/// inner tanh's are dropped before the step, unless `keep`. Returns `w` after an SGD step.
fn step_through_a_constant<S: Train<T = f32>>(mut s: S, keep: bool) -> Tensor<f32> {
    let p = s
        .param(Tensor::from_fn([8, 8], |i| i as f32 * 0.1), Some("w"), true)
        .unwrap();
    let w = s.use_param(&p).unwrap();
    let c = s
        .constant(Tensor::from_fn([8, 8], |i| (i as f32 * 0.7).cos()))
        .unwrap();
    let inner = s.tanh(&c).unwrap();
    let m = s.tanh(&inner).unwrap();
    let y = s.mul(&w, &m).unwrap();
    let kept = keep.then(|| (inner.clone(), m.clone()));
    drop((inner, m));
    // The next ops are where the eager session lets dropped values go.
    let y = s.scale(&y, 2.0).unwrap();
    let loss = s.sum(&y).unwrap();
    s.backward_step(&loss, &mut Optimizer::sgd(0.5).unwrap())
        .unwrap();
    drop(kept);
    s.param_value(&p).unwrap()
}

#[test]
fn a_value_a_backward_reads_is_kept_when_its_handle_is_dropped() {
    // The inner tanh is freed (nothing that requires grad reads it); `m` is kept: the mul's
    // backward reads it for w's gradient. A wrong release is an error or other bits.
    let cpu = || Session::<f32>::new(Options::default()).unwrap();
    let runs = [
        (
            "eager cpu",
            step_through_a_constant(cpu(), false),
            step_through_a_constant(cpu(), true),
        ),
        (
            "eager cuda-sim",
            step_through_a_constant(sim(), false),
            step_through_a_constant(sim(), true),
        ),
        (
            "linked cpu",
            step_through_a_constant(LinkedSession::new(), false),
            step_through_a_constant(LinkedSession::new(), true),
        ),
    ];
    for (name, dropped, kept) in runs {
        assert_eq!(dropped, kept, "{name}");
        assert_ne!(
            dropped,
            Tensor::from_fn([8, 8], |i| i as f32 * 0.1),
            "{name}: the step moved w"
        );
    }
}

/// `e = exp(reshape(tanh(x)))` on the sim, tanh's handle dropped before the exp unless
/// `keep`; then the view's handle dropped and one more op. Returns e's and the view's values
/// and the device's live bytes after the exp and after the last op.
fn through_a_view(keep: bool) -> (Tensor<f32>, Tensor<f32>, usize, usize) {
    let mut s = sim();
    s.set_grad_enabled(false);
    let x = Tensor::from_fn([64, 256], |i| (i as f32 * 0.01).sin());
    let x = s.input(x, false).unwrap();
    let h = s.tanh(&x).unwrap();
    let v = s.reshape(&h, Shape::new(&[256, 64])).unwrap();
    let kept = keep.then(|| h.clone());
    drop(h);
    let e = s.exp(&v).unwrap();
    let with_view = s.memory_usage().unwrap().live_bytes;
    let (ev, vv) = (s.read(&e).unwrap(), s.read(&v).unwrap());
    drop(v);
    let _next = s.scale(&e, 1.0).unwrap();
    let after = s.memory_usage().unwrap().live_bytes;
    drop(kept);
    s.reset();
    let usage = s.memory_usage().unwrap();
    assert_eq!(
        Some(usage.live_buffers() as usize),
        s.device_live_buffers(),
        "each buffer released once"
    );
    assert_eq!(usage.live_bytes, 0, "the reset frees the rest");
    (ev, vv, with_view, after)
}

#[test]
fn a_view_keeps_the_buffer_it_views_on_the_device() {
    // `v = reshape(tanh(x))` shares tanh's buffer on the CUDA tape: dropping tanh's handle
    // leaves the buffer to `v`; dropping `v`'s too gives it back to the device.
    let (e, v, with_view, after) = through_a_view(false);
    let (kept_e, kept_v, kept_with_view, kept_after) = through_a_view(true);
    assert_eq!(
        (e, v),
        (kept_e, kept_v),
        "tanh's buffer survived behind the view"
    );
    let bytes = N * 4;
    assert_eq!(
        with_view,
        3 * bytes,
        "x, tanh's buffer (held by the view) and exp"
    );
    assert_eq!(kept_with_view, 3 * bytes);
    assert_eq!(
        after,
        3 * bytes,
        "x, exp and the scale: tanh's buffer went with the view"
    );
    assert_eq!(kept_after, 4 * bytes, "tanh's handle kept its buffer");
}

#[test]
fn an_eager_read_lets_go_of_what_was_dropped_after_the_last_op() {
    // `a` is dropped after the pass's last op (`b = exp(a)`): no op follows to release it, so
    // the read of `b` does (it used to stay until the reset). The same bits with `a` kept.
    let run = |keep: bool| {
        let mut s = sim();
        s.set_grad_enabled(false);
        let x = Tensor::from_fn([64, 256], |i| i as f32 * 1e-4);
        let x = s.input(x, false).unwrap();
        let a = s.tanh(&x).unwrap();
        let b = s.exp(&a).unwrap();
        let live = |s: &Session<f32>| s.memory_usage().unwrap().live_bytes;
        let before = live(&s);
        let kept = keep.then_some(a);
        let v = s.value(&b).unwrap();
        drop(kept);
        (v, before, live(&s))
    };
    let bytes = N * 4;
    let (v, before, after) = run(false);
    let (kept_v, kept_before, kept_after) = run(true);
    assert_eq!((before, kept_before), (3 * bytes, 3 * bytes), "x, a and b");
    assert_eq!(after, 2 * bytes, "x and b: a went at the read");
    assert_eq!(kept_after, 3 * bytes, "a's handle kept it");
    assert_eq!(v, kept_v);
}
