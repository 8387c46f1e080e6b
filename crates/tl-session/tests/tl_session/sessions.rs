//! Session behaviour: values and gradients by hand, the linked session's leaf rule, constants,
//! JVPs, compile, the Nat environment, CUDA residency, and clear errors for misuse.

use tl_session::{Backend, Error, LinkedSession, Ops, Options, Session};
use tl_spec::Tensor;

fn eager(b: Backend) -> Session<f64> {
    Session::new(Options::backend(b)).unwrap()
}

#[test]
fn eager_values_and_gradients_by_hand_on_cpu_and_cuda_sim() {
    for b in [Backend::Cpu, Backend::CudaSim] {
        let mut s = eager(b);
        let p = s
            .param(Tensor::vector(vec![1.0, 2.0]), Some("w"), true)
            .unwrap();
        let w = s.use_param(&p).unwrap();
        let w2 = s.use_param(&p).unwrap(); // used twice: grads add up
        let x = s.input(Tensor::vector(vec![3.0, -1.0]), true).unwrap();
        let y = s.mul(&w, &x).unwrap();
        let z = s.mul(&y, &w2).unwrap(); // w² x
        let loss = s.sum(&z).unwrap();
        assert_eq!(s.value(&loss).unwrap().data(), &[3.0 - 4.0]);
        s.backward(&loss).unwrap();
        // d/dw (w² x) = 2 w x = [6, -4]; d/dx = w² = [1, 4].
        assert_eq!(s.grad(&p).unwrap().data(), &[6.0, -4.0], "{b:?}");
        assert_eq!(s.grad_of(&x).unwrap().data(), &[1.0, 4.0], "{b:?}");
        s.backward_with_seed(&y, Tensor::vector(vec![1.0, 10.0]))
            .unwrap();
        assert_eq!(s.grad_of(&x).unwrap().data(), &[1.0, 20.0]);
        assert_eq!(s.grad(&p).unwrap().data(), &[3.0, -10.0]);
    }
}

#[test]
fn misuse_is_a_clear_error() {
    let mut a = eager(Backend::Cpu);
    let mut b = eager(Backend::Cpu);
    let pa = a.param(Tensor::vector(vec![1.0]), None, true).unwrap();
    let e = b.use_param(&pa).unwrap_err();
    assert!(matches!(e, Error::ForeignHandle { .. }), "{e}");
    let x = a.input(Tensor::vector(vec![1.0]), false).unwrap();
    assert!(matches!(b.exp(&x), Err(Error::ForeignHandle { .. })));
    a.reset();
    let e = a.exp(&x).unwrap_err();
    assert!(matches!(e, Error::StaleHandle { .. }), "{e}");
    assert!(e.to_string().contains("reset"), "{e}");
    // Shape errors name the op and the shapes.
    let u = a.input(Tensor::vector(vec![1.0, 2.0]), false).unwrap();
    let v = a.input(Tensor::vector(vec![1.0, 2.0, 3.0]), false).unwrap();
    let e = a.add(&u, &v).unwrap_err().to_string();
    assert!(
        e.contains("add") && e.contains("[2]") && e.contains("[3]"),
        "{e}"
    );
    assert!(matches!(a.grad_of(&u), Err(Error::Usage { .. })));
    assert!(matches!(a.backward(&u), Err(Error::Shape { .. })));
    // Nat vectors: a wrong-length write is an error; stale after reset.
    let nv = a.record_nat_vec(&[1, 2, 3]);
    assert!(matches!(
        a.write_nat_vec(nv, &[1, 2]),
        Err(Error::Count {
            expected: 3,
            got: 2,
            ..
        })
    ));
    a.write_nat_vec(nv, &[7, 8, 9]).unwrap();
    assert_eq!(a.read_nat_vec(nv).unwrap(), vec![7, 8, 9]);
    let n = a.record_nat(4);
    a.write_nat(n, 5).unwrap();
    assert_eq!(a.read_nat(n).unwrap(), 5);
    a.reset();
    assert!(matches!(a.read_nat(n), Err(Error::StaleHandle { .. })));
    // Backend::Cuda without the feature or without a GPU: see tests/cuda.rs.
}

