//! Seeing a model: `Display` of Sequential and the layers (PyTorch's `print(model)`), the
//! tree of a derived model, and `Runtime::summary` (its counts add up to `num_params`).

use tl_nn::{
    Activation, AvgPool, BatchNorm, Conv, ConvConfig, ConvTranspose, Dropout, Embedding, Flatten,
    GroupNorm, LayerNorm, Linear, MaxPool, MultiHeadAttention, Parameters, RmsNorm, Runtime,
    Sequential, SpectralConv1d, tree,
};
use tl_session::{Backend, Param, Train};

use crate::{eager, mlp};

#[test]
fn a_sequential_prints_as_pytorch_prints_it() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let model = mlp(&rt, 784, 32, 10);
    assert_eq!(
        model.to_string(),
        "Sequential(
  (0): Linear(in_features=784, out_features=32, bias=True)
  (1): ReLU()
  (2): Linear(in_features=32, out_features=10, bias=True)
)"
    );
    let v = rt.vars().pp("cnn");
    let cnn = Sequential::<tl_session::Session<f32>>::new()
        .add(Conv::conv2d(&v.pp(0), 1, 8, 3, ConvConfig::padded(1)).unwrap())
        .add(BatchNorm::new(&v.pp(1), 8).unwrap())
        .add(Activation::Relu)
        .add(MaxPool::new(&[2, 2]).unwrap())
        .add(Dropout::new(0.25).unwrap())
        .add(Flatten)
        .add(Linear::with_bias(&v.pp(6), 128, 10, false).unwrap());
    assert_eq!(
        cnn.to_string(),
        "Sequential(
  (0): Conv2d(1, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
  (1): BatchNorm(8, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)
  (2): ReLU()
  (3): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)
  (4): Dropout(p=0.25, inplace=False)
  (5): Flatten(start_dim=1, end_dim=-1)
  (6): Linear(in_features=128, out_features=10, bias=False)
)"
    );
}

#[test]
fn every_layer_prints_its_settings() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let v = rt.vars();
    let cases: Vec<(String, &str)> = vec![
        (
            Conv::conv1d(&v.pp("a"), 2, 4, 5, ConvConfig::new(2, 0))
                .unwrap()
                .to_string(),
            "Conv1d(2, 4, kernel_size=(5,), stride=(2,))",
        ),
        (
            ConvTranspose::new(&v.pp("b"), 4, 2, &[2, 2, 2], ConvConfig::new(2, 1))
                .unwrap()
                .to_string(),
            "ConvTranspose3d(4, 2, kernel_size=(2, 2, 2), stride=(2, 2, 2), padding=(1, 1, 1))",
        ),
        (
            AvgPool::new(&[2, 3])
                .unwrap()
                .padding(1)
                .unwrap()
                .to_string(),
            "AvgPool2d(kernel_size=(2, 3), stride=(2, 3), padding=1)",
        ),
        (
            LayerNorm::with_eps(&v.pp("c"), 16, 1e-6)
                .unwrap()
                .to_string(),
            "LayerNorm((16,), eps=1e-06, elementwise_affine=True)",
        ),
        (
            RmsNorm::new(&v.pp("r"), 16).unwrap().to_string(),
            "RMSNorm((16,), eps=None, elementwise_affine=True)",
        ),
        (
            RmsNorm::with_eps(&v.pp("r2"), 8, 1e-6).unwrap().to_string(),
            "RMSNorm((8,), eps=1e-06, elementwise_affine=True)",
        ),
        (
            GroupNorm::new(&v.pp("gn"), 4, 8).unwrap().to_string(),
            "GroupNorm(4, 8, eps=1e-05, affine=True)",
        ),
        (
            Embedding::new(&v.pp("d"), 65, 32).unwrap().to_string(),
            "Embedding(65, 32)",
        ),
        (
            MultiHeadAttention::new(&v.pp("e"), 8, 2, true)
                .unwrap()
                .to_string(),
            "MultiHeadAttention(embed_dim=8, num_heads=2, bias=False, causal=True)",
        ),
        (
            SpectralConv1d::new(&v.pp("f"), 4, 3).unwrap().to_string(),
            "SpectralConv1d(width=4, modes=3)",
        ),
        (Activation::Gelu.to_string(), "GELU(approximate='tanh')"),
        (Activation::Silu.to_string(), "SiLU()"),
        (Activation::Softplus.to_string(), "Softplus()"),
        (Activation::Sigmoid.to_string(), "Sigmoid()"),
        (Activation::Tanh.to_string(), "Tanh()"),
        (
            Sequential::<tl_session::Session<f64>>::new().to_string(),
            "Sequential()",
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}

/// A derived model: a layer, a list of derived blocks, an absent and a present option, a
/// bare parameter and a nested Sequential.
#[derive(Parameters)]
struct Tiny<O: Train> {
    embed: Embedding,
    blocks: Vec<Block>,
    skip: Option<Linear>,
    norm: Option<LayerNorm>,
    gain: Param,
    head: Sequential<O>,
}

#[derive(Parameters)]
struct Block {
    attn: MultiHeadAttention,
    ff: Linear,
}

fn tiny<O: Train>(rt: &Runtime<O>) -> Tiny<O> {
    let v = rt.vars();
    Tiny {
        embed: Embedding::new(&v.pp("tok"), 10, 8).unwrap(),
        blocks: (0..2)
            .map(|i| {
                let b = v.pp("blocks").pp(i);
                Block {
                    attn: MultiHeadAttention::new(&b.pp("attn"), 8, 2, true).unwrap(),
                    ff: Linear::new(&b.pp("ff"), 8, 8).unwrap(),
                }
            })
            .collect(),
        skip: None,
        norm: Some(LayerNorm::new(&v.pp("norm"), 8).unwrap()),
        gain: v.param("gain", &[8], tl_nn::Init::Ones).unwrap(),
        head: Sequential::new()
            .add(Activation::Relu)
            .add(Linear::new(&v.pp("head").pp(1), 8, 10).unwrap()),
    }
}

#[test]
fn a_derived_model_prints_its_fields_as_children() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let model = tiny(&rt);
    assert_eq!(
        tree(&model).to_string(),
        "Tiny(
  (embed): Embedding(10, 8)
  (blocks): Vec(
    (0): Block(
      (attn): MultiHeadAttention(embed_dim=8, num_heads=2, bias=False, causal=True)
      (ff): Linear(in_features=8, out_features=8, bias=True)
    )
    (1): Block(
      (attn): MultiHeadAttention(embed_dim=8, num_heads=2, bias=False, causal=True)
      (ff): Linear(in_features=8, out_features=8, bias=True)
    )
  )
  (skip): None
  (norm): LayerNorm((8,), eps=1e-05, elementwise_affine=True)
  (gain): Parameter([8])
  (head): Sequential(
    (0): ReLU()
    (1): Linear(in_features=8, out_features=10, bias=True)
  )
)"
    );
}

