//! Buffer lifetimes and release paths: a long train-like loop leaks nothing, releases are
//! idempotent, resets keep parameter mirrors, workspaces go after backprop, errors leave
//! nothing allocated.

use crate::common::{Domain, Gen, draw, random_leaves};
use tl_ir::Op;
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, Error, SimDevice};

#[test]
fn a_thousand_training_steps_end_with_only_the_parameters_live() {
    let mut rnd = Gen::new(11);
    let mut tape = CudaTape::new(SimDevice::new());
    let shapes = [vec![8, 4], vec![8], vec![2, 8], vec![2]];
    let params: Vec<AnyBuffer> = shapes
        .iter()
        .map(|s| {
            let init = draw(&mut rnd, &Shape::new(s), Domain::Any).map(|v| 0.3 * v);
            AnyBuffer::upload(tape.device_mut(), &init).unwrap()
        })
        .collect();
    let param_bytes: usize = params.iter().map(AnyBuffer::bytes).sum();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    let lr = 0.05f32;
    let (mut first_loss, mut last_loss) = (0.0, 0.0);
    let mut device_allocs_after_warmup = 0;
    for step in 0..1000 {
        // A batch of 5 inputs; the target is a fixed smooth function of them.
        let x = draw(&mut rnd, &Shape::new(&[5, 4]), Domain::Any);
        let t = Tensor::from_fn([5, 2], |i| {
            let row = &x.data()[(i / 2) * 4..(i / 2) * 4 + 4];
            if i % 2 == 0 {
                0.5 * (row[0] - row[1]).tanh()
            } else {
                0.25 * (row[2] + row[3])
            }
        });
        let ids: Vec<usize> = params
            .iter()
            .map(|p| tape.leaf_borrowed(p.clone(), None, true))
            .collect();
        let xi = tape.upload_leaf(&x, Some("x"), false).unwrap();
        let ti = tape.upload_leaf(&t, Some("t"), false).unwrap();
        let h = tape.apply(&Op::Linear, &[ids[0], ids[1], xi]).unwrap();
        let a = tape.apply(&Op::Tanh, &[h]).unwrap();
        let o = tape.apply(&Op::Linear, &[ids[2], ids[3], a]).unwrap();
        let loss = tape.apply(&Op::MseLoss, &[o, ti]).unwrap();
        let l: Tensor<f64> = tape.read(loss).unwrap();
        if step == 0 {
            first_loss = l.item().unwrap();
        }
        last_loss = l.item().unwrap();

        let grads = tape.backward_params(loss, &seed, &ids).unwrap();
        for (p, id) in params.iter().zip(&ids) {
            tape.device_mut()
                .axpy_assign(p.buffer(), -lr, grads[id].buffer())
                .unwrap();
        }
        assert_eq!(tape.release_grad_map(grads), 4);
        tape.reset();
        if step == 10 {
            device_allocs_after_warmup = tape.device().memory_usage().device_alloc_count;
        }
    }
    assert!(seed.release(tape.device_mut()));
    let u = tape.device().memory_usage();
    assert_eq!(u.live_bytes, param_bytes, "{u}");
    assert_eq!(u.live_buffers(), 4, "{u}");
    assert_eq!(u.live_buffers(), tape.device().live_buffers() as u64);
    assert!(params.iter().all(|p| tape.device().is_live(p.buffer())));
    // The pool served every step after the warm-up from its cache.
    assert_eq!(u.device_alloc_count, device_allocs_after_warmup, "{u}");
    assert!(u.alloc_count > 20_000, "{u}");
    // And the loop did learn.
    assert!(
        last_loss < 0.2 * first_loss,
        "loss {first_loss} -> {last_loss}"
    );
    // Returning the cache leaves only the parameters' classes reserved.
    let c = tape.device_mut().collect(true);
    assert!(c.blocks > 0);
    assert_eq!(tape.device().memory_usage().cached_bytes, 0);
    assert_eq!(tape.device().memory_usage().reserved_bytes, 4 * 512);
}

