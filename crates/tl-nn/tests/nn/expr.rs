//! Expressions as users write them (methods, operators, nesting, broadcasting) and labels
//! that refuse bad values.

use tl_nn::{Labels, Module, Var};
use tl_session::{Backend, Optimizer, Session, Train};
use tl_spec::Tensor;

use crate::{eager, linked, max_diff, mlp, tensor};

fn exprs<O: Train<T = f64>>(rt: tl_nn::Runtime<O>) -> Tensor<f64> {
    let (a, b, bias) = (
        tensor::<f64>(&[3, 4], 1),
        tensor::<f64>(&[4, 2], 2),
        tensor::<f64>(&[2], 3),
    );
    let empty = tl_nn::Sequential::<O>::new();
    rt.eval(&empty, |g| {
        let (a, b, bias) = (
            g.input(a.clone())?,
            g.input(b.clone())?,
            g.input(bias.clone())?,
        );
        // Nested method calls and broadcasting operators.
        let h = (a.matmul(&b)?.relu()? + &bias)?;
        let k = ((&h * &h)? - (&h / &g.full(&[1], 2.0)?)?)?;
        (-&k)?.tanh()?.sum_axis(1)
    })
    .unwrap()
}

#[test]
fn methods_and_operators_nest_and_broadcast() {
    let got = exprs(eager::<f64>(Backend::Cpu, 0));
    let (a, b, bias) = (
        tensor::<f64>(&[3, 4], 1),
        tensor::<f64>(&[4, 2], 2),
        tensor::<f64>(&[2], 3),
    );
    let want = Tensor::from_fn([3], |i| {
        (0..2)
            .map(|j| {
                let ab: f64 = (0..4)
                    .map(|k| a.data()[i * 4 + k] * b.data()[k * 2 + j])
                    .sum();
                let h = ab.max(0.0) + bias.data()[j];
                (-(h * h - h / 2.0)).tanh()
            })
            .sum::<f64>()
    });
    assert!(max_diff(&got, &want) < 1e-12);
    assert!(max_diff(&exprs(linked::<f64>(0)), &want) < 1e-12);
}

#[test]
fn shapes_that_do_not_broadcast_are_errors_naming_the_operator() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let empty = tl_nn::Sequential::<Session<f64>>::new();
    let err = rt
        .eval(&empty, |g| {
            let x: Var<'_, _> = g.input(Tensor::zeros([3, 4]))?;
            &x + &g.input(Tensor::zeros([3]))?
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Var + Var") && err.contains("broadcast"),
        "{err}"
    );
    let err = rt
        .eval(&empty, |g| {
            g.input(Tensor::zeros([3, 4]))?
                .matmul(&g.input(Tensor::zeros([3, 4]))?)
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("matmul") && err.contains("[3, 4]"), "{err}");
}

#[test]
fn operands_of_two_runtimes_do_not_mix() {
    let rt1 = eager::<f64>(Backend::Cpu, 0);
    let rt2 = eager::<f64>(Backend::Cpu, 0);
    let e1 = tl_nn::Sequential::<Session<f64>>::new();
    let e2 = tl_nn::Sequential::<Session<f64>>::new();
    let mut mixed = None;
    rt1.eval(&e1, |g1| {
        let x = g1.input(Tensor::ones([2]))?;
        rt2.eval(&e2, |g2| {
            let z = g2.input(Tensor::ones([2]))?;
            mixed = Some((&x + &z).map(|_| ()).map_err(|e| e.to_string()));
            Ok(z)
        })?;
        Ok(x)
    })
    .unwrap();
    let err = mixed.unwrap().unwrap_err();
    assert!(err.contains("different runtimes"), "{err}");
}

#[test]
fn labels_know_their_classes_and_bad_ones_are_errors() {
    let e = Labels::new(vec![0, 3, 15], 16).unwrap();
    assert_eq!((e.len(), e.classes()), (3, 16));
    let err = Labels::new(vec![0, 99], 16).unwrap_err().to_string();
    assert!(
        err.contains("label 99 at position 1") && err.contains("16 classes"),
        "{err}"
    );
    assert!(Labels::new(vec![], 0).is_err());

    let mut rt = eager::<f64>(Backend::Cpu, 0);
    let model = mlp(&rt, 3, 4, 5);
    let x = tensor::<f64>(&[8, 3], 1);
    let mut opt = Optimizer::sgd(0.1).unwrap();
    let mut loss = |labels: &Labels| {
        rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x.clone())?)?.cross_entropy(labels)
        })
        .map_err(|e| e.to_string())
    };
    // Two labels for eight rows.
    let err = loss(&Labels::new(vec![0, 1], 5).unwrap()).unwrap_err();
    assert!(
        err.contains("8 row(s)") && err.contains("2 value(s)"),
        "{err}"
    );
    // Labels made for another number of classes.
    let err = loss(&Labels::new(vec![0; 8], 16).unwrap()).unwrap_err();
    assert!(err.contains("16 classes"), "{err}");
    // The right labels train.
    assert!(loss(&Labels::new(vec![1; 8], 5).unwrap()).unwrap() > 0.0);
}

#[test]
fn flatten_batch_refuses_trailing_dims_whose_product_overflows() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let empty = tl_nn::Sequential::<Session<f64>>::new();
    // No element at all, but 2³² · 2³² trailing elements per row: wrapped to [0, 0] before.
    let huge = Tensor::<f64>::new([0, 1 << 32, 1 << 32], Vec::new()).unwrap();
    let e = rt
        .eval(&empty, |g| g.input(huge.clone())?.flatten_batch())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("flatten_batch") && e.contains("4294967296"),
        "{e}"
    );
    // At the boundary: [0, 2³², 2³¹ − 1] fits and flattens to [0, (2³² )(2³¹ − 1)].
    let fits = Tensor::<f64>::new([0, 1 << 32, (1 << 31) - 1], Vec::new()).unwrap();
    let y = rt
        .eval(&empty, |g| g.input(fits.clone())?.flatten_batch())
        .unwrap();
    assert_eq!(y.shape().dims(), &[0, (1usize << 32) * ((1 << 31) - 1)]);
}
