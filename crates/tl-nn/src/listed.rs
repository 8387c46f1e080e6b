//! The listed-parameter check (the rule is documented on [`Runtime`], "Listed parameters"):
//! the open pass's unlisted parameters, and the gaps of earlier passes by model.

use std::collections::BTreeSet;

use tl_session::{Param, Train};

use crate::{Error, Parameters, Result, Runtime};

/// What the runtime knows about parameters used without being listed.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The open pass's model: its listed parameters (indices, sorted).
    listed: Vec<usize>,
    /// The parameters the open pass used that the model does not list.
    unlisted: BTreeSet<usize>,
    /// Earlier passes with gaps.
    gaps: Vec<Gap>,
}

/// A model (its listed set) and the parameters its passes used beyond it.
#[derive(Debug)]
struct Gap {
    listed: Vec<usize>,
    unlisted: BTreeSet<usize>,
}

/// The sorted, deduplicated indices of `model`'s parameters.
fn listed_set<M: Parameters + ?Sized>(model: &M) -> Vec<usize> {
    let mut v = Vec::new();
    model.visit_params(&mut |p| v.push(p.index()));
    v.sort_unstable();
    v.dedup();
    v
}

/// Whether the sorted `small` is a subset of the sorted `big`.
fn subset(small: &[usize], big: &[usize]) -> bool {
    small.iter().all(|i| big.binary_search(i).is_ok())
}

impl Listing {
    /// A pass opens for a model listing `listed`.
    pub(crate) fn begin(&mut self, listed: impl IntoIterator<Item = usize>) {
        self.listed = listed.into_iter().collect();
        self.listed.sort_unstable();
        self.listed.dedup();
        self.unlisted.clear();
    }

    /// The open pass used parameter `index`, which its model did not list.
    pub(crate) fn note(&mut self, index: usize) {
        self.unlisted.insert(index);
    }

    /// The pass ends: remember its gap, if any, with its model's earlier ones.
    pub(crate) fn end(&mut self) {
        if self.unlisted.is_empty() {
            return;
        }
        let unlisted = std::mem::take(&mut self.unlisted);
        match self.gaps.iter_mut().find(|g| g.listed == self.listed) {
            Some(g) => g.unlisted.extend(unlisted),
            None => self.gaps.push(Gap {
                listed: std::mem::take(&mut self.listed),
                unlisted,
            }),
        }
    }

    /// The parameters used but not listed by a model listing `listed` (sorted): what a pass
    /// of it, or of a model inside it, used and it still does not list.
    fn missing(&self, listed: &[usize]) -> Vec<usize> {
        let mut out = BTreeSet::new();
        for g in &self.gaps {
            let same_model = g.listed == listed;
            let contained = !g.listed.is_empty() && subset(&g.listed, listed);
            if same_model || contained {
                out.extend(
                    g.unlisted
                        .iter()
                        .filter(|i| listed.binary_search(i).is_err()),
                );
            }
        }
        out.into_iter().collect()
    }
}

impl<O: Train> Runtime<O> {
    /// [`Error::Unlisted`] for `call` when `model` does not list parameters its passes used.
    pub(crate) fn check_listed<M: Parameters + ?Sized>(
        &self,
        call: &'static str,
        model: &M,
    ) -> Result<()> {
        let missing = self.listing.borrow().missing(&listed_set(model));
        self.unlisted(call, &missing)
    }

    /// [`Error::Unlisted`] for `call` when the open pass used parameters its model does not
    /// list.
    pub(crate) fn check_pass_listed(&self, call: &'static str) -> Result<()> {
        let missing: Vec<usize> = self.listing.borrow().unlisted.iter().copied().collect();
        self.unlisted(call, &missing)
    }

    /// The error naming the parameters of indices `missing` (none: `Ok`).
    fn unlisted(&self, call: &'static str, missing: &[usize]) -> Result<()> {
        if missing.is_empty() {
            return Ok(());
        }
        let named = self.named_params();
        let names = missing
            .iter()
            .map(|&i| {
                named
                    .iter()
                    .find(|(_, p)| p.index() == i)
                    .map_or_else(|| format!("param{i}"), |(n, p)| describe(n, p))
            })
            .collect();
        Err(Error::Unlisted { call, names })
    }
}

/// `"head.weight" [10, 32]`.
fn describe(name: &str, p: &Param) -> String {
    format!("{name:?} {:?}", p.shape().dims())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_found_for_its_model_and_the_models_containing_it_only() {
        let mut l = Listing::default();
        // A pass of a model listing {0, 1} used 2 and 3.
        l.begin([1, 0]);
        l.note(3);
        l.note(2);
        l.end();
        assert_eq!(l.missing(&[0, 1]), [2, 3]);
        // A model containing it that lists 2 but not 3.
        assert_eq!(l.missing(&[0, 1, 2, 7]), [3]);
        // A model that lists everything, a part of the model, an unrelated model.
        assert!(l.missing(&[0, 1, 2, 3]).is_empty());
        assert!(l.missing(&[0]).is_empty());
        assert!(l.missing(&[5, 6]).is_empty());
        // A pass without a gap adds nothing.
        l.begin([5, 6]);
        l.end();
        assert!(l.missing(&[5, 6]).is_empty());
        // A model listing nothing whose pass used 4: found for itself, not for every model.
        l.begin([]);
        l.note(4);
        l.end();
        assert_eq!(l.missing(&[]), [4]);
        assert!(l.missing(&[5, 6]).is_empty());
    }
}