#[test]
fn linked_leaves_come_first_and_constants_switch_to_nodes() {
    let mut s = LinkedSession::<f64>::new();
    let c0 = s.constant(Tensor::vector(vec![2.0])).unwrap(); // a leaf
    let x = s.input(Tensor::vector(vec![3.0]), true).unwrap();
    let y = s.mul(&x, &c0).unwrap();
    assert_eq!(s.graph().num_leaves(), 2);
    let e = s.input(Tensor::vector(vec![1.0]), true).unwrap_err();
    assert!(e.to_string().contains("before any op"), "{e}");
    let c1 = s.constant(Tensor::vector(vec![5.0])).unwrap(); // a node now
    assert_eq!(s.graph().num_leaves(), 2);
    assert_eq!(c1.id(), 3);
    let z = s.add(&y, &c1).unwrap();
    assert_eq!(s.value(&z).unwrap().data(), &[11.0]);
    let g = s
        .backward_dense_all(&z, &Tensor::vector(vec![1.0]))
        .unwrap();
    assert_eq!(s.grad_of(&g, &x).unwrap().data(), &[2.0]);
    assert_eq!(s.grad_of(&g, &c0).unwrap().data(), &[0.0]);
    // jvp: dz/dx = 2.
    let t = s.jvp_leaf(&x, Tensor::vector(vec![1.0]), &z).unwrap();
    assert_eq!(t.data(), &[2.0]);
    // compile into either tape: the same values and gradients.
    for b in [Backend::Cpu, Backend::CudaSim] {
        let mut c = s.compile(b).unwrap();
        assert_eq!(c.values().unwrap()[z.id()].data(), &[11.0]);
        assert_eq!(c.value(z.id()).unwrap().data(), &[11.0]);
        let e = c.value(c.map.len()).unwrap_err().to_string();
        assert!(
            e.contains("compiled value") && e.contains("not in this graph"),
            "{e}"
        );
        let gc = c
            .backward_dense(z.id(), &Tensor::vector(vec![1.0]))
            .unwrap();
        assert_eq!(gc[x.id()].data(), &[2.0]);
    }
    s.reset();
    assert!(matches!(s.value(&z), Err(Error::StaleHandle { .. })));
    let a = s.input(Tensor::scalar(3.0), true).unwrap();
    let sq = s.mul(&a, &a).unwrap();
    assert_eq!(s.jvp_scalar_leaf(&a, &sq).unwrap().data(), &[6.0]);
    let l = s.backward_scalar_dense_all(&sq).unwrap();
    assert_eq!(l[a.id()].data(), &[6.0]);
}

#[test]
fn cuda_params_stay_resident_sync_on_read_and_host_writes_invalidate() {
    let mut s = Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap();
    let p = s
        .param(Tensor::vector(vec![1.0, 2.0]), Some("w"), true)
        .unwrap();
    for _ in 0..3 {
        let w = s.use_param(&p).unwrap();
        let x = s.input(Tensor::vector(vec![1.0, 1.0]), false).unwrap();
        let y = s.mul(&w, &x).unwrap();
        let l = s.sum(&y).unwrap();
        s.backward(&l).unwrap();
        s.sgd_step(0.5).unwrap();
        s.reset();
        // Only the parameter mirror survives a reset.
        assert_eq!(s.memory_usage().unwrap().live_bytes, 2 * 4);
    }
    assert_eq!(s.param_value(&p).unwrap().data(), &[-0.5, 0.5]);
    s.set_param(&p, Tensor::vector(vec![10.0, 20.0])).unwrap();
    let w = s.use_param(&p).unwrap();
    assert_eq!(s.value(&w).unwrap().data(), &[10.0, 20.0]);
    s.reset();
    assert_eq!(
        s.memory_usage().unwrap().live_bytes,
        2 * 4,
        "the old mirror was released"
    );
    let e = s.set_param(&p, Tensor::vector(vec![1.0])).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }));
}

