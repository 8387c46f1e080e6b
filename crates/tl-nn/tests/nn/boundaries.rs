//! Every user-facing check of tl-nn at its exact boundary: the last valid value is accepted
//! (and gives the right answer), the first invalid value is an error (never a panic) whose
//! message names the layer or call and the value. Forward-time checks run on the eager and
//! the linked session.

use tl_nn::{
    AvgPool, BatchNorm, Conv, ConvConfig, ConvTranspose, Dropout, Embedding, GroupNorm, Labels,
    LayerNorm, Linear, MaxPool, Module, MultiHeadAttention, PRelu, RmsNorm, Runtime,
    SpectralConv1d, data,
};
use tl_session::{Backend, Train};
use tl_spec::Tensor;

use crate::{eager, linked, tensor};

/// The error of `r`, as text, asserting it is one and names every piece of `names`.
#[track_caller]
fn error_naming<T: std::fmt::Debug>(r: tl_nn::Result<T>, names: &[&str]) -> String {
    let e = match r {
        Ok(v) => {
            let v: String = format!("{v:?}").chars().take(200).collect();
            panic!("expected an error naming {names:?}, got Ok({v}…)")
        }
        Err(e) => e.to_string(),
    };
    for n in names {
        assert!(e.contains(n), "the error should name {n:?}: {e}");
    }
    e
}

/// Run `f` on an eager (CPU f64) and a linked (f64) runtime.
fn both(f: impl Fn(&str, &dyn Fn() -> Box<dyn AnyRt>)) {
    f("eager", &|| Box::new(eager::<f64>(Backend::Cpu, 0)));
    f("linked", &|| Box::new(linked::<f64>(0)));
}

/// The calls the boundary tests make, over either session.
trait AnyRt {
    fn labels_ce(&self, logits: Tensor<f64>, labels: &Labels) -> tl_nn::Result<f64>;
    fn embed(&self, num: usize, dim: usize, ids: &[usize]) -> tl_nn::Result<Tensor<f64>>;
    fn conv(&self, k: usize, pad: usize, size: usize) -> tl_nn::Result<Tensor<f64>>;
    fn conv_t(
        &self,
        k: usize,
        stride: usize,
        pad: usize,
        size: usize,
    ) -> tl_nn::Result<Tensor<f64>>;
    fn pool(
        &self,
        avg: bool,
        k: usize,
        stride: usize,
        pad: usize,
        size: usize,
    ) -> tl_nn::Result<Tensor<f64>>;
    fn spectral(&self, modes: usize, grid: usize) -> tl_nn::Result<Tensor<f64>>;
    fn linear(&self, inputs: usize, x_last: usize) -> tl_nn::Result<Tensor<f64>>;
    fn layer_norm(&self, dim: usize, x_last: usize) -> tl_nn::Result<Tensor<f64>>;
    fn batch_norm(&self, channels: usize, x_channels: usize) -> tl_nn::Result<Tensor<f64>>;
    fn accuracy(&self, rows: usize, labels: usize, batch: usize) -> tl_nn::Result<f64>;
    fn accuracy_of(&self, classes: usize) -> tl_nn::Result<f64>;
}

