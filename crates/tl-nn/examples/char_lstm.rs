//! A character-level LSTM language model on the shipped King James text: an embedding, a
//! batch-first `Lstm` (PyTorch's `nn.LSTM(32, 128, batch_first=True)`) and a linear head,
//! trained with Adam and gradient clipping on random windows; the validation loss against the
//! unigram baseline (it exits with an error unless the model beats it), then sampled text.
//!
//! `cargo run --release -p tl-nn --example char_lstm` (`CHAR_LSTM_STEPS=30`: a short run).

use tl_nn::data::{TokenBatch, TokenWindows, Vocab, kjv_text, unigram_nll};
use tl_nn::{Embedding, Linear, Lstm, Module, Parameters, Result, Rng, RnnConfig, Runtime};
use tl_nn::{Scope, Var, Vars, sample};
use tl_session::{Optimizer, Options, Session, Train};

const N: usize = 32; // context: tokens per window

/// Embedding (vocab, 32) → LSTM (32 → 128) → linear head to the vocabulary.
#[derive(Parameters)]
struct CharLstm {
    emb: Embedding,
    lstm: Lstm,
    head: Linear,
}

impl CharLstm {
    fn new<O: Train>(v: &Vars<'_, O>, vocab: usize) -> Result<Self> {
        let cfg = RnnConfig::default().batch_first(true); // (B, T, features)
        Ok(CharLstm {
            emb: Embedding::new(&v.pp("emb"), vocab, 32)?,
            lstm: Lstm::new(&v.pp("lstm"), 32, 128, cfg)?,
            head: Linear::new(&v.pp("head"), 128, vocab)?,
        })
    }

    /// Logits (B, N, vocab) of B windows of N tokens (row-major).
    fn logits<'g, O: Train>(&self, g: &Scope<'g, O>, ids: &[usize]) -> Result<Var<'g, O>> {
        let x = self.emb.forward_shaped(g, ids, &[ids.len() / N, N])?;
        self.head.forward(&self.lstm.forward(&x)?)
    }

    /// The mean next-token cross-entropy of a batch.
    fn loss<'g, O: Train>(&self, g: &Scope<'g, O>, b: &TokenBatch) -> Result<Var<'g, O>> {
        self.logits(g, &b.inputs)?.cross_entropy(&b.targets)
    }
}

fn main() -> Result<()> {
    let steps = std::env::var("CHAR_LSTM_STEPS").map_or(300, |s| s.parse().expect("a number"));
    let (text, mut rng) = (kjv_text(), Rng::new(0));
    let vocab = Vocab::from_text(text)?;
    let (tokens, v) = (vocab.encode(text)?, vocab.len());
    let cut = tokens.len() * 9 / 10; // the first 90% trains
    let train = TokenWindows::new(tokens[..cut].to_vec(), N, v)?;
    let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);
    let model = CharLstm::new(&rt.vars(), v)?;
    let mut opt = Optimizer::adam(1e-2)?.clip_grad_norm(1.0, 2.0)?;
    for step in 0..steps {
        let b = train.sample(32, &mut rng)?;
        let loss = rt.step(&model, &mut opt, |g| model.loss(g, &b))?;
        if step % 50 == 0 {
            println!("step {step:4}: loss {loss:.3}");
        }
    }
    // 64 validation windows from the held-out text.
    let b = TokenWindows::new(tokens[cut..].to_vec(), N, v)?.sample(64, &mut rng)?;
    let loss = f64::from(rt.eval(&model, |g| model.loss(g, &b))?.item()?);
    let base = unigram_nll(&tokens[..cut], b.targets.values(), v)?;
    println!("validation loss {loss:.3} nats/char, unigram baseline {base:.3}");
    let mut out = tokens[cut..cut + N].to_vec(); // a prompt from the validation text
    for _ in 0..200 {
        let logits = rt.eval(&model, |g| model.logits(g, &out[out.len() - N..]))?;
        out.extend(sample(&logits, 0.8, 10, &mut rng)?);
    }
    println!("{}", vocab.decode(&out)?);
    assert!(loss < base, "the LSTM does not beat the unigram baseline");
    Ok(())
}