#[test]
fn release_is_idempotent_and_reports_what_it_freed() {
    let mut dev = SimDevice::new();
    let a = dev.upload(&[1.0, 2.0]).unwrap();
    assert!(dev.release(a));
    assert!(
        !dev.release(a),
        "the second release is harmless and frees nothing"
    );
    let u = dev.memory_usage();
    assert_eq!((u.alloc_count, u.free_count, u.live_bytes), (1, 1, 0));
    assert!(matches!(
        dev.download(a),
        Err(Error::Released { op: "download", .. })
    ));
    assert!(matches!(
        dev.add(a, a),
        Err(Error::Released { op: "add", .. })
    ));

    let (b, c) = (dev.zeros(3).unwrap(), dev.full(3, 2.0).unwrap());
    let kept = dev.release_then(b, c);
    assert_eq!(dev.download(kept).unwrap(), vec![2.0; 3]);
    assert!(!dev.is_live(b));
    assert_eq!(dev.release_all([b, c, c]), 1);
    // A handle of another device is not live here and is never freed by it.
    let mut other = SimDevice::new();
    let d = other.upload(&[1.0]).unwrap();
    assert!(!dev.release(d));
    assert!(other.is_live(d));
    // Repeated uploads of the same data are distinct allocations.
    let (e, f) = (
        dev.upload_with_token(&[1.0], 1).unwrap(),
        dev.upload_with_token(&[1.0], 1).unwrap(),
    );
    assert_ne!(e, f);
    assert!(dev.release(e) && dev.is_live(f));
}

#[test]
fn reset_releases_owned_values_and_keeps_borrowed_leaves_and_views_alone() {
    let mut tape = CudaTape::new(SimDevice::new());
    let w = AnyBuffer::upload(tape.device_mut(), &Tensor::<f64>::ones([2, 3])).unwrap();
    let wi = tape.leaf_borrowed(w.clone(), Some("w"), true);
    let xi = tape
        .upload_leaf(&Tensor::<f64>::ones([2, 3]), None, false)
        .unwrap();
    let r = tape
        .apply(&Op::Reshape(Shape::new(&[3, 2])), &[wi])
        .unwrap();
    let f = tape.apply(&Op::Flatten, &[xi]).unwrap();
    let y = tape.apply(&Op::Exp, &[r]).unwrap();
    assert!(!tape.node(r).unwrap().owns_value() && !tape.node(f).unwrap().owns_value());
    assert_eq!(
        tape.get(r).unwrap().buffer(),
        w.buffer(),
        "reshape is a no-copy view"
    );
    assert!(tape.node(y).unwrap().owns_value());
    assert_eq!(tape.reset(), 2, "the uploaded leaf and exp's value");
    assert!(tape.is_empty());
    assert!(
        tape.device().is_live(w.buffer()),
        "the parameter mirror survives"
    );
    assert_eq!(tape.device().memory_usage().live_bytes, w.bytes());
}

#[test]
fn workspace_is_released_after_backprop_and_recomputed_if_needed_again() {
    let mut tape = CudaTape::new(SimDevice::new());
    let a = tape
        .upload_leaf(&Tensor::<f64>::vector(vec![1.0, 2.0, 4.0]), None, true)
        .unwrap();
    let b = tape
        .upload_leaf(&Tensor::<f64>::vector(vec![0.0, 3.0, 1.0]), None, false)
        .unwrap();
    let l = tape.apply(&Op::MseLoss, &[a, b]).unwrap();
    assert_eq!(tape.node(l).unwrap().cleanup().len(), 1, "mse keeps ŷ − y");
    let ws = tape.node(l).unwrap().cleanup()[0];
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    let g1 = tape.backward_dense(l, &seed).unwrap();
    assert!(tape.node(l).unwrap().cleanup().is_empty());
    assert!(!tape.device().is_live(ws));
    let g2 = tape.backward_dense(l, &seed).unwrap();
    let (d1, d2): (Tensor<f32>, Tensor<f32>) = (
        g1[a].download(tape.device()).unwrap(),
        g2[a].download(tape.device()).unwrap(),
    );
    assert_eq!(d1, d2);
    assert_eq!(d1.data(), &[2.0f32 / 3.0, -2.0 / 3.0, 2.0]);
    // Frozen operands: the node needs no backward, so the workspace goes at once.
    let c = tape.apply(&Op::MseLoss, &[b, b]).unwrap();
    assert!(tape.node(c).unwrap().cleanup().is_empty());
    let (live, n) = (tape.device().live_buffers(), g1.len() + g2.len());
    assert_eq!(n, 6);
    assert_eq!(tape.release_grads(g1) + tape.release_grads(g2), n);
    assert_eq!(tape.device().live_buffers(), live - n);
}