impl<O: Train<T = f64>> AnyRt for Runtime<O> {
    fn labels_ce(&self, logits: Tensor<f64>, labels: &Labels) -> tl_nn::Result<f64> {
        let v = self.eval(&Vec::<tl_session::Param>::new(), |g| {
            g.input(logits)?.cross_entropy(labels)
        })?;
        Ok(v.item()?)
    }
    fn embed(&self, num: usize, dim: usize, ids: &[usize]) -> tl_nn::Result<Tensor<f64>> {
        let name = format!("emb{num}x{dim}_{}", self.named_params().len());
        let e = Embedding::new(&self.vars().pp(name), num, dim)?;
        self.eval(&e, |g| e.forward(g, ids))
    }
    fn conv(&self, k: usize, pad: usize, size: usize) -> tl_nn::Result<Tensor<f64>> {
        let name = format!("conv{}", self.named_params().len());
        let c = Conv::conv1d(&self.vars().pp(name), 1, 1, k, ConvConfig::padded(pad))?;
        self.eval(&c, |g| c.forward(&g.input(tensor(&[1, size], 1))?))
    }
    fn conv_t(
        &self,
        k: usize,
        stride: usize,
        pad: usize,
        size: usize,
    ) -> tl_nn::Result<Tensor<f64>> {
        let name = format!("convt{}", self.named_params().len());
        let c = ConvTranspose::new(
            &self.vars().pp(name),
            1,
            1,
            &[k],
            ConvConfig::new(stride, pad),
        )?;
        self.eval(&c, |g| c.forward(&g.input(tensor(&[1, size], 2))?))
    }
    fn pool(
        &self,
        avg: bool,
        k: usize,
        stride: usize,
        pad: usize,
        size: usize,
    ) -> tl_nn::Result<Tensor<f64>> {
        let x = tensor(&[1, size], 3);
        if avg {
            let p = AvgPool::new(&[k])?.stride(stride)?.padding(pad)?;
            self.eval(&p, |g| p.forward(&g.input(x)?))
        } else {
            let p = MaxPool::new(&[k])?.stride(stride)?.padding(pad)?;
            self.eval(&p, |g| p.forward(&g.input(x)?))
        }
    }
    fn spectral(&self, modes: usize, grid: usize) -> tl_nn::Result<Tensor<f64>> {
        let name = format!("spec{}", self.named_params().len());
        let s = SpectralConv1d::new(&self.vars().pp(name), 2, modes)?;
        self.eval(&s, |g| s.forward(&g.input(tensor(&[grid, 2], 4))?))
    }
    fn linear(&self, inputs: usize, x_last: usize) -> tl_nn::Result<Tensor<f64>> {
        let name = format!("lin{}", self.named_params().len());
        let l = Linear::new(&self.vars().pp(name), inputs, 2)?;
        self.eval(&l, |g| l.forward(&g.input(tensor(&[3, x_last], 5))?))
    }
    fn layer_norm(&self, dim: usize, x_last: usize) -> tl_nn::Result<Tensor<f64>> {
        let name = format!("ln{}", self.named_params().len());
        let l = LayerNorm::new(&self.vars().pp(name), dim)?;
        self.eval(&l, |g| l.forward(&g.input(tensor(&[2, x_last], 6))?))
    }
    fn batch_norm(&self, channels: usize, x_channels: usize) -> tl_nn::Result<Tensor<f64>> {
        let name = format!("bn{}", self.named_params().len());
        let b = BatchNorm::new(&self.vars().pp(name), channels)?;
        self.eval(&b, |g| b.forward(&g.input(tensor(&[2, x_channels, 3], 7))?))
    }
    fn accuracy(&self, rows: usize, labels: usize, batch: usize) -> tl_nn::Result<f64> {
        let name = format!("acc{}", self.named_params().len());
        let l = Linear::new(&self.vars().pp(name), 2, 3)?;
        let labels = Labels::new(vec![0; labels], 3)?;
        self.accuracy(&l, &tensor(&[rows, 2], 8), &labels, batch)
    }
    fn accuracy_of(&self, classes: usize) -> tl_nn::Result<f64> {
        let name = format!("acc{}", self.named_params().len());
        let l = Linear::new(&self.vars().pp(name), 2, 3)?;
        let labels = Labels::new(vec![0, classes - 1], classes)?;
        self.accuracy(&l, &tensor(&[2, 2], 8), &labels, 2)
    }
}

#[test]
fn labels_accept_the_last_class_and_reject_the_next() {
    let l = Labels::new(vec![0, 2], 3).unwrap();
    assert_eq!((l.values(), l.classes(), l.len()), (&[0, 2][..], 3, 2));
    error_naming(
        Labels::new(vec![0, 3], 3),
        &["Labels::new", "label 3", "position 1", "3 classes"],
    );
    error_naming(Labels::new(vec![], 0), &["Labels::new", "at least 1"]);
    // One class: label 0 is the only valid one.
    Labels::new(vec![0, 0], 1).unwrap();
    error_naming(
        Labels::new(vec![1], 1),
        &["Labels::new", "label 1", "1 classes"],
    );
    // select: the last position is valid, the next is not.
    assert_eq!(l.select(&[1]).unwrap().values(), &[2]);
    error_naming(
        l.select(&[2]),
        &["Labels::select", "position 2", "2 labels"],
    );
}

#[test]
fn cross_entropy_takes_the_last_class_and_rejects_mismatched_labels() {
    both(|name, rt| {
        let rt = rt();
        // logits (2, 3): row 0 = [0, 0, 0], row 1 = [0, 0, ln 2]; label 2 is the last class.
        let logits = Tensor::new([2, 3], vec![0.0, 0.0, 0.0, 0.0, 0.0, 2f64.ln()]).unwrap();
        let want = (3f64.ln() + (4f64.ln() - 2f64.ln())) / 2.0;
        let got = rt
            .labels_ce(logits.clone(), &Labels::new(vec![2, 2], 3).unwrap())
            .unwrap();
        assert!((got - want).abs() < 1e-12, "{name}: {got} vs {want}");
        // Labels of 4 classes against 3 logits, and one label too many: errors naming both.
        let four = Labels::new(vec![3, 0], 4).unwrap();
        error_naming(
            rt.labels_ce(logits.clone(), &four),
            &["Var::cross_entropy", "3 classes", "4 classes"],
        );
        let three_rows = Labels::new(vec![0, 1, 2], 3).unwrap();
        error_naming(
            rt.labels_ce(logits, &three_rows),
            &["Var::cross_entropy", "2 row(s)", "3 value(s)"],
        );
    });
}