/// `set_flash_products(FlashProducts::Tf32x3)` reaches the fused attention of both sessions
/// on the CUDA sim: the value of a causal `scaledDotProductAttention` (70 positions, 2 heads of
/// 16) is the tensor-core forward's, other bits than the default session's and within f32
/// tolerance of them; the eager and linked sessions give the same bits; on the CPU the setting
/// changes nothing. Under bf16 autocast the two sessions' tensor-core cores give the same bits
/// too, within the rounding of the FMA core's.
#[test]
fn flash_products_reach_the_fused_attention_of_both_sessions() {
    use tl_session::{FlashProducts, Precision, Train};
    use tl_spec::ops::attention::Mask;
    let (n, p) = (70, 32);
    let qkv: Vec<Tensor<f32>> = (0..3)
        .map(|s| Tensor::from_fn([n, p], move |i| ((i * 7 + s * 5) % 13) as f32 / 4.0 - 1.5))
        .collect();
    fn attention<O: Train<T = f32>>(s: &mut O, qkv: &[Tensor<f32>]) -> Vec<u32> {
        let [q, k, v] = [0, 1, 2].map(|i| s.input(qkv[i].clone(), false).unwrap());
        let mask = Some(Mask::causal(70).unwrap());
        let y = s
            .scaled_dot_product_attention(&q, &k, &v, 2, mask, true)
            .unwrap();
        s.read(&y)
            .unwrap()
            .data()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }
    let eager = |b, products| {
        let mut s = Session::<f32>::new(Options::backend(b)).unwrap();
        if let Some(p) = products {
            s.set_flash_products(p);
        }
        attention(&mut s, &qkv)
    };
    let tc = Some(FlashProducts::Tf32x3);
    let (fma, on_tc) = (eager(Backend::CudaSim, None), eager(Backend::CudaSim, tc));
    assert_ne!(fma, on_tc, "the setting did not reach the fused attention");
    for (a, b) in fma.iter().zip(&on_tc) {
        let (a, b) = (f32::from_bits(*a), f32::from_bits(*b));
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} against {b}");
    }
    let mut linked = LinkedSession::<f32>::new();
    linked.set_backend(Backend::CudaSim).unwrap();
    linked.set_flash_products(FlashProducts::Tf32x3);
    assert_eq!(attention(&mut linked, &qkv), on_tc, "linked against eager");
    assert_eq!(
        eager(Backend::Cpu, tc),
        eager(Backend::Cpu, None),
        "the CPU"
    );
    let bf16 = |products| {
        let opts = Options {
            precision: Precision::Bf16,
            ..Options::backend(Backend::CudaSim)
        };
        let mut s = Session::<f32>::new(opts).unwrap();
        s.set_flash_products(products);
        attention(&mut s, &qkv)
    };
    let (fma, on_tc) = (bf16(FlashProducts::Fma), bf16(FlashProducts::Tf32x3));
    for (a, b) in fma.iter().zip(&on_tc) {
        let (a, b) = (f32::from_bits(*a), f32::from_bits(*b));
        assert!(
            (a - b).abs() <= a.abs().max(1.0) / 64.0,
            "bf16: {a} against {b}"
        );
    }
    let mut linked = LinkedSession::<f32>::new();
    linked.set_backend(Backend::CudaSim).unwrap();
    linked.set_precision(Precision::Bf16).unwrap();
    linked.set_flash_products(FlashProducts::Tf32x3);
    let got = attention(&mut linked, &qkv);
    assert_eq!(got, on_tc, "bf16: linked against eager");
}