#[test]
fn dense_from_and_first_n_accumulate_from_given_gradients() {
    let mut tape = CudaTape::new(SimDevice::new());
    let x = tape
        .upload_leaf(&Tensor::<f64>::vector(vec![0.0, 1.0]), None, true)
        .unwrap();
    let y = tape.apply(&Op::Exp, &[x]).unwrap();
    let _z = tape.apply(&Op::Sum, &[y]).unwrap();
    let shapes: Vec<Shape> = (0..tape.len())
        .map(|i| tape.get(i).unwrap().shape().clone())
        .collect();
    let grads0 = |tape: &mut CudaTape<SimDevice>, gy: f32, gz: f32| -> Vec<AnyBuffer> {
        [0.0, gy, gz]
            .iter()
            .zip(&shapes)
            .map(|(&v, s)| AnyBuffer::full(tape.device_mut(), s, v).unwrap())
            .collect()
    };
    // Seeding y with 2 and z with 1: dx = exp(x)·(2 + 1).
    let g0 = grads0(&mut tape, 2.0, 1.0);
    let g = tape.backward_dense_from(g0).unwrap();
    let dx: Tensor<f32> = g[x].download(tape.device()).unwrap();
    assert_eq!(dx.data(), &[3.0, 3.0 * 1f32.exp()]);
    tape.release_grads(g);
    // Over the first 2 nodes only, z's seed is never propagated: dx = exp(x)·2.
    let g0 = grads0(&mut tape, 2.0, 1.0);
    let g = tape.backward_first_n(2, g0).unwrap();
    let dx: Tensor<f32> = g[x].download(tape.device()).unwrap();
    assert_eq!(dx.data(), &[2.0, 2.0 * 1f32.exp()]);
    tape.release_grads(g);
    // A gradient array that reuses one buffer for two ids is refused, and released.
    let live = tape.device().live_buffers();
    let one = AnyBuffer::full(tape.device_mut(), &shapes[0], 1.0).unwrap();
    let bad = vec![
        one.clone(),
        one,
        AnyBuffer::zeros(tape.device_mut(), &shapes[2]).unwrap(),
    ];
    let e = tape.backward_dense_from(bad).unwrap_err();
    assert!(e.to_string().contains("shares its buffer"), "{e}");
    assert_eq!(tape.device().live_buffers(), live);
    // Wrong length and wrong shapes are errors too.
    assert!(matches!(
        tape.backward_dense_from(vec![]),
        Err(Error::Count { .. })
    ));
    let g0 = grads0(&mut tape, 2.0, 1.0);
    assert!(tape.backward_first_n(4, g0).is_err());
    assert_eq!(tape.device().live_buffers(), live);
}

