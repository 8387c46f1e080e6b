//! [`Dataset`] (indexed examples) and [`DataLoader`] (minibatches of them: a seeded shuffle per
//! epoch, a batch size, drop-last, and a [`Collate`] that turns the examples of a batch into
//! what a step takes). PyTorch: `torch.utils.data.Dataset`, `DataLoader(dataset, batch_size,
//! shuffle, drop_last, collate_fn, generator)`.

use tl_spec::{Scalar, Tensor};

use crate::error::usage;
use crate::{Labels, Result, Rng};

/// Examples you can count and fetch by index. PyTorch: a map-style `Dataset` (`__len__`,
/// `__getitem__`).
pub trait Dataset {
    /// One example.
    type Item;

    /// Number of examples.
    fn len(&self) -> usize;

    /// Whether there are no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Example `i`; `i ≥ len()` is an error naming `i` and the length ([`check_index`]).
    fn get(&self, i: usize) -> Result<Self::Item>;

    /// `Ok(())` if this dataset can be used, else an error saying why not: a tensor without a
    /// leading (sample) axis (0-d) is refused here, not taken as a dataset of no examples.
    /// [`DataLoader::new`] calls it. The default accepts every dataset.
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

/// `Ok(())` if `i < len`, else the error a [`Dataset::get`] returns, naming `what`, `i` and
/// `len`.
pub fn check_index(what: &'static str, i: usize, len: usize) -> Result<()> {
    if i < len {
        return Ok(());
    }
    Err(usage(
        what,
        format!("index {i} is out of range for a dataset of {len} example(s)"),
    ))
}

/// The rows of a tensor's leading axis: row `i` is `x[i]`, of the shape without the leading
/// axis. PyTorch: `TensorDataset(x)`. A 0-d tensor has no leading (sample) axis, so it is no
/// dataset: [`Dataset::check`], [`Dataset::get`] and [`DataLoader::new`] refuse it with an
/// error saying so (its `len` is 0).
impl<T: Scalar> Dataset for Tensor<T> {
    type Item = Tensor<T>;

    fn len(&self) -> usize {
        self.shape().dims().first().copied().unwrap_or(0)
    }

    fn get(&self, i: usize) -> Result<Tensor<T>> {
        no_sample_axis("Dataset::get (Tensor)", self)?;
        check_index("Dataset::get (Tensor)", i, Dataset::len(self))?;
        let row = super::rows(self, i, 1)?;
        Ok(Tensor::new(&self.shape().dims()[1..], row.into_vec())?)
    }

    fn check(&self) -> Result<()> {
        no_sample_axis("Dataset::check (Tensor)", self)
    }
}

/// The error for a tensor used as a [`Dataset`] without a leading (sample) axis, for `what`.
fn no_sample_axis<T: Scalar>(what: &'static str, x: &Tensor<T>) -> Result<()> {
    if x.shape().rank() > 0 {
        return Ok(());
    }
    Err(usage(
        what,
        format!(
            "a 0-d tensor (shape {}) is no dataset: a dataset needs a leading (sample) axis, one example per index along it; give one example as a dataset of one (x.reshape([1]))",
            x.shape()
        ),
    ))
}

/// The elements of a slice, cloned (`&v[..]` for a `Vec`). The slice's own `len` and `get`
/// come first in method calls; call these as `Dataset::get(s, i)`.
impl<I: Clone> Dataset for [I] {
    type Item = I;

    fn len(&self) -> usize {
        <[I]>::len(self)
    }

    fn get(&self, i: usize) -> Result<I> {
        check_index("Dataset::get (slice)", i, <[I]>::len(self))?;
        Ok(self[i].clone())
    }
}

/// Turns the examples of one minibatch into a batch. PyTorch: `collate_fn`. Implemented by
/// [`Stack`] (tensors), [`Classify`] (tensors and class labels) and any
/// `Fn(Vec<Item>) -> Result<Batch>`.
pub trait Collate<I> {
    /// The batch.
    type Batch;

    /// The batch of `items` (in the loader's order; never empty).
    fn collate(&self, items: Vec<I>) -> Result<Self::Batch>;
}

impl<I, B, F: Fn(Vec<I>) -> Result<B>> Collate<I> for F {
    type Batch = B;

