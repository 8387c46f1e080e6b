//! A training step that ends its pass (`Train::backward_step_reduced_then_reset`, what tl-nn's
//! `Runtime::step` calls) writes the CPU parameters in place: the same losses, parameters and
//! optimizer state, bit for bit, as a step followed by a reset, with each parameter keeping its
//! buffer, where the plain step writes a new one beside the old values the pass holds.

use crate::common::mlp::{Mlp, regression_grid};
use tl_session::{LinkedSession, Ops, Optimizer, Options, Param, Session, TensorRef, Train};

/// One run's record: per step the loss, then the parameters' bits and whether each kept its
/// buffer across the step; at the end the optimizer's state.
#[derive(Debug, PartialEq)]
struct Run {
    losses: Vec<u64>,
    params: Vec<Vec<u32>>,
    kept_buffer: Vec<Vec<bool>>,
    state: Vec<(String, Vec<u64>)>,
}

/// Where a parameter's values live now (the clone that reads it is dropped at once, so it
/// shares nothing during the step).
fn storage<S: Train<T = f32>>(s: &mut S, p: &Param) -> usize {
    s.param_value(p).unwrap().data().as_ptr() as usize
}

/// The MLP's loss plus an L2 term on a second leaf of its first weight (two gradients sum in
/// that parameter's update). Every leaf before the first op, as the linked session needs.
fn loss<S: Ops<T = f32>>(s: &mut S, mlp: &Mlp) -> TensorRef {
    let (x, y) = regression_grid::<f32>(5);
    let layers: Vec<_> = (mlp.layers.iter())
        .map(|(w, b)| (s.use_param(w).unwrap(), s.use_param(b).unwrap()))
        .collect();
    let w_again = s.use_param(&mlp.layers[0].0).unwrap();
    let (mut h, y) = (s.input(x, false).unwrap(), s.input(y, false).unwrap());
    for (k, (w, b)) in layers.iter().enumerate() {
        h = s.linear(w, b, &h).unwrap();
        if k + 1 < layers.len() {
            h = s.tanh(&h).unwrap();
        }
    }
    let fit = s.mse_loss(&h, &y).unwrap();
    let l2 = s.mul(&w_again, &w_again).and_then(|w2| s.sum(&w2)).unwrap();
    let l2 = s.scale(&l2, 1e-3).unwrap();
    s.add(&fit, &l2).unwrap()
}

fn run<S: Train<T = f32>>(mut s: S, mut opt: Optimizer, ends_pass: bool) -> Run {
    let mlp = Mlp::new(&mut s, &[2, 8, 1], 11).unwrap();
    let params = mlp.params();
    let (mut losses, mut bits, mut kept) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..4 {
        let before: Vec<usize> = params.iter().map(|p| storage(&mut s, p)).collect();
        let l = loss(&mut s, &mlp);
        let l = if ends_pass {
            s.backward_step_reduced_then_reset(&l, &mut opt, None)
        } else {
            let r = s.backward_step(&l, &mut opt);
            Train::reset(&mut s);
            r
        };
        losses.push(l.unwrap().to_bits());
        kept.push(
            params
                .iter()
                .zip(before)
                .map(|(p, b)| storage(&mut s, p) == b)
                .collect(),
        );
        bits.extend(params.iter().map(|p| {
            let v = s.param_value(p).unwrap();
            v.data().iter().map(|x| x.to_bits()).collect()
        }));
    }
    // A sorted map: the same order in both runs.
    let state = (s.optimizer_state(&opt).unwrap().iter())
        .map(|(k, t)| (k.clone(), t.data().iter().map(|v| v.to_bits()).collect()))
        .collect();
    Run {
        losses,
        params: bits,
        kept_buffer: kept,
        state,
    }
}

#[test]
fn a_step_that_ends_its_pass_updates_in_place_with_the_same_bits() {
    type Make = fn() -> Optimizer;
    let optimizers: [(&str, Make); 5] = [
        ("sgd", || Optimizer::sgd(0.1).unwrap()),
        ("momentum", || Optimizer::momentum(0.05, 0.9).unwrap()),
        ("adamw", || {
            Optimizer::adamw(0.02).unwrap().weight_decay(0.01).unwrap()
        }),
        ("sgd, norm clipped", || {
            Optimizer::sgd(0.1)
                .unwrap()
                .clip_grad_norm(0.05, 2.0)
                .unwrap()
        }),
        // Transactional: the update runs on a copy, so nothing is written in place.
        ("sgd, finite check", || {
            Optimizer::sgd(0.1).unwrap().check_finite(true)
        }),
    ];
    for (name, make) in optimizers {
        let eager = || Session::<f32>::new(Options::default()).unwrap();
        for (session, plain, ending) in [
            (
                "eager",
                run(eager(), make(), false),
                run(eager(), make(), true),
            ),
            (
                "linked",
                run(LinkedSession::<f32>::new(), make(), false),
                run(LinkedSession::<f32>::new(), make(), true),
            ),
        ] {
            let what = format!("{session}, {name}");
            assert_eq!(ending.losses, plain.losses, "{what}");
            assert_eq!(ending.params, plain.params, "{what}");
            assert_eq!(ending.state, plain.state, "{what}");
            assert!(
                plain.losses[3] != plain.losses[0],
                "{what}: nothing learned"
            );
            // The plain step never writes in place: the pass holds the old values.
            assert!(
                plain.kept_buffer.iter().flatten().all(|k| !k),
                "{what}: {:?}",
                plain.kept_buffer
            );
            let in_place = !name.contains("finite");
            assert!(
                ending.kept_buffer.iter().flatten().all(|&k| k == in_place),
                "{what}: {:?}",
                ending.kept_buffer
            );
        }
    }
}
