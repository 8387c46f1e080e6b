//! The UCI handwritten digits (1,797 8×8 images, this crate's `data/digits.csv.gz`; sources
//! and licence in the repository's `data/README.md`) with a fixed seeded train/test split: a
//! [`Split`] is a [`Dataset`] of `(image, label)`.

use std::io::Read;

use tl_spec::{Scalar, Tensor};

use super::{Classify, DataLoader, Dataset, check_index};
use crate::error::usage;
use crate::{Labels, Result};

/// `data/digits.csv.gz` (in this crate): 1,797 lines of 64 pixels (0–16) and a label.
const DIGITS_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");

/// Number of digits images.
pub const DIGITS_LEN: usize = 1797;
/// Images in the training split (the remaining 360 are the test split).
pub const DIGITS_TRAIN: usize = 1437;
/// Pixels per image (8 × 8).
pub const PIXELS: usize = 64;
/// Classes (digits 0–9).
pub const CLASSES: usize = 10;
/// The seed of the fixed train/test split.
const SPLIT_SEED: u64 = 0x00D1_6175;

/// A classification split: row-major features (`len × features`, scaled to [0, 1]) and labels.
///
/// Made by [`digits`]; its parts are read through [`Split::x`], [`Split::y`],
/// [`Split::feature_len`] and [`Split::dims`], so every split holds `len × feature_len`
/// features and `dims` holding `feature_len` elements, and no method can index past them.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    x: Vec<f32>,
    y: Vec<usize>,
    features: usize,
    dims: Vec<usize>,
}

impl Split {
    /// Features, one row of [`Split::feature_len`] per example.
    pub fn x(&self) -> &[f32] {
        &self.x
    }

    /// Labels, one per example.
    pub fn y(&self) -> &[usize] {
        &self.y
    }

    /// Features per example.
    pub fn feature_len(&self) -> usize {
        self.features
    }

    /// The shape of one example in the tensors this split hands out (`[feature_len]` unless
    /// set by [`Split::shaped`]).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// The same split handing out examples of shape `dims` (e.g. `[1, 8, 8]`: one channel of
    /// 8×8 pixels for a CNN); `dims` must hold `features` elements (counted without
    /// overflow: sizes whose product passes `usize` are an error too).
    pub fn shaped(mut self, dims: &[usize]) -> Result<Self> {
        if tl_spec::Shape::new(dims).checked_numel() != Some(self.features) {
            return Err(usage(
                "Split::shaped",
                format!(
                    "{dims:?} does not hold the {} features of an example",
                    self.features
                ),
            ));
        }
        self.dims = dims.to_vec();
        Ok(self)
    }

    /// `[n]` followed by the shape of one example.
    fn batch_dims(&self, n: usize) -> Vec<usize> {
        std::iter::once(n)
            .chain(self.dims.iter().copied())
            .collect()
    }

    /// The first `n` examples (all if `n` is larger).
    pub fn truncate(mut self, n: usize) -> Self {
        let n = n.min(self.len());
        self.x.truncate(n * self.features);
        self.y.truncate(n);
        self
    }

    /// The examples at `idx` as a (B, …) tensor (see [`Split::shaped`]) and their labels; an
    /// index past the split is an error naming it and the split's length.
    pub fn batch(&self, idx: &[usize]) -> Result<(Tensor<f32>, Vec<usize>)> {
        const WHAT: &str = "Split::batch";
        let f = self.features;
        let len = idx.len().checked_mul(f).ok_or_else(|| {
            usage(
                WHAT,
                format!("{} examples of {f} features overflow", idx.len()),
            )
        })?;
        let mut x: Vec<f32> = tl_spec::alloc::try_with_capacity(WHAT, "the batch", len)?;
        let mut y = Vec::with_capacity(idx.len());
        for &i in idx {
            check_index(WHAT, i, self.len())?;
            x.extend_from_slice(&self.x[i * f..(i + 1) * f]);
            y.push(self.y[i]);
        }
        Ok((Tensor::new(self.batch_dims(idx.len()), x)?, y))
    }

    /// Every example as a (len, …) tensor of `T` (see [`Split::shaped`]).
    pub fn features<T: Scalar>(&self) -> Tensor<T> {
        Tensor::from_fn(self.batch_dims(self.len()), |k| {
            T::lit(f64::from(self.x[k]))
        })
    }

    /// Every label, typed with `classes` classes.
    pub fn labels(&self, classes: usize) -> Result<Labels> {
        Labels::new(self.y.clone(), classes)
    }

    /// Minibatches of `size` in a seeded random order (a different order per `seed`): each a
    /// (B, …) tensor of `T` (see [`Split::shaped`]) and its labels with `classes` classes,
    /// the last one shorter. The same batches as epoch 0 of
    /// `DataLoader::new(self, size, Classify { classes })?.shuffle(seed)`, collected.
    pub fn batches<T: Scalar>(
        &self,
        size: usize,
        classes: usize,
        seed: u64,
    ) -> Result<Vec<(Tensor<T>, Labels)>> {
        if size == 0 {
            return Err(usage("Split::batches", "the batch size must be at least 1"));
        }
        DataLoader::new(self, size, Classify { classes })?
            .shuffle(seed)
            .epoch(0)
            .map(|b| {
                let (x, labels): (Tensor<f32>, Labels) = b?;
                Ok((x.try_cast("Split::batches")?, labels))
            })
            .collect()
    }
}