#[test]
fn sparse_parameter_gradients_hold_only_the_wanted_ids() {
    let mut tape = CudaTape::new(SimDevice::new());
    let w = tape
        .upload_leaf(&Tensor::<f64>::ones([2]), Some("w"), true)
        .unwrap();
    let u = tape
        .upload_leaf(&Tensor::<f64>::ones([2]), Some("unused"), true)
        .unwrap();
    let y = tape.apply(&Op::Scale(3.0), &[w]).unwrap();
    let s = tape.apply(&Op::Sum, &[y]).unwrap();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    let before = tape.device().live_buffers();
    let map = tape.backward_params(s, &seed, &[w, u]).unwrap();
    assert_eq!(map.len(), 2);
    assert_eq!(
        tape.device().live_buffers(),
        before + 2,
        "only the map's buffers remain"
    );
    let dw: Tensor<f32> = map[&w].download(tape.device()).unwrap();
    let du: Tensor<f32> = map[&u].download(tape.device()).unwrap();
    assert_eq!(
        (dw.data(), du.data()),
        (&[3.0f32, 3.0][..], &[0.0f32, 0.0][..])
    );
    assert_eq!(tape.release_grad_map(map), 2);
    assert!(matches!(
        tape.backward_params(s, &seed, &[99]),
        Err(Error::UnknownId { id: 99, .. })
    ));
}

#[test]
fn a_rejected_op_leaves_the_tape_and_the_device_unchanged() {
    let mut tape = CudaTape::new(SimDevice::new());
    let a = tape
        .upload_leaf(&Tensor::<f64>::zeros([2, 3]), None, true)
        .unwrap();
    let b = tape
        .upload_leaf(&Tensor::<f64>::zeros([3, 2]), None, true)
        .unwrap();
    let before = tape.device().memory_usage();
    let e = tape.apply(&Op::Add, &[a, b]).unwrap_err().to_string();
    assert!(
        e.contains("add") && e.contains("[2, 3]") && e.contains("[3, 2]"),
        "{e}"
    );
    let e = tape.apply(&Op::Matmul, &[a, a]).unwrap_err().to_string();
    assert!(e.contains("matmul") && e.contains("[2, 3]"), "{e}");
    assert!(matches!(
        tape.apply(&Op::Exp, &[7]),
        Err(Error::UnknownId { id: 7, .. })
    ));
    assert!(tape.apply(&Op::Exp, &[a, b]).is_err(), "arity");
    let e = tape.value(a, &Shape::new(&[6])).unwrap_err().to_string();
    assert!(
        e.contains("value") && e.contains("[2, 3]") && e.contains("[6]"),
        "{e}"
    );
    let seed = AnyBuffer::zeros(tape.device_mut(), &Shape::new(&[2])).unwrap();
    let e = tape.backward_dense(a, &seed).unwrap_err().to_string();
    assert!(
        e.contains("seed") && e.contains("[2, 3]") && e.contains("[2]"),
        "{e}"
    );
    seed.release(tape.device_mut());
    assert_eq!(tape.len(), 2);
    assert_eq!(tape.device().memory_usage().live_bytes, before.live_bytes);
    assert_eq!(tape.device().live_buffers(), 2);
}

