//! Each model's dataset behind one interface: examples indexed `0..len`, minibatches by index.
//! Digits images (mlp, cnn), Burgers' pairs (fno), text windows (transformer).

use tl_nn::data::{Split, TokenBatch, digits};
use tl_spec::Tensor;

use crate::burgers::{self, GRID};
use crate::cli::ModelName;
use crate::text::{Windows, corpus, unigram_loss};
use crate::{CliError, Result};

/// Burgers' pairs in the training split.
pub const BURGERS_TRAIN: usize = 1000;
/// Burgers' pairs in the test split.
pub const BURGERS_TEST: usize = 200;
/// Seeds of the two Burgers' splits (fixed, independent of `--seed`).
const BURGERS_SEEDS: (u64, u64) = (0xB0E6_0001, 0xB0E6_0002);
/// Characters per transformer example.
pub const CONTEXT: usize = 32;

/// Fields on a Burgers' grid: inputs u0 and targets u(T), one row of `grid` values each.
#[derive(Debug, Clone, PartialEq)]
pub struct Fields {
    /// Points per row.
    pub grid: usize,
    /// Initial conditions.
    pub x: Vec<f32>,
    /// Solutions at T.
    pub y: Vec<f32>,
}

/// One split of a model's dataset.
#[derive(Debug, Clone, PartialEq)]
pub enum Dataset {
    /// Labelled images (digits).
    Classes(Split),
    /// Field pairs (Burgers).
    Fields(Fields),
    /// Text windows.
    Text(Windows),
}

/// A minibatch, ready to record.
#[derive(Debug, Clone, PartialEq)]
pub enum Batch {
    /// Features (B, …) and class labels.
    Classes {
        /// Inputs.
        x: Tensor<f32>,
        /// Labels.
        labels: Vec<usize>,
    },
    /// Input fields (B, grid, 2: u0 and the coordinate j/grid, i.e. x/L) and targets
    /// (B, grid, 1).
    Fields {
        /// Inputs.
        x: Tensor<f32>,
        /// Targets.
        y: Tensor<f32>,
    },
    /// Token windows: `batch·context` inputs and as many next-token targets.
    Tokens(TokenBatch),
}