#[test]
fn embedding_takes_the_last_row_and_rejects_the_vocabulary_size() {
    both(|name, rt| {
        let rt = rt();
        let rows = rt.embed(4, 2, &[3, 0]).unwrap();
        assert_eq!(rows.shape().dims(), [2, 2], "{name}");
        let e = error_naming(
            rt.embed(4, 2, &[0, 4]),
            &["Embedding \"emb4x2_1\"", "id 4", "position 1", "4 rows"],
        );
        assert!(!e.contains("panick"), "{e}");
        error_naming(rt.embed(0, 2, &[]), &["Embedding::new", "0 × 2"]);
        error_naming(rt.embed(1, 0, &[]), &["Embedding::new", "1 × 0"]);
    });
    // The picked row is the table's last row, exactly.
    let rt = eager::<f64>(Backend::Cpu, 0);
    let e = Embedding::new(&rt.vars().pp("e"), 3, 2).unwrap();
    let table = rt.value_of(&e.weight).unwrap();
    let got = rt.eval(&e, |g| e.forward(g, &[2])).unwrap();
    assert_eq!(got.data(), &table.data()[4..6]);
}

#[test]
fn layer_sizes_of_zero_are_errors_naming_the_layer() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let v = rt.vars();
    Linear::new(&v.pp("l1"), 1, 1).unwrap();
    error_naming(Linear::new(&v.pp("l2"), 0, 1), &["Linear::new", "0 → 1"]);
    error_naming(Linear::new(&v.pp("l3"), 1, 0), &["Linear::new", "1 → 0"]);
    Conv::new(&v.pp("c1"), 1, 1, &[1; 8], ConvConfig::default()).unwrap();
    error_naming(
        Conv::new(&v.pp("c2"), 1, 1, &[1; 9], ConvConfig::default()),
        &["Conv::new", "kernel [1, 1, 1, 1, 1, 1, 1, 1, 1]"],
    );
    error_naming(
        Conv::new(&v.pp("c3"), 1, 1, &[], ConvConfig::default()),
        &["Conv::new", "kernel []"],
    );
    error_naming(
        Conv::new(&v.pp("c4"), 1, 1, &[2, 0], ConvConfig::default()),
        &["Conv::new", "kernel [2, 0]"],
    );
    error_naming(
        Conv::new(&v.pp("c5"), 0, 1, &[1], ConvConfig::default()),
        &["Conv::new", "0 → 1"],
    );
    error_naming(
        Conv::new(&v.pp("c6"), 1, 1, &[1], ConvConfig::new(0, 0)),
        &["Conv::new", "stride 0"],
    );
    Conv::new(&v.pp("c7"), 1, 1, &[1], ConvConfig::new(1, 0)).unwrap();
    error_naming(
        ConvTranspose::new(&v.pp("t1"), 1, 0, &[1], ConvConfig::default()),
        &["ConvTranspose::new", "1 → 0"],
    );
    MaxPool::new(&[1]).unwrap();
    error_naming(MaxPool::new(&[1, 0]), &["MaxPool::new", "[1, 0]"]);
    error_naming(AvgPool::new(&[]), &["AvgPool::new", "[]"]);
    LayerNorm::with_eps(&v.pp("n1"), 1, f64::MIN_POSITIVE).unwrap();
    error_naming(
        LayerNorm::with_eps(&v.pp("n2"), 1, 0.0),
        &["LayerNorm::new", "ε 0"],
    );
    error_naming(
        LayerNorm::with_eps(&v.pp("n3"), 0, 1e-5),
        &["LayerNorm::new", "dim 0"],
    );
    error_naming(
        LayerNorm::with_eps(&v.pp("n4"), 1, f64::INFINITY),
        &["LayerNorm::new", "ε inf"],
    );
    RmsNorm::new(&v.pp("r1"), 1).unwrap();
    RmsNorm::with_eps(&v.pp("r2"), 1, f64::MIN_POSITIVE).unwrap();
    error_naming(RmsNorm::new(&v.pp("r3"), 0), &["RmsNorm::new", "dim 0"]);
    error_naming(
        RmsNorm::with_eps(&v.pp("r4"), 1, 0.0),
        &["RmsNorm::new", "ε 0"],
    );
    error_naming(
        RmsNorm::with_eps(&v.pp("r5"), 1, f64::NAN),
        &["RmsNorm::new", "ε NaN"],
    );
    GroupNorm::new(&v.pp("g1"), 1, 1).unwrap();
    GroupNorm::new(&v.pp("g2"), 6, 6).unwrap();
    GroupNorm::with_eps(&v.pp("g3"), 3, 6, f64::MIN_POSITIVE).unwrap();
    error_naming(
        GroupNorm::new(&v.pp("g4"), 4, 6),
        &["GroupNorm::new", "4 group(s), 6 channel(s)"],
    );
    error_naming(
        GroupNorm::new(&v.pp("g5"), 7, 6),
        &["GroupNorm::new", "7 group(s), 6 channel(s)"],
    );
    error_naming(
        GroupNorm::new(&v.pp("g6"), 0, 6),
        &["GroupNorm::new", "0 group(s)"],
    );
    error_naming(
        GroupNorm::new(&v.pp("g8"), 1, 0),
        &["GroupNorm::new", "0 channel(s)"],
    );
    error_naming(
        GroupNorm::with_eps(&v.pp("g7"), 2, 6, f64::INFINITY),
        &["GroupNorm::new", "ε inf"],
    );
    BatchNorm::with(&v.pp("b1"), 1, 1e-5, 1.0).unwrap();
    BatchNorm::with(&v.pp("b2"), 1, 1e-5, 0.0).unwrap();
    error_naming(
        BatchNorm::with(&v.pp("b3"), 1, 1e-5, 1.0 + f64::EPSILON),
        &["BatchNorm::new", "momentum 1.0000000000000002"],
    );
    error_naming(
        BatchNorm::with(&v.pp("b4"), 1, 1e-5, -f64::MIN_POSITIVE),
        &["BatchNorm::new", "momentum -"],
    );
    error_naming(
        BatchNorm::with(&v.pp("b5"), 0, 1e-5, 0.1),
        &["BatchNorm::new", "got 0"],
    );
    MultiHeadAttention::new(&v.pp("a1"), 3, 3, false).unwrap();
    error_naming(
        MultiHeadAttention::new(&v.pp("a2"), 3, 2, false),
        &["MultiHeadAttention::new", "d 3, heads 2"],
    );
    error_naming(
        MultiHeadAttention::new(&v.pp("a3"), 3, 0, false),
        &["MultiHeadAttention::new", "heads 0"],
    );
    error_naming(
        MultiHeadAttention::new(&v.pp("a4"), 0, 1, false),
        &["MultiHeadAttention::new", "d 0"],
    );
    SpectralConv1d::new(&v.pp("s1"), 1, 1).unwrap();
    error_naming(
        SpectralConv1d::new(&v.pp("s2"), 1, 0),
        &["SpectralConv1d::new", "modes 0"],
    );
    error_naming(
        SpectralConv1d::new(&v.pp("s3"), 0, 1),
        &["SpectralConv1d::new", "width 0"],
    );
}