/// Example `i` is its image (shaped as [`Split::shaped`] says) and its label.
impl Dataset for Split {
    type Item = (Tensor<f32>, usize);

    fn len(&self) -> usize {
        self.y.len()
    }

    fn get(&self, i: usize) -> Result<(Tensor<f32>, usize)> {
        check_index("Split::get", i, self.len())?;
        let f = self.features;
        let x = Tensor::new(self.dims.clone(), self.x[i * f..(i + 1) * f].to_vec())?;
        Ok((x, self.y[i]))
    }
}

/// The digits train and test splits: a fixed seeded shuffle, 1,437 train / 360 test, pixels / 16.
pub fn digits() -> Result<(Split, Split)> {
    let bad = |detail: String| usage("data::digits", detail);
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_GZ)
        .read_to_string(&mut text)
        .map_err(|e| bad(format!("digits.csv.gz: cannot decompress: {e}")))?;
    let mut x = Vec::with_capacity(DIGITS_LEN * PIXELS);
    let mut y = Vec::with_capacity(DIGITS_LEN);
    for (n, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split(',').collect();
        let malformed = || bad(format!("digits.csv.gz line {}: malformed", n + 1));
        if fields.len() != PIXELS + 1 {
            return Err(malformed());
        }
        for f in &fields[..PIXELS] {
            let v: f32 = f.trim().parse().map_err(|_| malformed())?;
            x.push(v / 16.0);
        }
        let label: usize = fields[PIXELS].trim().parse().map_err(|_| malformed())?;
        if label >= CLASSES {
            return Err(malformed());
        }
        y.push(label);
    }
    if y.len() != DIGITS_LEN {
        return Err(bad(format!(
            "digits.csv.gz: expected {DIGITS_LEN} images, found {}",
            y.len()
        )));
    }
    let order = try_permutation(DIGITS_LEN, SPLIT_SEED)?;
    let all = Split {
        x,
        y,
        features: PIXELS,
        dims: vec![PIXELS],
    };
    let pick = |idx: &[usize]| -> Result<Split> {
        let (t, y) = all.batch(idx)?;
        Ok(Split {
            x: t.into_vec(),
            y,
            features: PIXELS,
            dims: vec![PIXELS],
        })
    };
    Ok((pick(&order[..DIGITS_TRAIN])?, pick(&order[DIGITS_TRAIN..])?))
}

/// A seeded Fisher–Yates permutation of `0..n` from the sequential SplitMix64 generator
/// (draw `k` is `splitmix64(seed + k·γ)`, reduced modulo the range): the order of the fixed
/// digits split and of `tl train`'s epochs. New code: [`crate::Rng::permutation`] (the
/// counter RNG, unbiased).
///
/// # Panics
///
/// Where `n` indices cannot be allocated (an `n` past the allocation cap): for an `n` that
/// comes from input call [`try_permutation`], which returns that as an error.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    match try_permutation(n, seed) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// [`permutation`], its `n` indices allocated fallibly: an `n` past the allocation cap is an
/// error naming `data::permutation` and `n` (a `TooLarge` from [`tl_spec::alloc`]), before
/// anything is allocated.
pub fn try_permutation(n: usize, seed: u64) -> Result<Vec<usize>> {
    let mut p = tl_spec::alloc::try_collect("data::permutation", "the indices", n, 0..n)?;
    let mut state = seed;
    crate::rng::fisher_yates(&mut p, |bound| {
        let draw = tl_spec::rng::splitmix64(state);
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        (draw % bound as u64) as usize
    });
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_index_past_the_split_is_an_error_naming_it() {
        let (_, test) = digits().unwrap();
        let (x, y) = test.batch(&[3, 0]).unwrap();
        assert_eq!((x.shape().dims(), y.len()), (&[2, 64][..], 2));
        assert_eq!(&x.data()[..64], &test.x[3 * 64..4 * 64]);
        let e = test.batch(&[0, 360]).unwrap_err().to_string();
        assert!(e.contains("Split::batch") && e.contains("360"), "{e}");
    }

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
        // The sequential SplitMix64 order the digits split was made with (it must not move).
        assert_eq!(permutation(10, 3), [2, 8, 7, 4, 5, 6, 0, 1, 9, 3]);
        assert_eq!(permutation(10, SPLIT_SEED), [6, 3, 2, 5, 7, 4, 0, 8, 9, 1]);
        let mut p = permutation(100, 3);
        assert_ne!(p, (0..100).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn batches_cover_the_split_once_with_typed_labels() {
        let (_, test) = digits().unwrap();
        let b = test.batches::<f32>(64, CLASSES, 1).unwrap();
        assert_eq!(b.len(), 6);
        assert_eq!(b.iter().map(|(_, l)| l.len()).sum::<usize>(), 360);
        assert!(
            b.iter()
                .all(|(x, l)| x.shape().dims() == [l.len(), 64] && l.classes() == 10)
        );
        assert!(test.batches::<f32>(0, CLASSES, 1).is_err());
        let images = test.clone().shaped(&[1, 8, 8]).unwrap();
        assert_eq!(images.features::<f32>().shape().dims(), [360, 1, 8, 8]);
        let (x, _) = &images.batches::<f32>(64, CLASSES, 1).unwrap()[0];
        assert_eq!(x.shape().dims(), [64, 1, 8, 8]);
        assert_eq!(x.data(), b[0].0.data(), "the same pixels, another shape");
        assert!(test.shaped(&[8, 9]).is_err());
    }
}