/// `add`, `sub` and `reshape` pass the output cotangent on as it is: on the sparse path the
/// buffer is handed to the first parent that has no gradient yet (no copy), later parents copy
/// it or accumulate from it. Covered: an operand used twice (`a + a`, `c − c`), a parent whose
/// slot is already filled, reshapes in a chain, and the dense path (which must copy). The
/// gradients match the dense path's and the closed form, and nothing leaks.
#[test]
fn identity_cotangents_are_handed_over_not_copied() {
    let mut tape = CudaTape::new(SimDevice::new());
    let data = |k: f64| Tensor::<f64>::from_fn([2, 3], |i| k + i as f64);
    let a = tape.upload_leaf(&data(1.0), Some("a"), true).unwrap();
    let b = tape.upload_leaf(&data(-2.0), Some("b"), true).unwrap();
    let c = tape.upload_leaf(&data(0.5), Some("c"), true).unwrap();
    // y = reshape(reshape((a + a) − b)) + reshape(b) + (c − c): ∂a = 2, ∂b = 0, ∂c = 0 under
    // sum(w ⊙ y) with w = 1..6 (∂ = 2w, 0, 0).
    let aa = tape.apply(&Op::Add, &[a, a]).unwrap();
    let d = tape.apply(&Op::Sub, &[aa, b]).unwrap();
    let r1 = tape.apply(&Op::Reshape(Shape::new(&[3, 2])), &[d]).unwrap();
    let r2 = tape.apply(&Op::Reshape(Shape::new(&[6])), &[r1]).unwrap();
    let rb = tape.apply(&Op::Reshape(Shape::new(&[6])), &[b]).unwrap();
    let s1 = tape.apply(&Op::Add, &[r2, rb]).unwrap();
    let cc = tape.apply(&Op::Sub, &[c, c]).unwrap();
    let rc = tape.apply(&Op::Reshape(Shape::new(&[6])), &[cc]).unwrap();
    let y = tape.apply(&Op::Add, &[s1, rc]).unwrap();
    let w = Tensor::<f64>::from_fn([6], |i| 1.0 + i as f64);
    let wi = tape.upload_leaf(&w, Some("w"), false).unwrap();
    let wy = tape.apply(&Op::Mul, &[y, wi]).unwrap();
    let loss = tape.apply(&Op::Sum, &[wy]).unwrap();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();

    let dense = tape.backward_dense(loss, &seed).unwrap();
    let want: Vec<Tensor<f32>> = [a, b, c]
        .iter()
        .map(|&i| dense[i].download(tape.device()).unwrap())
        .collect();
    tape.release_grads(dense);

    let before = (tape.device().live_buffers(), tape.device().traffic());
    let map = tape.backward_params(loss, &seed, &[a, b, c]).unwrap();
    let launches = (tape.device().traffic() - before.1).launches;
    assert_eq!(
        tape.device().live_buffers(),
        before.0 + 3,
        "only the map's buffers"
    );
    for (k, &i) in [a, b, c].iter().enumerate() {
        let got: Tensor<f32> = map[&i].download(tape.device()).unwrap();
        assert_eq!(got.shape().dims(), &[2, 3]);
        let bits = |t: &Tensor<f32>| crate::common::bits(t.data());
        assert_eq!(bits(&got), bits(&want[k]), "id {i} against the dense path");
        let closed: Vec<f32> = (0..6)
            .map(|j| [2.0 * (1.0 + j as f32), 0.0, 0.0][k])
            .collect();
        assert_eq!(got.data(), &closed[..], "id {i}");
    }
    assert_eq!(tape.release_grad_map(map), 3);
    assert_eq!(tape.device().live_buffers(), before.0);
    // The launches: the seed's copy, sum's broadcast, mul's product (w is constant), sub's
    // negation twice (c − c and (a + a) − b), three accumulations where a parent already had a
    // gradient (a, b, c once each): 8. The second operand of each add whose first operand took
    // the buffer shares it (b's and c's slots then receive sums into fresh buffers, which
    // leave the shared one as s1 and r2 read it); copying it took two launches more, and
    // copying every identity cotangent ten more.
    assert_eq!(launches, 8, "sparse backward launches");
}

/// Two parameters added together receive one identity cotangent: the sweep shares its buffer
/// between their slots, and `backward_params` hands each a buffer of its own (a copy for the
/// second), releasing nothing a gradient uses.
#[test]
fn parameters_sharing_a_cotangent_get_buffers_of_their_own() {
    let mut tape = CudaTape::new(SimDevice::new());
    let p = tape
        .upload_leaf(&Tensor::<f64>::vector(vec![1.0, 2.0, 3.0]), Some("p"), true)
        .unwrap();
    let q = tape
        .upload_leaf(
            &Tensor::<f64>::vector(vec![-1.0, 0.5, 4.0]),
            Some("q"),
            true,
        )
        .unwrap();
    let w = tape
        .upload_leaf(&Tensor::<f64>::vector(vec![3.0, -2.0, 0.25]), None, false)
        .unwrap();
    let y = tape.apply(&Op::Add, &[p, q]).unwrap();
    let wy = tape.apply(&Op::Mul, &[y, w]).unwrap();
    let loss = tape.apply(&Op::Sum, &[wy]).unwrap();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    let live = tape.device().live_buffers();
    let map = tape.backward_params(loss, &seed, &[p, q]).unwrap();
    assert_eq!(
        tape.device().live_buffers(),
        live + 2,
        "the two gradients only"
    );
    assert_ne!(map[&p].buffer().id(), map[&q].buffer().id());
    for id in [p, q] {
        let g: Tensor<f32> = map[&id].download(tape.device()).unwrap();
        assert_eq!(g.data(), &[3.0, -2.0, 0.25], "id {id}");
    }
    assert_eq!(tape.release_grad_map(map), 2);
    assert_eq!(tape.device().live_buffers(), live);
}

