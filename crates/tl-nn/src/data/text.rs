//! Text for language models: the shipped King James text ([`kjv_text`]), a character
//! [`Vocab`] (encode, decode), [`TokenWindows`] (random or consecutive windows of
//! `context + 1` tokens batched into (B, n) inputs and next-token targets) and the
//! [`unigram_nll`] baseline a model must beat.

use super::{DataLoader, Dataset, check_index};
use crate::error::usage;
use crate::{Labels, Result, Rng};

/// The books of Genesis and Exodus of the King James Version (≈ 367 KB of UTF-8, one verse
/// per line, 72 distinct characters; this crate's `data/kjv-genesis-exodus.txt`, source and
/// licence in the repository's `data/README.md`), compiled in.
pub fn kjv_text() -> &'static str {
    include_str!("../../data/kjv-genesis-exodus.txt")
}

/// The distinct characters of a text, sorted; a token is an index into them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    chars: Vec<char>,
}

impl Vocab {
    /// The characters of `text`; an empty text is an error.
    pub fn from_text(text: &str) -> Result<Self> {
        let mut chars: Vec<char> = text.chars().collect();
        if chars.is_empty() {
            return Err(usage("Vocab::from_text", "the text is empty"));
        }
        chars.sort_unstable();
        chars.dedup();
        Ok(Vocab { chars })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// Whether there are no tokens (never, for a vocabulary made by [`Vocab::from_text`]).
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The characters, sorted: token `t` is `chars()[t]`.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// The tokens of `text`; a character outside the vocabulary is an error naming it and
    /// its position.
    pub fn encode(&self, text: &str) -> Result<Vec<usize>> {
        text.chars()
            .enumerate()
            .map(|(i, c)| {
                self.chars.binary_search(&c).map_err(|_| {
                    usage(
                        "Vocab::encode",
                        format!("character {c:?} at position {i} is not in the vocabulary"),
                    )
                })
            })
            .collect()
    }

    /// The text of `tokens`; a token out of range is an error naming it and its position.
    pub fn decode(&self, tokens: &[usize]) -> Result<String> {
        tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                self.chars.get(t).copied().ok_or_else(|| {
                    usage(
                        "Vocab::decode",
                        format!(
                            "token {t} at position {i} is out of range for a vocabulary of {}",
                            self.len()
                        ),
                    )
                })
            })
            .collect()
    }
}

/// Inputs and next-token targets of `batch` windows of `context` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// The input tokens, (batch, context) row-major: window `b` is
    /// `inputs[b·context..(b+1)·context]`.
    pub inputs: Vec<usize>,
    /// The targets, one per input (the token after it), as labels over the vocabulary.
    pub targets: Labels,
    /// Number of windows (B).
    pub batch: usize,
    /// Tokens per window (n).
    pub context: usize,
}

impl TokenBatch {
    /// `[batch, context]`: the shape of the inputs and of the targets.
    pub fn dims(&self) -> [usize; 2] {
        [self.batch, self.context]
    }
}

/// A token stream cut into windows of `context + 1` tokens: the first `context` are a model's
/// input, each position's target is the token after it. [`TokenWindows::sample`] draws windows
/// at random starts (training); as a [`Dataset`], example `i` is the start `i·context` of the
/// `i`-th consecutive window (every complete one), and [`TokenWindows::loader`] batches them
/// (evaluation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenWindows {
    tokens: Vec<usize>,
    context: usize,
    vocab: usize,
}

impl TokenWindows {
    /// Windows of `context` inputs over `tokens`, each below `vocab`. A context of 0, fewer
    /// than `context + 1` tokens, or a token out of range is an error naming the value.
    pub fn new(tokens: Vec<usize>, context: usize, vocab: usize) -> Result<Self> {
        const WHAT: &str = "TokenWindows::new";
        if context == 0 {
            return Err(usage(WHAT, "the context must be at least 1 token, got 0"));
        }
        if tokens.len() <= context {
            return Err(usage(
                WHAT,
                format!(
                    "{} token(s) hold no window of context {context} (need at least {})",
                    tokens.len(),
                    context.saturating_add(1)
                ),
            ));
        }
        if let Some((i, &t)) = tokens.iter().enumerate().find(|(_, t)| **t >= vocab) {
            return Err(usage(
                WHAT,
                format!("token {t} at position {i} is out of range for a vocabulary of {vocab}"),
            ));
        }
        Ok(TokenWindows {
            tokens,
            context,
            vocab,
        })
    }