#[test]
fn the_summary_lists_each_layer_and_its_counts_add_up_to_num_params() {
    let mut rt = eager::<f64>(Backend::Cpu, 0);
    let model = tiny(&rt);
    let s = rt.summary(&model).unwrap();
    let paths: Vec<(&str, &str, usize)> = s
        .rows
        .iter()
        .map(|r| (r.path.as_str(), r.module.as_str(), r.count))
        .collect();
    assert_eq!(
        paths,
        [
            ("embed", "Embedding", 80),
            ("blocks.0.attn", "MultiHeadAttention", 256),
            ("blocks.0.ff", "Linear", 72),
            ("blocks.1.attn", "MultiHeadAttention", 256),
            ("blocks.1.ff", "Linear", 72),
            ("norm", "LayerNorm", 16),
            ("gain", "Parameter", 8),
            ("head.0", "ReLU", 0),
            ("head.1", "Linear", 90),
        ]
    );
    assert_eq!(
        s.rows[2].params,
        [
            ("blocks.0.ff.weight".to_owned(), vec![8, 8]),
            ("blocks.0.ff.bias".to_owned(), vec![8])
        ]
    );
    let n = rt.num_params(&model).unwrap();
    assert_eq!(n, 80 + 2 * (256 + 72) + 16 + 8 + 90);
    assert_eq!((s.total, s.trainable), (n, n));
    // Frozen layers stay in the total, not in the trainable count.
    rt.set_trainable(&model, "blocks.", false).unwrap();
    let s = rt.summary(&model).unwrap();
    assert_eq!(s.total, n);
    assert_eq!(s.trainable, n - 2 * (256 + 72));
    assert_eq!(s.trainable, rt.num_params(&model).unwrap());
}

#[test]
fn the_summary_table_of_a_cnn_counts_buffers_apart() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let v = rt.vars();
    let cnn = Sequential::<tl_session::Session<f32>>::new()
        .add(Conv::conv2d(&v.pp(0), 1, 4, 3, ConvConfig::padded(1)).unwrap())
        .add(BatchNorm::new(&v.pp(1), 4).unwrap())
        .add(Activation::Relu)
        .add(Flatten)
        .add(Linear::new(&v.pp(4), 256, 10).unwrap());
    let s = rt.summary(&cnn).unwrap();
    assert_eq!(s.total, rt.num_params(&cnn).unwrap());
    assert_eq!(
        s.to_string(),
        "layer  type       parameters                                               count
0      Conv2d     weight [4, 1, 3, 3], bias [4]                               40
1      BatchNorm  weight [4], bias [4], running_mean [4], running_var [4]      8
2      ReLU                                                                    0
3      Flatten                                                                 0
4      Linear     weight [10, 256], bias [10]                              2,570
total params: 2,618
trainable params: 2,618
non-trainable params: 0
buffer values: 8"
    );
    // A single layer is one row, at the model's own path.
    let lin = Linear::new(&v.pp("solo"), 3, 2).unwrap();
    let s = rt.summary(&lin).unwrap();
    assert_eq!(s.rows.len(), 1);
    assert_eq!((s.rows[0].path.as_str(), s.total), ("", 8));
    assert!(
        s.to_string().starts_with("layer  type    parameters"),
        "{s}"
    );
}

/// A hand-written model that names only some children still sums up: the parameters it lists
/// beyond its children's get a row of their own.
struct Partial {
    body: Linear,
    extra: Linear,
}

impl Parameters for Partial {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.body.visit_params(f);
        self.extra.visit_params(f);
    }
    fn visit_children(&self, f: &mut dyn FnMut(&str, &dyn Parameters)) {
        f("body", &self.body);
    }
}

#[test]
fn parameters_outside_the_named_children_get_their_own_row() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let m = Partial {
        body: Linear::new(&rt.vars().pp("body"), 2, 2).unwrap(),
        extra: Linear::new(&rt.vars().pp("extra"), 2, 3).unwrap(),
    };
    let s = rt.summary(&m).unwrap();
    let rows: Vec<(&str, &str, usize)> = s
        .rows
        .iter()
        .map(|r| (r.path.as_str(), r.module.as_str(), r.count))
        .collect();
    assert_eq!(rows, [("", "Partial", 9), ("body", "Linear", 6)]);
    assert_eq!(s.total, rt.num_params(&m).unwrap());
    assert_eq!(
        tree(&m).to_string(),
        "Partial(\n  (body): Linear(in_features=2, out_features=2, bias=True)\n)"
    );
}