#[test]
fn attention_keeps_its_chain_for_the_backward_and_the_fused_form_not_the_probabilities() {
    let mut rnd = Gen::new(23);
    let (dm, p, heads) = (6, 4, 2);
    let shapes = [[dm, p], [dm, p], [dm, p], [p, dm], [5, dm]];
    let causal = tl_spec::ops::attention::Mask::causal(5).unwrap();
    for (fused, mask) in [(false, None), (true, None), (false, Some(causal.clone()))] {
        let mut tape = CudaTape::new(SimDevice::new());
        let leaves = random_leaves(&mut tape, &mut rnd, &shapes);
        let op = Op::MultiHeadAttention {
            heads,
            mask: mask.clone(),
            fused,
        };
        let before = tape.device().traffic();
        let y = tape.apply(&op, &leaves).unwrap();
        let forward = (tape.device().traffic() - before).launches;
        // Three projections, the scores (reading the heads of Q and K in place), the softmax
        // (the masked one scales first: one launch more), A·V written into C with its heads
        // merged, the output projection: no head split or merge of their own. Fused: the
        // projections, the fused core, the output projection.
        let chain = match (fused, mask.is_some()) {
            (true, _) => 4,
            (false, true) => 7,
            (false, false) => 6,
        };
        assert_eq!(forward, chain + 1, "fused={fused} {mask:?}");
        let w = tape
            .upload_leaf(
                &draw(&mut rnd, &Shape::new(&[5, dm]), Domain::Any),
                None,
                false,
            )
            .unwrap();
        let wy = tape.apply(&Op::Mul, &[y, w]).unwrap();
        let loss = tape.apply(&Op::Sum, &[wy]).unwrap();
        let kept = tape.node(y).unwrap().cleanup().to_vec();
        // Q, K, V and C; then the probabilities (heads·n² floats), or when fused each row's
        // log-sum-exp (heads·n floats).
        let last = if fused { heads * 5 } else { heads * 5 * 5 };
        assert_eq!(kept.len(), 5, "fused={fused}");
        assert_eq!(kept[4].len(), last, "fused={fused}");
        let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
        let run = |tape: &mut CudaTape<SimDevice>| {
            let before = tape.device().traffic();
            let g = tape.backward_dense(loss, &seed).unwrap();
            let launches = (tape.device().traffic() - before).launches;
            let got: Vec<Tensor<f32>> = leaves
                .iter()
                .map(|&i| g[i].download(tape.device()).unwrap())
                .collect();
            tape.release_grads(g);
            (launches, got)
        };
        let (reused, from_workspace) = run(&mut tape);
        assert!(kept.iter().all(|&b| !tape.device().is_live(b)), "released");
        let (recomputed, again) = run(&mut tape);
        let bits = |t: &[Tensor<f32>]| -> Vec<Vec<u32>> {
            t.iter().map(|t| crate::common::bits(t.data())).collect()
        };
        assert_eq!(
            bits(&from_workspace),
            bits(&again),
            "fused={fused} {mask:?}"
        );
        // Recomputing the chain (all of the forward but the output projection).
        assert_eq!(recomputed - reused, chain, "fused={fused} {mask:?}");
    }
}