    fn collate(&self, items: Vec<I>) -> Result<B> {
        self(items)
    }
}

/// Tensors of one shape stacked along a new leading (batch) axis: `B` tensors of shape `s`
/// give one of shape `(B, s…)`. PyTorch: `torch.stack(items)` (the default collate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stack;

impl<T: Scalar> Collate<Tensor<T>> for Stack {
    type Batch = Tensor<T>;

    fn collate(&self, items: Vec<Tensor<T>>) -> Result<Tensor<T>> {
        stack(&items)
    }
}

/// Examples `(features, label)`: the features stacked as [`Stack`] does, the labels as
/// [`Labels`] with `classes` classes (a label out of range is an error naming it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classify {
    /// The number of classes of the labels.
    pub classes: usize,
}

impl<T: Scalar> Collate<(Tensor<T>, usize)> for Classify {
    type Batch = (Tensor<T>, Labels);

    fn collate(&self, items: Vec<(Tensor<T>, usize)>) -> Result<(Tensor<T>, Labels)> {
        let (x, y): (Vec<Tensor<T>>, Vec<usize>) = items.into_iter().unzip();
        Ok((stack(&x)?, Labels::new(y, self.classes)?))
    }
}

/// `items` (one shape) stacked along a new leading axis; shapes that differ are an error
/// naming the first that does, and the size is checked before anything is allocated.
pub fn stack<T: Scalar>(items: &[Tensor<T>]) -> Result<Tensor<T>> {
    const WHAT: &str = "data::stack";
    let Some(first) = items.first() else {
        return Err(usage(WHAT, "no tensors to stack"));
    };
    if let Some((i, t)) = items
        .iter()
        .enumerate()
        .find(|(_, t)| t.shape() != first.shape())
    {
        return Err(usage(
            WHAT,
            format!(
                "item {i} has shape {}, item 0 has shape {}: a batch needs one shape",
                t.shape(),
                first.shape()
            ),
        ));
    }
    let row = first.data().len();
    let total = row.checked_mul(items.len()).ok_or_else(|| {
        usage(
            WHAT,
            format!("{} items of {row} elements overflow", items.len()),
        )
    })?;
    let mut data = tl_spec::alloc::try_with_capacity(WHAT, "batch", total)?;
    for t in items {
        data.extend_from_slice(t.data());
    }
    let dims: Vec<usize> = std::iter::once(items.len())
        .chain(first.shape().dims().iter().copied())
        .collect();
    Ok(Tensor::new(dims, data)?)
}

/// Minibatches of a [`Dataset`], collated by a [`Collate`]. [`DataLoader::epoch`] gives one
/// pass over the data: every index once, in order, or (with [`DataLoader::shuffle`]) in a
/// seeded random order that differs per epoch and is the same for the same seed and epoch.
/// PyTorch: `DataLoader(dataset, batch_size, shuffle, drop_last, collate_fn, generator)`
/// (`shuffle` here takes the seed of the generator).
///
/// ```
/// use tl_nn::data::{Classify, DataLoader, digits};
///
/// # fn main() -> tl_nn::Result<()> {
/// let (train, _) = digits()?;
/// let loader = DataLoader::new(&train, 64, Classify { classes: 10 })?
///     .shuffle(7)
///     .drop_last(true);
/// assert_eq!(loader.len(), 1437 / 64);
/// for batch in loader.epoch(0) {
///     let (x, labels) = batch?;
///     assert_eq!((x.shape().dims(), labels.len()), (&[64, 64][..], 64));
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DataLoader<'d, D: ?Sized, C> {
    dataset: &'d D,
    collate: C,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    /// `(rank, ranks)`: this rank's part of each global batch ([`DataLoader::shard`]).
    shard: Option<(usize, usize)>,
}

impl<'d, D: Dataset + ?Sized, C: Collate<D::Item>> DataLoader<'d, D, C> {
    /// Batches of `batch_size` examples of `dataset` (in order, the last one shorter unless
    /// [`DataLoader::drop_last`]), collated by `collate`. A batch size of 0 is an error, and so
    /// is a dataset its [`Dataset::check`] refuses (a 0-d tensor: no sample axis).
    pub fn new(dataset: &'d D, batch_size: usize, collate: C) -> Result<Self> {
        if batch_size == 0 {
            return Err(usage(
                "DataLoader::new",
                "the batch size must be at least 1, got 0",
            ));
        }
        dataset.check()?;
        Ok(DataLoader {
            dataset,
            collate,
            batch_size,
            seed: None,
            drop_last: false,
            shard: None,
        })
    }

