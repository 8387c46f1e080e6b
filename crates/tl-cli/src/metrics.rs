//! Evaluation by task: loss and accuracy (classification), loss and relative L2 error
//! (regression), loss in nats per character (language modelling).

use tl_spec::Tensor;

use tl_nn::Runtime;
use tl_session::Train;

use crate::Result;
use crate::dataset::{Batch, Dataset};
use crate::model::{Model, Task, task};

/// Metrics of a model on a split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// Mean loss (cross-entropy in nats, or mean squared error).
    pub loss: f32,
    /// Fraction classified correctly (classification only).
    pub accuracy: Option<f32>,
    /// Mean over examples of ‖pred − target‖₂ / ‖target‖₂ (regression only).
    pub rel_l2: Option<f32>,
}

impl Metrics {
    /// One-line summary, e.g. `loss 0.1234 accuracy 97.50%`.
    pub fn summary(&self) -> String {
        match (self.accuracy, self.rel_l2) {
            (Some(a), _) => format!("loss {:.4} accuracy {:.2}%", self.loss, 100.0 * a),
            (_, Some(r)) => format!(
                "mse {:.3e} relative L2 {r:.3e} ({:.2}%)",
                self.loss,
                100.0 * r
            ),
            _ => format!("loss {:.4} nats/char", self.loss),
        }
    }
}

/// `Σ_examples ‖p − y‖ / ‖y‖` over the rows of `len` values each.
pub fn rel_l2_sum(pred: &Tensor<f32>, target: &Tensor<f32>, len: usize) -> f64 {
    pred.data()
        .chunks(len.max(1))
        .zip(target.data().chunks(len.max(1)))
        .map(|(p, y)| {
            let num: f64 = p.iter().zip(y).map(|(a, b)| f64::from(a - b).powi(2)).sum();
            let den: f64 = y.iter().map(|b| f64::from(*b).powi(2)).sum();
            (num / den.max(1e-30)).sqrt()
        })
        .sum()
}

/// `Σ (p − y)²` over every element.
fn sq_err_sum(pred: &Tensor<f32>, target: &Tensor<f32>) -> f64 {
    pred.data()
        .iter()
        .zip(target.data())
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum()
}

/// Metrics of the model on `split`, in evaluation passes of up to `batch` examples (at least
/// one). A pass keeps its activations until it ends, so `batch` bounds the evaluation's memory:
/// with the training batch, a pass holds what a training step holds and reuses the buffers of
/// the step's pool (the FNO paper run's evaluation in passes of 256 pairs took 1.9 GB and
/// 2.2× the time of passes of its batch of 20: docs/benchmarks.md).
pub fn evaluate<O: Train<T = f32>>(
    rt: &Runtime<O>,
    m: &Model<O>,
    split: &Dataset,
    batch: usize,
) -> Result<Metrics> {
    let (mut loss, mut correct, mut rel) = (0.0f64, 0usize, 0.0f64);
    let idx: Vec<usize> = (0..split.len()).collect();
    for chunk in idx.chunks(batch.max(1)) {
        let batch = split.batch(chunk)?;
        let mut lv = 0.0f32;
        let out = rt.eval(m, |g| {
            let o = m.forward(g, &batch)?;
            lv = o.loss.value()?.item()?;
            Ok(o.out)
        })?;
        match &batch {
            // The mean squared error, whatever loss the model trains with.
            Batch::Fields { y, .. } => {
                let per = y.data().len() / chunk.len().max(1);
                loss += sq_err_sum(&out, y) / per.max(1) as f64;
            }
            _ => loss += f64::from(lv) * chunk.len() as f64,
        }
        match &batch {
            Batch::Classes { labels, .. } => {
                let pred = out.argmax(out.shape().rank() - 1)?;
                correct += pred.iter().zip(labels).filter(|(p, y)| p == y).count();
            }
            Batch::Fields { y, .. } => {
                let per = y.data().len() / chunk.len().max(1);
                rel += rel_l2_sum(&out, y, per);
            }
            Batch::Tokens(_) => {}
        }
    }
    let n = split.len().max(1) as f64;
    let t = task(m.name());
    Ok(Metrics {
        loss: (loss / n) as f32,
        accuracy: (t == Task::Classify).then_some((correct as f64 / n) as f32),
        rel_l2: (t == Task::Regress).then_some((rel / n) as f32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ModelName;
    use crate::dataset::load;
    use tl_session::{Options, Session};

    /// Passes of any size give the metrics of one pass over the split: every example counted
    /// once, a short last pass weighted by its size (23 examples in passes of 23, 5 and 1; a
    /// batch of 0 is taken as 1, not a panic). The loss may differ in its last bits (the
    /// products' shapes change), the accuracy not at all.
    #[test]
    fn metrics_do_not_depend_on_the_evaluation_batch() {
        for model in [ModelName::Mlp, ModelName::Fno, ModelName::Transformer] {
            let rt = Runtime::new(Session::<f32>::new(Options::default()).unwrap());
            let m = Model::new(model, &rt).unwrap();
            let (_, split, _) = load(model, Some(23)).unwrap();
            let whole = evaluate(&rt, &m, &split, 23).unwrap();
            for batch in [5, 1, 0] {
                let got = evaluate(&rt, &m, &split, batch).unwrap();
                let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * a.abs().max(b.abs());
                assert!(
                    close(got.loss, whole.loss),
                    "{model:?} batch {batch}: {got:?} against {whole:?}"
                );
                assert_eq!(got.accuracy, whole.accuracy, "{model:?} batch {batch}");
                match (got.rel_l2, whole.rel_l2) {
                    (Some(a), Some(b)) => assert!(close(a, b), "{model:?} batch {batch}"),
                    (a, b) => assert_eq!(a, b, "{model:?} batch {batch}"),
                }
            }
        }
    }

    #[test]
    fn relative_l2_by_hand() {
        // Rows: pred (3, 4) vs (3, 0) → 4/3; pred (1, 1) vs (1, 1) → 0.
        let p = Tensor::new([2, 2], vec![3.0, 4.0, 1.0, 1.0]).unwrap();
        let y = Tensor::new([2, 2], vec![3.0, 0.0, 1.0, 1.0]).unwrap();
        assert!((rel_l2_sum(&p, &y, 2) - 4.0 / 3.0).abs() < 1e-12);
        let m = Metrics {
            loss: 0.5,
            accuracy: None,
            rel_l2: Some(0.0456),
        };
        assert_eq!(m.summary(), "mse 5.000e-1 relative L2 4.560e-2 (4.56%)");
    }
}