impl Dataset {
    /// Number of examples.
    pub fn len(&self) -> usize {
        match self {
            Dataset::Classes(s) => s.len(),
            Dataset::Fields(f) => f.y.len() / f.grid.max(1),
            Dataset::Text(w) => w.len,
        }
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `n` examples (all if `n` is larger).
    pub fn truncate(self, n: usize) -> Self {
        let n = n.min(self.len());
        match self {
            Dataset::Classes(s) => Dataset::Classes(s.truncate(n)),
            Dataset::Fields(mut f) => {
                f.x.truncate(n * f.grid);
                f.y.truncate(n * f.grid);
                Dataset::Fields(f)
            }
            Dataset::Text(mut w) => {
                w.len = n;
                Dataset::Text(w)
            }
        }
    }

    /// [`Dataset::truncate`] to `n` examples where `n` is given (`--train-subset`,
    /// `--test-subset`), else the whole set.
    pub fn first(self, n: Option<usize>) -> Self {
        match n {
            Some(n) => self.truncate(n),
            None => self,
        }
    }

    /// The examples at `idx`; an index past the set is an error naming it.
    pub fn batch(&self, idx: &[usize]) -> Result<Batch> {
        if let Some(&i) = idx.iter().find(|&&i| i >= self.len()) {
            return Err(CliError::new(format!(
                "example {i} is out of range for a data set of {} example(s)",
                self.len()
            )));
        }
        Ok(match self {
            Dataset::Classes(s) => {
                let (x, labels) = s.batch(idx)?;
                Batch::Classes { x, labels }
            }
            Dataset::Fields(f) => {
                let (b, g) = (idx.len(), f.grid);
                let x = Tensor::try_from_fn("batch", [b, g, 2], |k| {
                    let (e, rest) = (idx[k / (2 * g)], k % (2 * g));
                    let (j, ch) = (rest / 2, rest % 2);
                    if ch == 0 {
                        f.x[e * g + j]
                    } else {
                        j as f32 / g as f32
                    }
                })?;
                let y = Tensor::try_from_fn("batch", [b, g, 1], |k| f.y[idx[k / g] * g + k % g])?;
                Batch::Fields { x, y }
            }
            Dataset::Text(w) => Batch::Tokens(w.batch(idx)?),
        })
    }
}

/// A model's train and test splits, the test split cut to its first `test_subset` examples
/// when one is given, and the test loss of the baseline a language model must beat (the
/// unigram model, on the test windows kept; `None` for the other tasks).
pub fn load(
    model: ModelName,
    test_subset: Option<usize>,
) -> Result<(Dataset, Dataset, Option<f32>)> {
    Ok(match model {
        ModelName::Mlp | ModelName::Cnn => {
            let (train, test) = digits()?;
            (
                Dataset::Classes(train),
                Dataset::Classes(test).first(test_subset),
                None,
            )
        }
        ModelName::Fno => {
            let make = |n, seed| {
                let (x, y) = burgers::pairs(n, seed);
                let f = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect();
                Dataset::Fields(Fields {
                    grid: GRID,
                    x: f(x),
                    y: f(y),
                })
            };
            (
                make(BURGERS_TRAIN, BURGERS_SEEDS.0),
                make(BURGERS_TEST, BURGERS_SEEDS.1).first(test_subset),
                None,
            )
        }
        ModelName::Transformer => {
            let c = corpus()?;
            let test =
                Dataset::Text(Windows::new(c.test, CONTEXT, c.vocab.len())?).first(test_subset);
            let base = match &test {
                Dataset::Text(w) => Some(unigram_loss(&c.train, w)? as f32),
                _ => None,
            };
            let train = Windows::new(c.train.clone(), CONTEXT, c.vocab.len())?;
            (Dataset::Text(train), test, base)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_batches_carry_u0_the_coordinate_and_the_target() {
        let f = Fields {
            grid: GRID,
            x: (0..2 * GRID).map(|v| v as f32).collect(),
            y: (0..2 * GRID).map(|v| -(v as f32)).collect(),
        };
        let d = Dataset::Fields(f);
        assert_eq!(d.len(), 2);
        // An index past the set was an out-of-bounds panic.
        let e = d
            .batch(&[0, 2])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("example 2 is out of range"), "{e}");
        let Batch::Fields { x, y } = d.batch(&[1]).unwrap() else {
            panic!("fields")
        };
        assert_eq!(x.shape().dims(), [1, GRID, 2]);
        assert_eq!(
            &x.data()[..4],
            &[GRID as f32, 0.0, GRID as f32 + 1.0, 1.0 / GRID as f32]
        );
        assert_eq!(y.data()[3], -(GRID as f32 + 3.0));
        assert_eq!(d.truncate(1).len(), 1);
    }

    #[test]
    fn a_test_subset_keeps_the_first_examples_and_the_baseline_follows_them() {
        for model in [ModelName::Mlp, ModelName::Fno, ModelName::Transformer] {
            let (_, full, full_base) = load(model, None).unwrap();
            let (_, five, base) = load(model, Some(5)).unwrap();
            assert_eq!(five.len(), 5, "{model:?}");
            // The first five examples, unchanged.
            let idx = [0, 1, 2, 3, 4];
            let (a, b) = (five.batch(&idx).unwrap(), full.batch(&idx).unwrap());
            assert_eq!(a, b, "{model:?}");
            // A subset larger than the split keeps it whole.
            let (_, all, _) = load(model, Some(usize::MAX)).unwrap();
            assert_eq!(all.len(), full.len(), "{model:?}");
            // The baseline is the unigram model's loss on the windows kept.
            if let Dataset::Text(w) = &five {
                let c = corpus().unwrap();
                let want = unigram_loss(&c.train, w).unwrap() as f32;
                assert_eq!(base, Some(want));
                assert_ne!(base, full_base, "the full split's baseline");
            } else {
                assert_eq!((base, full_base), (None, None), "{model:?}");
            }
        }
    }
}