#[test]
fn an_owned_seed_becomes_the_outputs_gradient_without_a_copy() {
    let mut tape = CudaTape::new(SimDevice::new());
    let x = tape
        .upload_leaf(&Tensor::<f64>::vector(vec![0.5, -1.0, 2.0]), None, true)
        .unwrap();
    let y = tape.apply(&Op::Tanh, &[x]).unwrap();
    let l = tape.apply(&Op::Sum, &[y]).unwrap();
    let one = |tape: &mut CudaTape<SimDevice>| {
        AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap()
    };
    let bits = |t: Tensor<f32>| crate::common::bits(t.data());
    // Dense: the same gradients as the copied seed's, one launch fewer, the seed is l's slot.
    let seed = one(&mut tape);
    let before = tape.device().traffic();
    let copied = tape.backward_dense(l, &seed).unwrap();
    let copied_launches = (tape.device().traffic() - before).launches;
    let want = bits(copied[x].download(tape.device()).unwrap());
    tape.release_grads(copied);
    tape.device_mut().release(seed.buffer());
    let live = tape.device().live_buffers();
    let seed = one(&mut tape);
    let before = tape.device().traffic();
    let owned = tape.backward_dense_owned(l, seed.clone()).unwrap();
    assert_eq!(
        (tape.device().traffic() - before).launches,
        copied_launches - 1
    );
    assert_eq!(
        owned[l].buffer(),
        seed.buffer(),
        "the seed is the loss's gradient"
    );
    assert_eq!(bits(owned[x].download(tape.device()).unwrap()), want);
    tape.release_grads(owned);
    assert_eq!(
        tape.device().live_buffers(),
        live,
        "nothing kept, nothing leaked"
    );
    // Sparse: the same.
    let seed = one(&mut tape);
    let map = tape.backward_params_owned(l, seed, &[x]).unwrap();
    assert_eq!(bits(map[&x].download(tape.device()).unwrap()), want);
    tape.release_grad_map(map);
    assert_eq!(tape.device().live_buffers(), live);
    // A seed of the wrong shape, or a bad wanted id: an error, and the seed is released.
    let wrong = AnyBuffer::full(tape.device_mut(), &Shape::new(&[2]), 1.0).unwrap();
    assert!(tape.backward_dense_owned(l, wrong).is_err());
    let seed = one(&mut tape);
    assert!(tape.backward_params_owned(l, seed, &[99]).is_err());
    assert_eq!(tape.device().live_buffers(), live, "both seeds released");
}

#[test]
fn release_frees_what_no_backward_reads_and_a_view_holds_its_buffer() {
    let mut tape = CudaTape::new(SimDevice::new());
    let x = tape
        .upload_leaf(
            &Tensor::<f32>::from_fn([2, 3], |i| i as f32 * 0.1),
            Some("x"),
            true,
        )
        .unwrap();
    let c = tape
        .upload_leaf(
            &Tensor::<f32>::from_fn([2, 3], |i| 1.0 - i as f32 * 0.2),
            None,
            false,
        )
        .unwrap();
    let e = tape.apply(&Op::Exp, &[c]).unwrap(); // read by `m`'s backward
    let d = tape.apply(&Op::Tanh, &[c]).unwrap(); // read by a view only
    let view = tape.apply(&Op::Reshape(Shape::new(&[3, 2])), &[d]).unwrap();
    let m = tape.apply(&Op::Mul, &[x, e]).unwrap();
    assert!(
        !tape.release(x).unwrap() && !tape.release(c).unwrap(),
        "leaves keep theirs"
    );
    assert!(
        !tape.release(m).unwrap(),
        "a node that requires grad keeps it"
    );
    assert!(!tape.release(e).unwrap(), "so does an operand of one");
    let live = |t: &CudaTape<SimDevice>| t.device().memory_usage().live_buffers();
    let before = live(&tape);
    let want = tape.read::<f32>(d).unwrap();
    assert!(tape.release(d).unwrap());
    assert!(!tape.release(d).unwrap(), "released once");
    assert_eq!(live(&tape), before, "the view still holds tanh's buffer");
    let got = tape.read::<f32>(view).unwrap();
    assert_eq!(got.data(), want.data(), "read through the view");
    let err = tape.read::<f32>(d).unwrap_err();
    assert!(matches!(&err, Error::ReleasedValue { id, op, .. } if *id == d && op == "tanh"));
    assert!(matches!(
        tape.apply(&Op::Exp, &[d]),
        Err(Error::ReleasedValue { .. })
    ));
    assert!(tape.release(view).unwrap());
    assert_eq!(
        live(&tape),
        before - 1,
        "the view's release gave the buffer back"
    );
    assert_eq!(tape.node(view).unwrap().shape(), &Shape::new(&[3, 2]));
    // The backward through m runs as before; the reset frees the rest exactly once.
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::new(&[2, 3]), 1.0).unwrap();
    let g = tape.backward_dense(m, &seed).unwrap();
    let gx = g[x].download::<f32, _>(tape.device()).unwrap();
    assert_eq!(gx.data(), tape.read::<f32>(e).unwrap().data());
    tape.release_grads(g);
    seed.release(tape.device_mut());
    tape.reset();
    assert_eq!(live(&tape), 0);
    assert_eq!(tape.device().live_buffers() as u64, 0);
}