#[test]
fn dropout_takes_probabilities_just_below_one() {
    let below = f64::from_bits(1f64.to_bits() - 1);
    Dropout::new(0.0).unwrap();
    Dropout::new(below).unwrap();
    error_naming(Dropout::new(1.0), &["Dropout::new", "got 1"]);
    error_naming(Dropout::new(-f64::MIN_POSITIVE), &["Dropout::new", "got -"]);
    error_naming(Dropout::new(f64::NAN), &["Dropout::new", "NaN"]);
}

#[test]
fn convolution_and_pool_windows_fit_exactly_or_are_errors() {
    both(|name, rt| {
        let rt = rt();
        // Conv k=3, no padding: an input of 3 gives one output, 2 is an error.
        assert_eq!(rt.conv(3, 0, 3).unwrap().shape().dims(), [1, 1], "{name}");
        error_naming(rt.conv(3, 0, 2), &["conv", "kernel [3]", "input [1, 2]"]);
        // With padding 1, an input of 1 fits a kernel of 3 (1 + 2·1 = 3).
        assert_eq!(rt.conv(3, 1, 1).unwrap().shape().dims(), [1, 1], "{name}");
        // Transposed: out = (size − 1)·stride − 2·pad + k; (1 − 1)·1 − 2·1 + 3 = 1 fits,
        // padding 2 gives −1: an error.
        assert_eq!(
            rt.conv_t(3, 1, 1, 1).unwrap().shape().dims(),
            [1, 1],
            "{name}"
        );
        error_naming(
            rt.conv_t(3, 1, 2, 1),
            &["convTranspose", "padding [2]", "empty output"],
        );
        for (avg, layer) in [(false, "MaxPool"), (true, "AvgPool")] {
            // Pool k=2: an input of 2 gives one window, 1 is an error naming the layer;
            // padding 1 (2·1 ≤ 2) is accepted, padding 2 and stride 0 are refused as the
            // layer is built.
            assert_eq!(
                rt.pool(avg, 2, 2, 0, 2).unwrap().shape().dims(),
                [1, 1],
                "{name}"
            );
            error_naming(
                rt.pool(avg, 2, 2, 0, 1),
                &[&format!("{layer}1d: "), "kernel [2]", "input [1, 1]"],
            );
            assert_eq!(
                rt.pool(avg, 2, 2, 1, 2).unwrap().shape().dims(),
                [1, 2],
                "{name}"
            );
            error_naming(
                rt.pool(avg, 2, 2, 2, 2),
                &[&format!("{layer}::padding"), "padding [2]", "kernel [2]"],
            );
            error_naming(
                rt.pool(avg, 2, 0, 0, 2),
                &[&format!("{layer}::stride"), "stride [0]"],
            );
        }
        // Spectral: 3 modes need a grid of 4 (4/2 + 1 = 3); a grid of 3 keeps only 2.
        assert_eq!(rt.spectral(3, 4).unwrap().shape().dims(), [4, 2], "{name}");
        error_naming(
            rt.spectral(3, 3),
            &["spectralConv1dRfft", "grid 3", "got 3"],
        );
    });
}

