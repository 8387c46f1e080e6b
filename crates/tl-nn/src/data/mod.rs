//! Data for training: the [`Dataset`] trait and the [`DataLoader`] that batches one (seeded
//! shuffle per epoch, batch size, drop-last, a [`Collate`]: [`Stack`], [`Classify`] or a
//! closure); the data sets shipped with the library, compiled in so examples and tests need
//! no files: the UCI handwritten digits ([`digits`], a [`Dataset`] of images and labels) and
//! the King James text ([`kjv_text`]); and for language models a character [`Vocab`],
//! [`TokenWindows`] (batches of (B, n) inputs and next-token targets) and the
//! [`unigram_nll`] baseline.

mod digits;
mod loader;
mod text;

use tl_spec::{Scalar, Tensor};

pub use digits::{
    CLASSES, DIGITS_LEN, DIGITS_TRAIN, PIXELS, Split, digits, permutation, try_permutation,
};
pub use loader::{Batches, Classify, Collate, DataLoader, Dataset, Stack, check_index, stack};
pub use text::{TokenBatch, TokenWindows, Vocab, kjv_text, unigram_nll};

use crate::Result;

/// Rows `start..start+n` of `x`'s leading axis.
pub(crate) fn rows<T: Scalar>(x: &Tensor<T>, start: usize, n: usize) -> Result<Tensor<T>> {
    let dims = x.shape().dims();
    // Callers take rows of a non-empty leading axis (`Dataset::get` checks the index), so an
    // empty x has its zero among these axes: saturating only past a zero, never to a wrong
    // length (`iter().product()` would overflow on the sizes before it).
    let row = tl_spec::Shape::saturating_product(&dims[1..]);
    let mut out = dims.to_vec();
    out[0] = n;
    Ok(Tensor::new(
        out,
        x.data()[start * row..(start + n) * row].to_vec(),
    )?)
}
