//! The transformer's data: tl-nn's King James text (`tl_nn::data::kjv_text`) as characters,
//! a vocabulary of the distinct characters (sorted), and a fixed split by position (the first
//! 90% trains, the rest tests). Examples are windows of `context + 1` characters starting
//! every `context` characters: the first `context` are the input, each position's target is
//! the next one.

/// Fraction of the text (by position) in the training split.
pub const TRAIN_FRACTION: f64 = 0.9;

/// The tokenized text: vocabulary and the train and test token streams.
#[derive(Debug, Clone, PartialEq)]
pub struct Corpus {
    /// The distinct characters, sorted; a token is an index into it.
    pub vocab: Vec<char>,
    /// Tokens of the training part.
    pub train: Vec<usize>,
    /// Tokens of the test part.
    pub test: Vec<usize>,
}

/// Tokenize the shipped text.
pub fn corpus() -> Corpus {
    let chars: Vec<char> = tl_nn::data::kjv_text().chars().collect();
    let mut vocab = chars.clone();
    vocab.sort_unstable();
    vocab.dedup();
    let tokens: Vec<usize> = chars
        .iter()
        .map(|c| vocab.binary_search(c).unwrap_or(0))
        .collect();
    let cut = (tokens.len() as f64 * TRAIN_FRACTION) as usize;
    Corpus {
        vocab,
        train: tokens[..cut].to_vec(),
        test: tokens[cut..].to_vec(),
    }
}

/// A token stream cut into windows of `context` inputs (and their next-token targets).
#[derive(Debug, Clone, PartialEq)]
pub struct Windows {
    /// The tokens.
    pub tokens: Vec<usize>,
    /// Inputs per window.
    pub context: usize,
    /// Number of windows in use (at most the stream's).
    pub len: usize,
}

impl Windows {
    /// Every complete window of `tokens`.
    pub fn new(tokens: Vec<usize>, context: usize) -> Self {
        let len = tokens.len().saturating_sub(1) / context.max(1);
        Windows {
            tokens,
            context,
            len,
        }
    }

    /// Inputs (B·context, row-major) and targets (B·context) of the windows at `idx`.
    pub fn batch(&self, idx: &[usize]) -> (Vec<usize>, Vec<usize>) {
        let c = self.context;
        let mut x = Vec::with_capacity(idx.len() * c);
        let mut y = Vec::with_capacity(idx.len() * c);
        for &i in idx {
            x.extend_from_slice(&self.tokens[i * c..(i + 1) * c]);
            y.extend_from_slice(&self.tokens[i * c + 1..(i + 1) * c + 1]);
        }
        (x, y)
    }
}

/// Mean loss in nats per character of the unigram model fitted on `train` (add-one smoothing
/// over `vocab` tokens) on the targets of `test`'s windows: the baseline a language model must
/// beat (`tl_nn::data::unigram_nll`).
pub fn unigram_loss(train: &[usize], test: &Windows, vocab: usize) -> tl_nn::Result<f64> {
    let idx: Vec<usize> = (0..test.len).collect();
    let (_, targets) = test.batch(&idx);
    tl_nn::data::unigram_nll(train, &targets, vocab)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_split_and_windows() {
        let c = corpus();
        assert_eq!(
            c.vocab.len(),
            72,
            "data/README.md says 72 distinct characters"
        );
        assert!(c.vocab.windows(2).all(|w| w[0] < w[1]));
        let n = c.train.len() + c.test.len();
        assert_eq!(c.train.len(), (n as f64 * 0.9) as usize);
        let text: String = c.train[..7].iter().map(|&t| c.vocab[t]).collect();
        assert_eq!(text, "Genesis");
        let w = Windows::new(c.test.clone(), 8);
        assert_eq!(w.len, (c.test.len() - 1) / 8);
        let (x, y) = w.batch(&[0, 2]);
        assert_eq!(x.len(), 16);
        assert_eq!(&x[..8], &c.test[..8]);
        assert_eq!(&y[..8], &c.test[1..9]);
        assert_eq!(&x[8..], &c.test[16..24]);
        assert_eq!(&y[8..], &c.test[17..25]);
    }

    #[test]
    fn unigram_baseline_by_hand() {
        // Train "0 0 0 1" with vocab 2: counts 4, 2 (add-one), p = 2/3, 1/3.
        let test = Windows::new(vec![0, 1, 0], 1);
        let l = unigram_loss(&[0, 0, 0, 1], &test, 2).unwrap();
        let want = (-(1.0f64 / 3.0).ln() - (2.0f64 / 3.0).ln()) / 2.0;
        assert!((l - want).abs() < 1e-12, "{l} vs {want}");
    }
}