#[test]
fn input_widths_must_match_the_layer() {
    both(|name, rt| {
        let rt = rt();
        assert_eq!(rt.linear(4, 4).unwrap().shape().dims(), [3, 2], "{name}");
        error_naming(
            rt.linear(4, 5),
            &["Linear \"lin2\"", "input [3, 5] has 5 features, expected 4"],
        );
        error_naming(
            rt.linear(4, 3),
            &["Linear \"lin4\"", "input [3, 3] has 3 features, expected 4"],
        );
        assert_eq!(
            rt.layer_norm(3, 3).unwrap().shape().dims(),
            [2, 3],
            "{name}"
        );
        error_naming(
            rt.layer_norm(3, 4),
            &[
                "LayerNorm",
                "input [2, 4] has 4 features in its last axis, expected 3",
            ],
        );
        assert_eq!(
            rt.batch_norm(2, 2).unwrap().shape().dims(),
            [2, 2, 3],
            "{name}"
        );
        error_naming(
            rt.batch_norm(2, 3),
            &["BatchNorm", "[2, 3, 3]", "2 channels"],
        );
    });
}

#[test]
fn accuracy_and_batches_take_batch_one_and_reject_zero() {
    both(|name, rt| {
        let rt = rt();
        let a = rt.accuracy(3, 3, 1).unwrap();
        assert!((0.0..=1.0).contains(&a), "{name}: {a}");
        // A batch larger than the data is one batch of everything.
        assert_eq!(rt.accuracy(3, 3, 4).unwrap(), a, "{name}");
        error_naming(rt.accuracy(3, 3, 0), &["Runtime::accuracy", "batch 0"]);
        error_naming(rt.accuracy(3, 2, 1), &["Runtime::accuracy", "2 labels"]);
        error_naming(rt.accuracy(0, 0, 1), &["Runtime::accuracy", "0 labels"]);
        // Labels of fewer classes than logits are fine; of more, an error naming both.
        assert!(
            rt.accuracy_of(2).is_ok() && rt.accuracy_of(3).is_ok(),
            "{name}"
        );
        error_naming(
            rt.accuracy_of(5),
            &["Runtime::accuracy", "5 classes", "3 logits"],
        );
    });
    let (train, _) = data::digits().unwrap();
    let train = train.truncate(5);
    let b = train.batches::<f32>(5, data::CLASSES, 0).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(train.batches::<f32>(1, data::CLASSES, 0).unwrap().len(), 5);
    error_naming(
        train.batches::<f32>(0, data::CLASSES, 0),
        &["Split::batches", "at least 1"],
    );
    // Labels of the digits are 0..=9: 10 classes hold them, fewer may not.
    let all = data::digits().unwrap().0;
    all.labels(data::CLASSES).unwrap();
    error_naming(all.labels(9), &["Labels::new", "label 9", "9 classes"]);
}