    /// The tokens.
    pub fn tokens(&self) -> &[usize] {
        &self.tokens
    }

    /// Inputs per window (n).
    pub fn context(&self) -> usize {
        self.context
    }

    /// The vocabulary size (the targets' classes).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The windows starting at the token positions `starts` (each at most
    /// `tokens − context − 1`, else an error naming it), as one batch.
    pub fn batch_at(&self, starts: &[usize]) -> Result<TokenBatch> {
        const WHAT: &str = "TokenWindows::batch_at";
        let (n, last) = (self.context, self.tokens.len() - self.context - 1);
        if let Some((i, &s)) = starts.iter().enumerate().find(|(_, s)| **s > last) {
            return Err(usage(
                WHAT,
                format!("start {s} (window {i}) is past the last window start {last}"),
            ));
        }
        let len = starts
            .len()
            .checked_mul(n)
            .ok_or_else(|| usage(WHAT, format!("{} windows of {n} overflow", starts.len())))?;
        let mut inputs = tl_spec::alloc::try_with_capacity(WHAT, "inputs", len)?;
        let mut targets = tl_spec::alloc::try_with_capacity(WHAT, "targets", len)?;
        for &s in starts {
            inputs.extend_from_slice(&self.tokens[s..s + n]);
            targets.extend_from_slice(&self.tokens[s + 1..s + n + 1]);
        }
        Ok(TokenBatch {
            inputs,
            targets: Labels::new(targets, self.vocab)?,
            batch: starts.len(),
            context: n,
        })
    }

    /// `batch` windows at starts drawn uniformly from every possible start (with
    /// replacement) by `rng`. A batch of 0 is an error.
    pub fn sample(&self, batch: usize, rng: &mut Rng) -> Result<TokenBatch> {
        if batch == 0 {
            return Err(usage(
                "TokenWindows::sample",
                "the batch size must be at least 1, got 0",
            ));
        }
        let starts = self.tokens.len() - self.context;
        let mut at = tl_spec::alloc::try_with_capacity("TokenWindows::sample", "starts", batch)?;
        for _ in 0..batch {
            at.push(rng.below(starts)?);
        }
        self.batch_at(&at)
    }

    /// A loader of the consecutive windows ([`Dataset`] order, unshuffled unless you ask),
    /// `batch_size` per batch, collated by [`TokenWindows::batch_at`]: `.epoch(0)` is one
    /// pass over the stream, e.g. for a validation loss. A batch size of 0 is an error.
    pub fn loader(
        &self,
        batch_size: usize,
    ) -> Result<DataLoader<'_, Self, impl Fn(Vec<usize>) -> Result<TokenBatch> + '_>> {
        DataLoader::new(self, batch_size, |starts: Vec<usize>| {
            self.batch_at(&starts)
        })
    }
}

/// Example `i` is the start position `i·context` of the `i`-th consecutive window; there are
/// `(tokens − 1) / context` of them (every complete one).
impl Dataset for TokenWindows {
    type Item = usize;

    fn len(&self) -> usize {
        (self.tokens.len() - 1) / self.context
    }

    fn get(&self, i: usize) -> Result<usize> {
        check_index("TokenWindows::get", i, Dataset::len(self))?;
        Ok(i * self.context)
    }
}

/// Mean negative log-likelihood (nats per token) of `eval` under the unigram model of `train`
/// (token frequencies with add-one smoothing over `vocab` tokens): the baseline a language
/// model must beat. A token out of range or an empty `eval` is an error.
pub fn unigram_nll(train: &[usize], eval: &[usize], vocab: usize) -> Result<f64> {
    const WHAT: &str = "data::unigram_nll";
    if eval.is_empty() {
        return Err(usage(WHAT, "no tokens to evaluate"));
    }
    let mut counts = tl_spec::alloc::try_vec(WHAT, "counts", vocab, 1.0f64)?;
    for (part, tokens) in [("train", train), ("eval", eval)] {
        if let Some((i, &t)) = tokens.iter().enumerate().find(|(_, t)| **t >= vocab) {
            return Err(usage(
                WHAT,
                format!(
                    "{part} token {t} at position {i} is out of range for a vocabulary of {vocab}"
                ),
            ));
        }
    }
    for &t in train {
        counts[t] += 1.0;
    }
    let total: f64 = counts.iter().sum();
    Ok(eval.iter().map(|&t| -(counts[t] / total).ln()).sum::<f64>() / eval.len() as f64)
}
