//! `char_lm` with LLaMA-style blocks (`models::LlamaBlock`): RMSNorm, causal attention of 4
//! query heads over 2 key/value heads with rotary position embeddings (no learned positions),
//! a SwiGLU MLP, on the same King James text, optimizer, schedule and batches. It exits with
//! an error unless the model beats the unigram baseline by at least 1 nat per character.
//!
//! `cargo run --release -p tl-nn --example char_llama` (1,000 steps); `CHAR_LM_STEPS=60` runs
//! a short version that only has to beat the baseline.

use tl_nn::data::{TokenBatch, TokenWindows, Vocab, kjv_text, unigram_nll};
use tl_nn::models::{LlamaBlock, LlamaConfig};
use tl_nn::{Embedding, Linear, Module, Parameters, Result, RmsNorm, Rng, Rope, Runtime};
use tl_nn::{Schedule, Scope, Var, Vars, sample};
use tl_session::{Optimizer, Options, Session, Train};

const N: usize = 32; // context: tokens per window
const D: usize = 64; // model width

/// Token embeddings, two LLaMA-style blocks, a final RMSNorm, a linear head.
#[derive(Parameters)]
struct Lm {
    tok: Embedding,
    blocks: Vec<LlamaBlock>,
    ln: RmsNorm,
    head: Linear,
}

impl Lm {
    fn new<O: Train>(v: &Vars<'_, O>, vocab: usize) -> Result<Self> {
        let c = LlamaConfig {
            d_model: D,
            heads: 4,
            kv_heads: 2,
            d_ff: 172, // ≈ 8D/3: SwiGLU's three matrices hold what the GPT MLP's two do
            rope: Rope::DEFAULT,
            eps: 1e-5,
        };
        let block = |i: usize| LlamaBlock::new(&v.pp("blocks").pp(i), &c);
        Ok(Lm {
            tok: Embedding::new(&v.pp("tok"), vocab, D)?,
            blocks: vec![block(0)?, block(1)?],
            ln: RmsNorm::with_eps(&v.pp("ln"), D, c.eps)?,
            head: Linear::new(&v.pp("head"), D, vocab)?,
        })
    }

    /// Logits (B, N, vocab) of B windows of N tokens (row-major).
    fn logits<'g, O: Train>(&self, g: &Scope<'g, O>, ids: &[usize]) -> Result<Var<'g, O>> {
        let x = self.tok.forward_shaped(g, ids, &[ids.len() / N, N])?;
        let h = self.blocks.iter().try_fold(x, |h, b| b.forward(&h))?;
        self.head.forward(&self.ln.forward(&h)?)
    }

    /// The mean next-token cross-entropy of a batch.
    fn loss<'g, O: Train>(&self, g: &Scope<'g, O>, b: &TokenBatch) -> Result<Var<'g, O>> {
        self.logits(g, &b.inputs)?.cross_entropy(&b.targets)
    }
}

fn main() -> Result<()> {
    let steps = std::env::var("CHAR_LM_STEPS").map_or(1000, |s| s.parse().expect("a number"));
    let (text, mut rng) = (kjv_text(), Rng::new(0));
    let vocab = Vocab::from_text(text)?;
    let (tokens, v) = (vocab.encode(text)?, vocab.len());
    let cut = tokens.len() * 9 / 10; // the first 90% trains
    let train = TokenWindows::new(tokens[..cut].to_vec(), N, v)?;
    let val = TokenWindows::new(tokens[cut..].to_vec(), N, v)?;
    let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);
    let model = Lm::new(&rt.vars(), v)?;
    let schedule = Schedule::cosine_warmup(steps / 10, 0.01, steps - steps / 10, 1e-4)?;
    let opt = Optimizer::adamw(3e-3)?.clip_grad_norm(1.0, 2.0)?;
    let mut opt = opt.schedule(schedule)?;
    for step in 0..steps {
        let b = train.sample(32, &mut rng)?;
        let loss = rt.step(&model, &mut opt, |g| model.loss(g, &b))?;
        if step % 100 == 0 {
            println!("step {step:4}: loss {loss:.3}");
        }
    }
    // Every complete batch of consecutive validation windows: equal sizes, so the mean of
    // the batch means is the mean over their characters.
    let mut losses = Vec::new();
    for b in val.loader(64)?.drop_last(true).epoch(0) {
        losses.push(f64::from(rt.eval(&model, |g| model.loss(g, &b?))?.item()?));
    }
    let loss = losses.iter().sum::<f64>() / losses.len() as f64;
    let targets = &tokens[cut + 1..cut + 1 + losses.len() * 64 * N];
    let base = unigram_nll(&tokens[..cut], targets, v)?;
    println!("validation loss {loss:.3} nats/char, unigram baseline {base:.3}");
    let mut out = tokens[cut..cut + N].to_vec(); // a prompt from the validation text
    for _ in 0..300 {
        let logits = rt.eval(&model, |g| model.logits(g, &out[out.len() - N..]))?;
        out.extend(sample(&logits, 0.8, 10, &mut rng)?);
    }
    println!("{}", vocab.decode(&out)?);
    let margin = if steps >= 1000 { 1.0 } else { 0.0 }; // the default run: 1 nat
    assert!(base - loss > margin, "the margin is under {margin} nat");
    Ok(())
}