/// A layer's public fields set after construction to what its constructor refuses (`heads`
/// 0, a rope on an odd head size, a weight of another rank, `groups` 0, `channels` 0) are
/// refused at use with an error naming the layer and the value, never a panic (a division by
/// zero, an index, `rank − 2` underflowing), on both sessions.
#[test]
fn public_fields_are_checked_again_at_use() {
    fn run<O: Train<T = f64>>(rt: &Runtime<O>, name: &str) {
        use tl_nn::{InstanceNorm, KvCache, Rope, RopeLayout};
        let v = rt.vars();
        let x = tensor(&[2, 4], 1);
        let mut m = MultiHeadAttention::new(&v.pp("a"), 4, 2, true).unwrap();
        m.heads = 0;
        let e = error_naming(
            rt.eval(&m, |g| m.forward(&g.input(x.clone())?)),
            &["MultiHeadAttention", "heads 0"],
        );
        assert!(e.contains("MultiHeadAttention::forward"), "{name}: {e}");
        error_naming(
            rt.eval(&m, |g| {
                let x = g.input(x.clone())?;
                m.forward_qkv(&x, &x, &x, None)
            }),
            &["MultiHeadAttention::forward_qkv", "heads 0"],
        );
        let mut cache = KvCache::new();
        error_naming(
            rt.eval(&m, |g| m.forward_cached(&g.input(x.clone())?, &mut cache)),
            &["MultiHeadAttention::forward_cached", "heads 0"],
        );
        assert!(
            cache.is_empty(),
            "{name}: a refused chunk changed the cache"
        );
        error_naming(
            m.clone().with_rope(Rope::DEFAULT),
            &["MultiHeadAttention::with_rope", "heads 0"],
        );
        // kv_heads is checked as the constructor checks it.
        m.heads = 2;
        m.kv_heads = 3;
        error_naming(
            rt.eval(&m, |g| m.forward(&g.input(x.clone())?)),
            &["MultiHeadAttention::forward", "kv_heads 3"],
        );
        // A rope set directly on head size 1 (odd): with_rope's check, at use.
        let mut m = MultiHeadAttention::new(&v.pp("b"), 4, 4, true).unwrap();
        let halves = Rope {
            base: 10000.0,
            layout: RopeLayout::Halves,
        };
        error_naming(m.clone().with_rope(halves), &["with_rope", "head size 1"]);
        m.rope = Some(halves);
        error_naming(
            rt.eval(&m, |g| m.forward(&g.input(x.clone())?)),
            &["MultiHeadAttention::forward", "head size 1 must be even"],
        );
        // A projection of another shape.
        let mut m = MultiHeadAttention::new(&v.pp("c"), 4, 2, false).unwrap();
        m.wk = v.param("odd_wk", &[4], tl_nn::Init::Ones).unwrap();
        error_naming(
            rt.eval(&m, |g| m.forward(&g.input(x.clone())?)),
            &["MultiHeadAttention::forward", "wk has shape [4]", "[4, 4]"],
        );

        // GroupNorm with groups 0; InstanceNorm with channels 0 on an (N, 0, L) input.
        let mut gn = GroupNorm::new(&v.pp("gn"), 2, 4).unwrap();
        gn.groups = 0;
        let x3 = tensor(&[2, 4, 3], 2);
        error_naming(
            rt.eval(&gn, |g| gn.forward(&g.input(x3.clone())?)),
            &["GroupNorm \"gn\"", "GroupNorm::forward", "0 group(s)"],
        );
        gn.groups = 3;
        error_naming(
            rt.eval(&gn, |g| gn.forward(&g.input(x3.clone())?)),
            &["GroupNorm::forward", "3 group(s), 4 channel(s)"],
        );
        let mut inorm = InstanceNorm::new(&v.pp("in"), 4).unwrap();
        inorm.channels = 0;
        error_naming(
            rt.eval(&inorm, |g| {
                inorm.forward(&g.input(Tensor::zeros([2, 0, 3]))?)
            }),
            &["InstanceNorm::forward", "0 channel(s)"],
        );

        // A weight of another rank in Linear, Conv and ConvTranspose.
        let odd = v.param("odd", &[4], tl_nn::Init::Ones).unwrap();
        let mut l = Linear::new(&v.pp("lin"), 4, 2).unwrap();
        l.weight = odd.clone();
        error_naming(
            rt.eval(&l, |g| l.forward(&g.input(x.clone())?)),
            &["Linear::forward", "weight has shape [4]", "(out, in)"],
        );
        assert!(
            tl_nn::tree(&l).to_string().contains("in_features=0"),
            "{name}"
        );
        let mut c = Conv::conv1d(&v.pp("conv"), 1, 1, 3, ConvConfig::default()).unwrap();
        c.weight = odd.clone();
        let xc = tensor(&[1, 1, 5], 3);
        error_naming(
            rt.eval(&c, |g| c.forward(&g.input(xc.clone())?)),
            &["Conv::forward", "weight has shape [4]", "(out, in, k…)"],
        );
        let mut t = ConvTranspose::new(&v.pp("convt"), 1, 1, &[3], ConvConfig::default()).unwrap();
        t.weight = odd;
        error_naming(
            rt.eval(&t, |g| t.forward(&g.input(xc.clone())?)),
            &[
                "ConvTranspose::forward",
                "weight has shape [4]",
                "(in, out, k…)",
            ],
        );
        // The config is public too: a stride of 0, as the constructor refuses it.
        let mut c = Conv::conv1d(&v.pp("conv0"), 1, 1, 3, ConvConfig::default()).unwrap();
        c.config.stride = 0;
        error_naming(
            rt.eval(&c, |g| c.forward(&g.input(xc.clone())?)),
            &["Conv::forward", "stride 0"],
        );

        // The norms, PReLU and Embedding: a weight of another rank (a scalar), and ε or the
        // momentum out of range, refused at use as their constructors refuse them.
        let scalar = v.param("scalar", &[], tl_nn::Init::Ones).unwrap();
        let mut bn = BatchNorm::new(&v.pp("bn"), 4).unwrap();
        bn.weight = scalar.clone();
        error_naming(
            rt.forward_train(&bn, |g| bn.forward(&g.input(x3.clone())?)),
            &["BatchNorm::forward", "weight has shape []", "(C)"],
        );
        assert!(
            tl_nn::tree(&bn).to_string().contains("BatchNorm(0,"),
            "{name}"
        );
        let mut bn = BatchNorm::new(&v.pp("bn2"), 4).unwrap();
        bn.momentum = f64::NAN;
        error_naming(
            rt.forward_train(&bn, |g| bn.forward(&g.input(x3.clone())?)),
            &["BatchNorm::forward", "momentum NaN"],
        );
        bn.momentum = 0.1;
        bn.eps = 0.0;
        error_naming(
            rt.eval(&bn, |g| bn.forward(&g.input(x3.clone())?)),
            &["BatchNorm::forward", "ε 0"],
        );
        let mut ln = LayerNorm::new(&v.pp("ln"), 4).unwrap();
        ln.eps = -1.0;
        error_naming(
            rt.eval(&ln, |g| ln.forward(&g.input(x.clone())?)),
            &["LayerNorm::forward", "ε -1"],
        );
        ln.eps = 1e-5;
        ln.weight = scalar.clone();
        error_naming(
            rt.eval(&ln, |g| ln.forward(&g.input(x.clone())?)),
            &["LayerNorm::forward", "normalized_shape []"],
        );
        let mut rms = RmsNorm::new(&v.pp("rms"), 4).unwrap();
        rms.weight = scalar.clone();
        error_naming(
            rt.eval(&rms, |g| rms.forward(&g.input(x.clone())?)),
            &["RmsNorm::forward", "weight has shape []", "(dim)"],
        );
        assert!(tl_nn::tree(&rms).to_string().contains("(0,)"), "{name}");
        let mut rms = RmsNorm::new(&v.pp("rms2"), 4).unwrap();
        rms.eps = Some(f64::INFINITY);
        error_naming(
            rt.eval(&rms, |g| rms.forward(&g.input(x.clone())?)),
            &["RmsNorm::forward", "ε inf"],
        );
        let mut pr = PRelu::new(&v.pp("pr"), 4).unwrap();
        pr.weight = scalar.clone();
        error_naming(
            rt.eval(&pr, |g| pr.forward(&g.input(x3.clone())?)),
            &["PRelu::forward", "weight has shape []"],
        );
        let mut emb = Embedding::new(&v.pp("emb"), 5, 4).unwrap();
        emb.weight = scalar;
        error_naming(
            rt.eval(&emb, |g| emb.forward(g, &[0, 1])),
            &[
                "Embedding::forward",
                "weight has shape []",
                "(num_embeddings, dim)",
            ],
        );
        assert!(tl_nn::tree(&emb).to_string().contains("0, 0"), "{name}");
    }
    run(&eager::<f64>(Backend::Cpu, 0), "eager");
    run(&linked::<f64>(0), "linked");
}

