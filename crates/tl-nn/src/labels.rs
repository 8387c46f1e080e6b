//! [`Labels`]: class targets that know their number of classes, checked when made, so a label
//! out of range or a wrong count is an error instead of a silent zero loss.

use crate::Result;
use crate::error::usage;

/// Class labels in `0..classes`, one per row of the logits they are compared with.
/// PyTorch comparison: the `target` LongTensor of `F.cross_entropy`, with the range checked up
/// front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    values: Vec<usize>,
    classes: usize,
}

impl Labels {
    /// Labels `values`, each below `classes`; an empty set of classes or a label out of range
    /// is an error naming the label and its position.
    pub fn new(values: Vec<usize>, classes: usize) -> Result<Self> {
        if classes == 0 {
            return Err(usage(
                "Labels::new",
                "the number of classes must be at least 1",
            ));
        }
        if let Some((i, &v)) = values.iter().enumerate().find(|(_, v)| **v >= classes) {
            return Err(usage(
                "Labels::new",
                format!(
                    "label {v} at position {i} is out of range for {classes} classes (0..{classes})"
                ),
            ));
        }
        Ok(Labels { values, classes })
    }

    /// The labels.
    pub fn values(&self) -> &[usize] {
        &self.values
    }

    /// The number of classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The number of labels.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The labels at positions `idx` (a minibatch).
    pub fn select(&self, idx: &[usize]) -> Result<Labels> {
        let values = idx
            .iter()
            .map(|&i| {
                self.values.get(i).copied().ok_or_else(|| {
                    usage(
                        "Labels::select",
                        format!("position {i} is out of range for {} labels", self.len()),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Labels {
            values,
            classes: self.classes,
        })
    }
}
