//! The transformer's data: tl-nn's King James text (`tl_nn::data::kjv_text`) as characters
//! (`tl_nn::data::Vocab`: the distinct characters, sorted), and a fixed split by position (the
//! first 90% trains, the rest tests). Examples are `tl_nn::data::TokenWindows`' consecutive
//! windows: example `i` is the `context + 1` characters from `i·context`, the first `context`
//! the input, each position's target the next one.

use tl_nn::data::{Dataset, TokenBatch, TokenWindows, Vocab, kjv_text, unigram_nll};

/// Fraction of the text (by position) in the training split.
pub const TRAIN_FRACTION: f64 = 0.9;

/// The tokenized text: vocabulary and the train and test token streams.
#[derive(Debug, Clone, PartialEq)]
pub struct Corpus {
    /// The distinct characters; a token is an index into them.
    pub vocab: Vocab,
    /// Tokens of the training part.
    pub train: Vec<usize>,
    /// Tokens of the test part.
    pub test: Vec<usize>,
}

/// Tokenize the shipped text.
pub fn corpus() -> tl_nn::Result<Corpus> {
    let text = kjv_text();
    let vocab = Vocab::from_text(text)?;
    let tokens = vocab.encode(text)?;
    let cut = (tokens.len() as f64 * TRAIN_FRACTION) as usize;
    Ok(Corpus {
        vocab,
        train: tokens[..cut].to_vec(),
        test: tokens[cut..].to_vec(),
    })
}

/// The first `len` consecutive windows of a token stream (`--train-subset` keeps fewer).
#[derive(Debug, Clone, PartialEq)]
pub struct Windows {
    /// The windows.
    pub windows: TokenWindows,
    /// Number of windows in use (at most the stream's).
    pub len: usize,
}

impl Windows {
    /// Every complete window of `context` inputs over `tokens` (each below `vocab`).
    pub fn new(tokens: Vec<usize>, context: usize, vocab: usize) -> tl_nn::Result<Self> {
        let windows = TokenWindows::new(tokens, context, vocab)?;
        let len = Dataset::len(&windows);
        Ok(Windows { windows, len })
    }

    /// The windows at `idx` (each below `len`: the caller checks) as one batch.
    pub fn batch(&self, idx: &[usize]) -> tl_nn::Result<TokenBatch> {
        let context = self.windows.context();
        let starts: Vec<usize> = idx.iter().map(|&i| i * context).collect();
        self.windows.batch_at(&starts)
    }
}

/// Mean loss in nats per character of the unigram model fitted on `train` (add-one smoothing
/// over the vocabulary) on the targets of `test`'s windows: the baseline a language model must
/// beat (`tl_nn::data::unigram_nll`).
pub fn unigram_loss(train: &[usize], test: &Windows) -> tl_nn::Result<f64> {
    let idx: Vec<usize> = (0..test.len).collect();
    let targets = test.batch(&idx)?.targets;
    unigram_nll(train, targets.values(), test.windows.vocab())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_split_and_windows() {
        let c = corpus().unwrap();
        assert_eq!(
            c.vocab.len(),
            72,
            "data/README.md says 72 distinct characters"
        );
        assert!(c.vocab.chars().windows(2).all(|w| w[0] < w[1]));
        let n = c.train.len() + c.test.len();
        assert_eq!(c.train.len(), (n as f64 * 0.9) as usize);
        assert_eq!(c.vocab.decode(&c.train[..7]).unwrap(), "Genesis");
        let w = Windows::new(c.test.clone(), 8, c.vocab.len()).unwrap();
        assert_eq!(w.len, (c.test.len() - 1) / 8);
        let b = w.batch(&[0, 2]).unwrap();
        let (x, y) = (&b.inputs, b.targets.values());
        assert_eq!((x.len(), b.batch, b.context), (16, 2, 8));
        assert_eq!(&x[..8], &c.test[..8]);
        assert_eq!(&y[..8], &c.test[1..9]);
        assert_eq!(&x[8..], &c.test[16..24]);
        assert_eq!(&y[8..], &c.test[17..25]);
    }

    #[test]
    fn unigram_baseline_by_hand() {
        // Train "0 0 0 1" with vocab 2: counts 4, 2 (add-one), p = 2/3, 1/3.
        let test = Windows::new(vec![0, 1, 0], 1, 2).unwrap();
        let l = unigram_loss(&[0, 0, 0, 1], &test).unwrap();
        let want = (-(1.0f64 / 3.0).ln() - (2.0f64 / 3.0).ln()) / 2.0;
        assert!((l - want).abs() < 1e-12, "{l} vs {want}");
    }
}