/// Sizes are checked before they are multiplied and before anything of their size is made:
/// a constructor's sizes whose product overflows, or a model of a huge count of blocks, is
/// an error naming the constructor and the value (not an overflow panic, a capacity panic,
/// or a long loop ending in an abort), and nothing was created.
#[test]
fn huge_sizes_are_errors_before_anything_is_made() {
    use tl_nn::models::{Fno1d, FnoConfig, LmConfig, ResNet, ResNetConfig, TransformerLm};
    let rt = eager::<f64>(Backend::Cpu, 0);
    let v = rt.vars();
    let huge = [1 << 32, 1 << 32];
    error_naming(
        Conv::new(&v.pp("c"), 1, 1, &huge, ConvConfig::default()),
        &["Conv::new", "[1, 1, 4294967296, 4294967296]"],
    );
    error_naming(
        ConvTranspose::new(&v.pp("t"), 1, 1, &huge, ConvConfig::default()),
        &["ConvTranspose::new", "[1, 1, 4294967296, 4294967296]"],
    );
    error_naming(
        SpectralConv1d::new(&v.pp("s"), 1 << 32, 1),
        &["SpectralConv1d::new", "[1, 4294967296, 4294967296]"],
    );
    error_naming(
        MultiHeadAttention::new(&v.pp("a"), usize::MAX, 1, false),
        &["MultiHeadAttention::new", &usize::MAX.to_string()],
    );
    // Xavier's fan_in + fan_out of a caller's Init does not overflow either.
    let init = tl_nn::Init::XavierUniform {
        fan_in: usize::MAX,
        fan_out: 1,
    };
    init.sample::<f64>(&[1], || Ok(0)).unwrap();

    let fno = |layers: usize| FnoConfig {
        in_channels: 1,
        out_channels: 1,
        width: 2,
        modes: 2,
        layers,
        proj_hidden: 2,
        exact_gelu: false,
    };
    error_naming(
        Fno1d::new(&v.pp("fno"), &fno(usize::MAX)).map(|_| ()),
        &["Fno1d::new", &format!("layers: {}", usize::MAX), "usize"],
    );
    error_naming(
        Fno1d::new(&v.pp("fno"), &fno(1 << 40)).map(|_| ()),
        &["Fno1d::new", "layers: 1099511627776", "too large"],
    );
    let resnet = ResNetConfig {
        in_channels: 1,
        channels: 1,
        blocks: 1 << 40,
        classes: 2,
    };
    error_naming(
        ResNet::new(&v.pp("resnet"), &resnet).map(|_| ()),
        &["ResNet::new", "blocks: 1099511627776", "too large"],
    );
    let lm = LmConfig {
        vocab: 2,
        context: 2,
        d_model: 2,
        heads: 1,
        d_ff: 2,
        blocks: 1 << 40,
    };
    error_naming(
        TransformerLm::new(&v.pp("lm"), &lm).map(|_| ()),
        &["TransformerLm::new", "blocks: 1099511627776", "too large"],
    );
    assert!(
        rt.named_params().is_empty(),
        "a refused layer or model made parameters: {:?}",
        rt.named_params().iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    // The checks do not refuse the sizes that fit.
    Fno1d::new(&v.pp("fno"), &fno(2)).unwrap();
    ResNet::new(
        &v.pp("resnet"),
        &ResNetConfig {
            blocks: 2,
            ..resnet
        },
    )
    .unwrap();
    TransformerLm::new(&v.pp("lm"), &LmConfig { blocks: 2, ..lm }).unwrap();
}

/// Empty tensors whose other axes have a product past usize (valid: 0 elements) give the
/// empty result where it is well defined, and else an error naming the call and the shape:
/// never the overflow of an `iter().product()` of the axes.
#[test]
fn empty_tensors_with_huge_axes_never_overflow_a_product() {
    use tl_nn::data::Dataset;
    use tl_nn::losses::nll_loss;
    use tl_nn::{AdaptiveAvgPool, InstanceNorm, Reduction, Upsample};
    let big = 1usize << 33;
    let empty = |dims: &[usize]| Tensor::<f64>::new(dims, vec![]).unwrap();
    let rt = eager::<f64>(Backend::Cpu, 0);
    let v = rt.vars();
    // Linear: the rows of (2³³, 2³³, 0, 4) are 0.
    let l = Linear::new(&v.pp("lin"), 4, 2).unwrap();
    let y = rt
        .eval(&l, |g| l.forward(&g.input(empty(&[big, big, 0, 4]))?))
        .unwrap();
    assert_eq!(y.shape().dims(), [big, big, 0, 2]);
    error_naming(
        rt.eval(&l, |g| l.forward(&g.input(empty(&[0, big, big, 3]))?)),
        &["Linear", "has 3 features, expected 4"],
    );
    // softmax along an axis, cross-entropy's rows.
    let shape = format!("[{big}, {big}, 0, 4]");
    error_naming(
        rt.eval(&l, |g| g.input(empty(&[big, big, 0, 4]))?.softmax_axis(2)),
        &["softmax", &shape, "past usize"],
    );
    let labels = Labels::new(vec![], 3).unwrap();
    error_naming(
        rt.eval(&l, |g| {
            g.input(empty(&[big, big, 0]))?.cross_entropy(&labels)
        }),
        &["Var::cross_entropy", &format!("[{big}, {big}, 0]")],
    );
    error_naming(
        rt.eval(&l, |g| {
            nll_loss(
                &g.input(empty(&[0, 3, big, big]))?,
                &labels,
                None,
                None,
                Reduction::Mean,
            )
        }),
        &["nll_loss", &format!("[0, 3, {big}, {big}]")],
    );
    // The channel-first norms: (0, C, 2³³, 2³³).
    let x = || empty(&[0, 2, big, big]);
    let gn = GroupNorm::new(&v.pp("gn"), 1, 2).unwrap();
    error_naming(
        rt.eval(&gn, |g| gn.forward(&g.input(x())?)),
        &["GroupNorm::forward", &format!("[0, 2, {big}, {big}]")],
    );
    let inorm = InstanceNorm::new(&v.pp("in"), 2).unwrap();
    error_naming(
        rt.eval(&inorm, |g| inorm.forward(&g.input(x())?)),
        &["InstanceNorm::forward", "past usize"],
    );
    let bn = BatchNorm::new(&v.pp("bn"), 2).unwrap();
    error_naming(
        rt.eval(&bn, |g| bn.forward(&g.input(x())?)),
        &["BatchNorm::forward", "past usize"],
    );
    // Resampling along an axis.
    let up = Upsample::bilinear(2, false).unwrap();
    error_naming(
        rt.eval(&up, |g| up.forward(&g.input(empty(&[big, big, 0, 4]))?)),
        &["Upsample::forward", "past usize"],
    );
    let pool = AdaptiveAvgPool::new(&[1, big, big]).unwrap();
    error_naming(
        rt.eval(&pool, |g| {
            pool.forward(&g.input(empty(&[0, 1, 5, big, big]))?)
        }),
        &["AdaptiveAvgPool::forward", "past usize"],
    );
    // A dataset row of an empty tensor.
    let data = Tensor::<f32>::new([1, big, big, 0], vec![]).unwrap();
    assert_eq!(
        Dataset::get(&data, 0).unwrap().shape().dims(),
        [big, big, 0]
    );
}

/// Sizes that come from input are allocated fallibly and their products checked: sampling
/// from an empty batch of a huge vocabulary, a permutation of a huge `n`, and a split shaped
/// with sizes whose product wraps to its feature count.
#[test]
fn sizes_from_input_are_checked_before_allocating() {
    let logits = Tensor::<f32>::new([0, 1 << 40], vec![]).unwrap();
    let mut rng = tl_nn::Rng::new(0);
    // No rows: no tokens (as argmax), and no order of 2⁴⁰ tokens allocated.
    assert!(tl_nn::sample(&logits, 1.0, 5, &mut rng).unwrap().is_empty());
    assert!(tl_nn::argmax(&logits).unwrap().is_empty());
    error_naming(
        data::try_permutation(usize::MAX, 0),
        &["data::permutation", &usize::MAX.to_string()],
    );
    error_naming(
        data::try_permutation(1 << 60, 0),
        &["data::permutation", &(1usize << 60).to_string()],
    );
    // The same order as ever (the digits split and tl train's epochs read it).
    assert_eq!(
        data::try_permutation(10, 3).unwrap(),
        [2, 8, 7, 4, 5, 6, 0, 1, 9, 3]
    );
    let (train, _) = data::digits().unwrap();
    // (2⁶³ + 1)·64 wraps to 64, the features of a digit.
    let wraps = [(1 << 63) + 1, 64];
    error_naming(
        train.clone().shaped(&wraps),
        &["Split::shaped", &format!("{wraps:?}"), "64 features"],
    );
    error_naming(
        train.clone().shaped(&[0, 64]),
        &["Split::shaped", "[0, 64]"],
    );
    assert_eq!(train.shaped(&[1, 8, 8]).unwrap().dims(), [1, 8, 8]);
}