    /// Make this loader rank `rank` of `ranks` in data-parallel training: the batch size is
    /// the *global* batch, and each batch this loader gives is this rank's part of it, the
    /// `batch_size / ranks` examples at `rank · batch_size / ranks` of the global batch's
    /// order (the same order on every rank with the same [`DataLoader::shuffle`] seed). The
    /// ranks' parts are disjoint and together are the global batch, so `ranks` processes with
    /// the mean of their gradients take the step one process takes on the global batch.
    /// Remainder rule: a last global batch shorter than the batch size is left out (drop-last
    /// is on), so every rank has the same number of equal batches. PyTorch:
    /// `DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last=True)`, with
    /// the per-rank batch `batch_size / ranks`.
    ///
    /// An error when `ranks` is 0, `rank ≥ ranks`, or the batch size is not a multiple of
    /// `ranks` (naming them).
    pub fn shard(mut self, rank: usize, ranks: usize) -> Result<Self> {
        if ranks == 0 || rank >= ranks || !self.batch_size.is_multiple_of(ranks) {
            return Err(usage(
                "DataLoader::shard",
                format!(
                    "need rank < ranks and a global batch size that the ranks divide, got rank {rank} of {ranks} ranks and batch size {}",
                    self.batch_size
                ),
            ));
        }
        self.shard = Some((rank, ranks));
        self.drop_last = true;
        Ok(self)
    }

    /// Visits the examples in a random order drawn from `seed` and the epoch (stream `epoch`
    /// of `seed`: [`Rng::stream`]). PyTorch: `shuffle=True` with a seeded `generator`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Whether to leave out the last batch when it is shorter than the batch size. PyTorch:
    /// `drop_last`.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        // A sharded loader always leaves out the short last batch ([`DataLoader::shard`]).
        self.drop_last = drop_last || self.shard.is_some();
        self
    }

    /// The batch size.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        let n = self.dataset.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// Whether an epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The order in which epoch `epoch` visits the examples (before batching and
    /// [`DataLoader::drop_last`]).
    pub fn order(&self, epoch: u64) -> Result<Vec<usize>> {
        let n = self.dataset.len();
        match self.seed {
            Some(seed) => Rng::stream(seed, epoch).permutation(n),
            None => {
                let mut p = tl_spec::alloc::try_with_capacity("DataLoader::order", "order", n)?;
                p.extend(0..n);
                Ok(p)
            }
        }
    }

    /// The batches of epoch `epoch`, each a `Result` (an example the dataset cannot give, or
    /// a collate that fails, is that batch's error).
    pub fn epoch(&self, epoch: u64) -> Batches<'_, 'd, D, C> {
        let (order, error) = match self.order(epoch) {
            Ok(o) => (o, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        Batches {
            loader: self,
            order,
            next: 0,
            batches: if error.is_some() { 0 } else { self.len() },
            error,
        }
    }
}

/// The batches of one epoch of a [`DataLoader`], in order.
#[derive(Debug)]
pub struct Batches<'l, 'd, D: ?Sized, C> {
    loader: &'l DataLoader<'d, D, C>,
    order: Vec<usize>,
    next: usize,
    batches: usize,
    error: Option<crate::Error>,
}

impl<D: Dataset + ?Sized, C: Collate<D::Item>> Iterator for Batches<'_, '_, D, C> {
    type Item = Result<C::Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.error.take() {
            return Some(Err(e));
        }
        if self.next >= self.batches {
            return None;
        }
        let size = self.loader.batch_size;
        let mut start = self.next * size;
        let mut end = (start + size).min(self.order.len());
        if let Some((rank, ranks)) = self.loader.shard {
            let part = size / ranks;
            start += rank * part;
            end = start + part;
        }
        let idx = &self.order[start..end];
        self.next += 1;
        let items: Result<Vec<D::Item>> = idx.iter().map(|&i| self.loader.dataset.get(i)).collect();
        Some(items.and_then(|items| self.loader.collate.collate(items)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.batches - self.next + usize::from(self.error.is_some());
        (left, Some(left))
    }
}

impl<D: Dataset + ?Sized, C: Collate<D::Item>> ExactSizeIterator for Batches<'_, '_, D, C> {}