/// `x → linear → tanh → reshape → exp → sum` with a trainable weight and bias on `tape`;
/// returns the loss's id and the parameters' ids.
fn small_net(tape: &mut CudaTape<SimDevice>) -> (usize, [usize; 2]) {
    let w = Tensor::<f32>::from_fn([4, 6], |i| (i as f32 * 0.3).sin());
    let b = Tensor::<f32>::from_fn([4], |i| i as f32 * 0.1);
    let x = Tensor::<f32>::from_fn([5, 6], |i| (i as f32 * 0.2).cos());
    let w = tape.upload_leaf(&w, Some("w"), true).unwrap();
    let b = tape.upload_leaf(&b, Some("b"), true).unwrap();
    let x = tape.upload_leaf(&x, Some("x"), false).unwrap();
    let y = tape.apply(&Op::Linear, &[w, b, x]).unwrap();
    let y = tape.apply(&Op::Tanh, &[y]).unwrap();
    let y = tape.apply(&Op::Reshape(Shape::new(&[4, 5])), &[y]).unwrap();
    let y = tape.apply(&Op::Exp, &[y]).unwrap();
    (tape.apply(&Op::Sum, &[y]).unwrap(), [w, b])
}

#[test]
fn the_releasing_backward_gives_the_same_gradients_and_frees_the_values() {
    let grads = |release: bool| {
        let mut tape = CudaTape::new(SimDevice::new());
        let (loss, wanted) = small_net(&mut tape);
        let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
        let g = match release {
            true => tape.backward_params_releasing(loss, seed, &wanted).unwrap(),
            false => tape.backward_params_owned(loss, seed, &wanted).unwrap(),
        };
        let bits: Vec<Vec<u32>> = wanted
            .iter()
            .map(|w| {
                let t = g[w].download::<f32, _>(tape.device()).unwrap();
                crate::common::bits(t.data())
            })
            .collect();
        let live = tape.device().memory_usage().live_buffers();
        for id in 0..tape.len() {
            let op = tape.node(id).unwrap().op().is_some();
            assert_eq!(
                tape.node(id).unwrap().is_released(),
                op && release,
                "node {id}"
            );
        }
        tape.release_grad_map(g);
        tape.reset();
        assert_eq!(
            tape.device().memory_usage().live_buffers(),
            0,
            "each freed once"
        );
        (bits, live)
    };
    let ((kept, kept_live), (freed, freed_live)) = (grads(false), grads(true));
    assert_eq!(freed, kept, "the same gradients");
    // Three leaves and two gradients stay; linear, tanh (behind its view), exp and sum went.
    assert_eq!(freed_live, 5, "{freed_live} live after the releasing sweep");
    assert_eq!(
        kept_live,
        freed_live + 4,
        "the plain sweep keeps four values"
    );
}
