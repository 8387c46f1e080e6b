//! Datasets shipped in the repository (`data/`, see `data/README.md`), compiled into the binary
//! so `tl` needs no files at run time: the UCI handwritten digits with a fixed seeded split.

use std::io::Read;

use tl_session::models::SplitMix;
use tl_spec::Tensor;

use crate::{CliError, Result};

/// `data/digits.csv.gz`: 1,797 lines of 64 pixels (0–16) and a label.
const DIGITS_GZ: &[u8] = include_bytes!("../../../data/digits.csv.gz");

/// Number of digits images.
pub const DIGITS_LEN: usize = 1797;
/// Images in the training split (the remaining 360 are the test split).
pub const DIGITS_TRAIN: usize = 1437;
/// Pixels per image (8 × 8).
pub const PIXELS: usize = 64;
/// Classes (digits 0–9).
pub const CLASSES: usize = 10;
/// The seed of the fixed train/test split (independent of `--seed`).
const SPLIT_SEED: u64 = 0x00D1_6175;

/// A classification split: row-major features (`len × features`, scaled to [0, 1]) and labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// Features, one row per example.
    pub x: Vec<f32>,
    /// Labels.
    pub y: Vec<usize>,
    /// Features per example.
    pub features: usize,
}

impl Split {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// The first `n` examples (all if `n` is larger).
    pub fn truncate(mut self, n: usize) -> Self {
        let n = n.min(self.len());
        self.x.truncate(n * self.features);
        self.y.truncate(n);
        self
    }

    /// The examples at `idx` as a (B, features) tensor and their labels.
    pub fn batch(&self, idx: &[usize]) -> (Tensor<f32>, Vec<usize>) {
        let f = self.features;
        let mut x = Vec::with_capacity(idx.len() * f);
        for &i in idx {
            x.extend_from_slice(&self.x[i * f..(i + 1) * f]);
        }
        let y = idx.iter().map(|&i| self.y[i]).collect();
        (Tensor::from_fn([idx.len(), f], |k| x[k]), y)
    }
}

/// The digits train and test splits: a fixed seeded shuffle, 1,437 train / 360 test, pixels / 16.
pub fn digits() -> Result<(Split, Split)> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_GZ)
        .read_to_string(&mut text)
        .map_err(|e| CliError::new(format!("digits.csv.gz: cannot decompress: {e}")))?;
    let mut x = Vec::with_capacity(DIGITS_LEN * PIXELS);
    let mut y = Vec::with_capacity(DIGITS_LEN);
    for (n, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split(',').collect();
        let bad = || CliError::new(format!("digits.csv.gz line {}: malformed", n + 1));
        if fields.len() != PIXELS + 1 {
            return Err(bad());
        }
        for f in &fields[..PIXELS] {
            let v: f32 = f.trim().parse().map_err(|_| bad())?;
            x.push(v / 16.0);
        }
        let label: usize = fields[PIXELS].trim().parse().map_err(|_| bad())?;
        if label >= CLASSES {
            return Err(bad());
        }
        y.push(label);
    }
    if y.len() != DIGITS_LEN {
        return Err(CliError::new(format!(
            "digits.csv.gz: expected {DIGITS_LEN} images, found {}",
            y.len()
        )));
    }
    let order = permutation(DIGITS_LEN, SPLIT_SEED);
    let all = Split {
        x,
        y,
        features: PIXELS,
    };
    let pick = |idx: &[usize]| {
        let (t, y) = all.batch(idx);
        Split {
            x: t.data().to_vec(),
            y,
            features: PIXELS,
        }
    };
    Ok((pick(&order[..DIGITS_TRAIN]), pick(&order[DIGITS_TRAIN..])))
}

/// A seeded Fisher–Yates permutation of `0..n`.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix::new(seed);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_split_is_fixed_disjoint_and_scaled() {
        let (train, test) = digits().unwrap();
        assert_eq!((train.len(), test.len()), (1437, 360));
        assert!(
            train
                .x
                .iter()
                .chain(&test.x)
                .all(|&v| (0.0..=1.0).contains(&v))
        );
        // The first image of the file is a 0 whose first row is 0,0,5,13,9,1,0,0.
        let first = [0.0, 0.0, 5.0, 13.0, 9.0, 1.0, 0.0, 0.0].map(|v: f32| v / 16.0);
        let rows: Vec<&[f32]> = train.x.chunks(64).chain(test.x.chunks(64)).collect();
        assert!(rows.iter().any(|r| r[..8] == first));
        // Every class appears in the test split.
        for c in 0..10 {
            assert!(test.y.contains(&c), "class {c} missing from the test split");
        }
        assert_eq!(
            digits().unwrap().1,
            test,
            "the split must not depend on the run"
        );
    }

    #[test]
    fn permutation_is_a_permutation() {
        let mut p = permutation(100, 3);
        assert_ne!(p, (0..100).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }
}
