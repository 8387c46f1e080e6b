//! Errors a model author meets: a layer's forward error names the layer's path and says how to
//! fix the usual mistake, no message repeats its prefix, and `?` converts every error type in
//! a function returning `tl_nn::Result`.

use tl_nn::{
    BatchNorm, Conv, ConvConfig, ConvTranspose, Embedding, Error, LayerNorm, Linear, Module,
    MultiHeadAttention, Parameters, Result, Runtime, SpectralConv1d, Var,
};
use tl_session::{Backend, Train};
use tl_spec::Tensor;

use crate::{eager, linked};

/// The error message of one forward pass of `layer` on an input of `dims`.
fn forward_error<O: Train<T = f64>, M: Module<O>>(
    rt: &Runtime<O>,
    layer: &M,
    dims: &[usize],
) -> Error {
    rt.eval(layer, |g| layer.forward(&g.input(Tensor::zeros(dims))?))
        .expect_err("the input does not fit the layer")
}

#[test]
fn a_linear_error_names_the_layer_path_and_the_feature_counts() {
    for linked_session in [false, true] {
        let msg = if linked_session {
            linear_error(&linked::<f64>(0))
        } else {
            linear_error(&eager::<f64>(Backend::Cpu, 0))
        };
        assert_eq!(
            msg,
            r#"Linear "blocks.0.mlp.up": input [4, 16] has 16 features, expected 32"#
        );
    }
    let rt = eager::<f64>(Backend::Cpu, 0);
    let head = Linear::new(&rt.vars().pp("head"), 64, 10).unwrap();
    // An image batch given to a linear layer: flatten it first.
    let e = forward_error(&rt, &head, &[2, 1, 8, 8]).to_string();
    assert_eq!(
        e,
        r#"Linear "head": input [2, 1, 8, 8] has 8 features, expected 64; flatten it to (2, 64) first (a Flatten layer, or x.flatten_batch())"#
    );
    let e = forward_error(&rt, &head, &[]).to_string();
    assert!(
        e.starts_with(r#"Linear "head": input [] is a scalar"#),
        "{e}"
    );
    // A layer made at the root of the namespace is named by its type alone.
    let root = Linear::new(&rt.vars(), 3, 2).unwrap();
    assert!(matches!(
        forward_error(&rt, &root, &[1, 4]),
        Error::Input { layer, .. } if layer == "Linear"
    ));
}

fn linear_error<O: Train<T = f64>>(rt: &Runtime<O>) -> String {
    let up = Linear::new(&rt.vars().pp("blocks").pp(0).pp("mlp").pp("up"), 32, 128).unwrap();
    forward_error(rt, &up, &[4, 16]).to_string()
}

#[test]
fn a_flat_input_to_a_conv_says_how_to_shape_it() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let conv = Conv::conv2d(&rt.vars().pp(0), 1, 8, 3, ConvConfig::padded(1)).unwrap();
    assert_eq!(
        forward_error(&rt, &conv, &[32, 64]).to_string(),
        r#"Conv2d "0": input [32, 64] is flat: a 2-D convolution takes (N, 1, H, W) or (1, H, W); reshape it: x.reshape(&[32, 1, 8, 8]) (the digits: Split::shaped(&[1, 8, 8]))"#
    );
    // A batch of one-channel images without the channel axis.
    assert_eq!(
        forward_error(&rt, &conv, &[32, 8, 8]).to_string(),
        r#"Conv2d "0": input [32, 8, 8] has 32 channels at axis 0, expected 1: a 2-D convolution takes (N, 1, H, W) or (1, H, W); for a batch of 32 one-channel samples add the channel axis: x.reshape(&[32, 1, 8, 8])"#
    );
    // Three channels of 4×4 in a row, and a width that is no square.
    let rgb = Conv::conv2d(&rt.vars().pp("rgb"), 3, 4, 3, ConvConfig::default()).unwrap();
    let e = forward_error(&rt, &rgb, &[2, 48]).to_string();
    assert!(e.ends_with("reshape it: x.reshape(&[2, 3, 4, 4])"), "{e}");
    let e = forward_error(&rt, &rgb, &[2, 30]).to_string();
    assert!(
        e.ends_with("reshape each sample of 30 values to (3, H, W)"),
        "{e}"
    );
    // Channels that do not match, and too many axes.
    let e = forward_error(&rt, &rgb, &[2, 4, 8, 8]).to_string();
    assert!(
        e.starts_with(r#"Conv2d "rgb": input [2, 4, 8, 8] has 4 channels at axis 1, expected 3"#),
        "{e}"
    );
    let e = forward_error(&rt, &rgb, &[1, 2, 3, 8, 8]).to_string();
    assert!(e.contains("has too many axes"), "{e}");
    // 1-D and transposed convolutions name their own type.
    let c1 = Conv::conv1d(&rt.vars().pp("c1"), 2, 2, 3, ConvConfig::default()).unwrap();
    let e = forward_error(&rt, &c1, &[10]).to_string();
    assert_eq!(
        e,
        r#"Conv1d "c1": input [10] is flat: a 1-D convolution takes (N, 2, L) or (2, L); reshape it: x.reshape(&[1, 2, 5])"#
    );
    let ct = ConvTranspose::new(&rt.vars().pp("up"), 4, 2, &[2, 2], ConvConfig::new(2, 0)).unwrap();
    let e = forward_error(&rt, &ct, &[1, 3, 4, 4]).to_string();
    assert!(
        e.starts_with(
            r#"ConvTranspose2d "up": input [1, 3, 4, 4] has 3 channels at axis 1, expected 4"#
        ),
        "{e}"
    );
}

#[test]
fn an_op_error_inside_a_layer_names_the_layer_once_and_the_op_once() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    // A 5×5 kernel over a 3×3 image: the op's own shape rule refuses it.
    let conv = Conv::conv2d(
        &rt.vars().pp("features").pp(0),
        1,
        2,
        5,
        ConvConfig::default(),
    )
    .unwrap();
    let e = forward_error(&rt, &conv, &[1, 1, 3, 3]);
    let msg = e.to_string();
    assert!(matches!(e, Error::Layer { .. }), "{e:?}");
    assert!(msg.starts_with(r#"Conv2d "features.0": conv: "#), "{msg}");
    assert!(!msg.contains("conv: conv:"), "{msg}");
    // The same op through the session directly names it once too.
    let mut s = tl_session::Session::<f64>::new(tl_session::Options::default()).unwrap();
    use tl_session::Ops;
    let w = s.input(Tensor::zeros([2, 1, 5, 5]), false).unwrap();
    let b = s.input(Tensor::zeros([2]), false).unwrap();
    let x = s.input(Tensor::zeros([1, 1, 3, 3]), false).unwrap();
    let msg = s
        .conv(&w, &b, &x, vec![1, 1], vec![0, 0])
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("conv: ") && !msg.contains("conv: conv:"),
        "{msg}"
    );
    // A method whose name differs from the op's keeps both.
    let msg = s
        .broadcast_to(&b, tl_spec::Shape::new(&[3]))
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("broadcast_to: broadcastTo"), "{msg}");
}

#[test]
fn every_layer_names_its_path_in_a_forward_error() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let v = rt.vars().pp("m");
    let ln = LayerNorm::new(&v.pp("ln"), 8).unwrap();
    let bn = BatchNorm::new(&v.pp("bn"), 3).unwrap();
    let attn = MultiHeadAttention::new(&v.pp("attn"), 8, 2, true).unwrap();
    let spec = SpectralConv1d::new(&v.pp("spec"), 4, 2).unwrap();
    let emb = Embedding::new(&v.pp("tok"), 5, 2).unwrap();
    let cases: Vec<(Error, &str)> = vec![
        (
            forward_error(&rt, &ln, &[2, 6]),
            r#"LayerNorm "m.ln": input [2, 6] has 6 features in its last axis, expected 8"#,
        ),
        (
            forward_error(&rt, &bn, &[2, 4, 5]),
            r#"BatchNorm "m.bn": input [2, 4, 5] must be (N, 3, …): batch, then 3 channels (it has 4 at axis 1)"#,
        ),
        (
            forward_error(&rt, &attn, &[2, 3, 6]),
            r#"MultiHeadAttention "m.attn": input [2, 3, 6] must be (n, 8) or (B, n, 8): tokens of width 8"#,
        ),
        (
            forward_error(&rt, &spec, &[2, 8, 3]),
            r#"SpectralConv1d "m.spec": input [2, 8, 3] must be (grid, 4) or (B, grid, 4): channels last"#,
        ),
        (
            rt.eval(&emb, |g| emb.forward(g, &[1, 5])).unwrap_err(),
            r#"Embedding "m.tok": id 5 at position 1 is out of range for a table of 5 rows (num_embeddings 5)"#,
        ),
    ];
    for (e, want) in cases {
        assert!(matches!(e, Error::Input { .. }), "{e:?}");
        assert_eq!(e.to_string(), want);
    }
    // An op error the layer does not check first: spectral modes beyond the grid.
    let e = forward_error(&rt, &spec, &[1, 1, 4]).to_string();
    assert!(
        e.starts_with(r#"SpectralConv1d "m.spec": spectral_conv1d_rfft: spectralConv1dRfft"#),
        "{e}"
    );
    assert!(e.contains("modes must lie in 1..=1 for grid 1"), "{e}");
}

/// The pools' forward errors name the layer (`MaxPool2d: …`), as a convolution's do: an input
/// of the wrong rank is an input error saying what the layer takes, and the op's own refusal
/// (a window larger than the input) keeps the op's message after the layer's name.
#[test]
fn a_pool_forward_error_names_the_layer() {
    use tl_nn::{AdaptiveAvgPool, AvgPool, MaxPool};
    let rt = eager::<f64>(Backend::Cpu, 0);
    let max = MaxPool::new(&[2, 2]).unwrap();
    let avg = AvgPool::new(&[3]).unwrap();
    let adaptive = AdaptiveAvgPool::new(&[2, 2]).unwrap();
    let e = forward_error(&rt, &max, &[2, 8]);
    assert!(matches!(e, Error::Input { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "MaxPool2d: input [2, 8] has 2 axes: a pool with 2 spatial axes takes (C, spatial…) or (N, C, spatial…), 3 or 4 axes"
    );
    let e = forward_error(&rt, &avg, &[1, 2, 3, 4]);
    assert!(
        e.to_string()
            .starts_with("AvgPool1d: input [1, 2, 3, 4] has 4 axes"),
        "{e}"
    );
    // A 2×2 window over a 1×1 image: the op refuses it, named after the layer.
    let e = forward_error(&rt, &max, &[1, 3, 1, 1]);
    let msg = e.to_string();
    assert!(matches!(e, Error::Layer { .. }), "{e:?}");
    assert!(msg.starts_with("MaxPool2d: max_pool: maxPool: "), "{msg}");
    assert!(
        msg.contains("kernel [2, 2]") && msg.contains("[1, 3, 1, 1]"),
        "{msg}"
    );
    let msg = forward_error(&rt, &avg, &[2, 2]).to_string();
    assert!(msg.starts_with("AvgPool1d: avg_pool: avgPool: "), "{msg}");
    let e = forward_error(&rt, &adaptive, &[4]);
    assert!(matches!(e, Error::Input { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "AdaptiveAvgPool2d: x must be (C, spatial…) or (N, C, spatial…) with 2 spatial axes, got [4]"
    );
    let msg = forward_error(&rt, &adaptive, &[1, 0, 3]).to_string();
    assert_eq!(
        msg,
        "AdaptiveAvgPool2d: spatial axis 1 of x [1, 0, 3] is empty"
    );
}

/// A pool's window is checked as it is built: a kernel size of 0, too many axes, a stride of 0
/// and padding above half the kernel (PyTorch's rule) are errors naming the layer, the setting
/// and the value, before any forward pass.
#[test]
fn a_pool_refuses_a_bad_setting_as_it_is_built() {
    use tl_nn::{AvgPool, MaxPool};
    let err = |r: Result<MaxPool>| r.expect_err("a bad setting").to_string();
    assert_eq!(
        err(MaxPool::new(&[2, 2]).unwrap().stride(0)),
        "MaxPool::stride: stride [0, 0] has a zero entry"
    );
    assert_eq!(
        err(MaxPool::new(&[2, 3]).unwrap().padding(2)),
        "MaxPool::padding: padding [2, 2] exceeds half the kernel [2, 3] along spatial axis 0 (PyTorch's rule: 2·padding ≤ kernel)"
    );
    let e = err(MaxPool::new(&[2]).unwrap().padding(usize::MAX));
    assert!(e.contains(&format!("padding [{}]", usize::MAX)), "{e}");
    assert_eq!(
        err(MaxPool::new(&[2, 0])),
        "MaxPool::new: kernel [2, 0] has a zero dim"
    );
    let e = err(MaxPool::new(&[1; 9]));
    assert_eq!(
        e,
        "MaxPool::new: spatial rank 9 (kernel [1, 1, 1, 1, 1, 1, 1, 1, 1]) is outside 1..=8"
    );
    let e = AvgPool::new(&[3])
        .unwrap()
        .stride(0)
        .unwrap_err()
        .to_string();
    assert!(e == "AvgPool::stride: stride [0] has a zero entry", "{e}");
    let e = AvgPool::new(&[3])
        .unwrap()
        .padding(2)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("AvgPool::padding: padding [2] exceeds half the kernel [3]"),
        "{e}"
    );
    // The largest padding PyTorch allows, and any stride ≥ 1, are accepted in either order.
    let p = MaxPool::new(&[4, 5])
        .unwrap()
        .padding(2)
        .unwrap()
        .stride(7)
        .unwrap();
    assert_eq!(
        p.to_string(),
        "MaxPool2d(kernel_size=(4, 5), stride=7, padding=2, dilation=1, ceil_mode=False)"
    );
}

/// A custom layer in a model, to show `?` on a layer's result inside a user's forward.
#[derive(Parameters)]
struct Two {
    a: Linear,
    b: Linear,
}

impl<O: Train> Module<O> for Two {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        self.b.forward(&self.a.forward(x)?)
    }
}

/// Fails at the `which`-th `?`, each on another error type.
fn fails(which: usize) -> Result<()> {
    match which {
        0 => {
            Tensor::<f64>::new([2], vec![1.0])?;
        }
        1 => {
            tl_session::Optimizer::adam(-1.0)?;
        }
        2 => Err(tl_ir::Error::UnknownId {
            op: "eval",
            id: 9,
            len: 2,
        })?,
        3 => {
            tl_tape_cpu::Tape::<f64>::new().value(7, &tl_spec::Shape::scalar())?;
        }
        4 => Err(tl_tape_cuda::Error::NoDevice {
            detail: "none here".into(),
        })?,
        5 => {
            std::fs::read("/nonexistent/tl-nn/file")?;
        }
        6 => {
            "twelve".parse::<usize>()?;
        }
        7 => {
            "x1.5".parse::<f64>()?;
        }
        8 => {
            u8::try_from(300usize)?;
        }
        9 => {
            let bytes: Vec<u8> = vec![0xff, 0xfe];
            std::str::from_utf8(&bytes)?;
        }
        10 => {
            String::from_utf8(vec![0xff])?;
        }
        11 => Err(std::fmt::Error)?,
        12 => {
            safetensors::SafeTensors::deserialize(&[1, 2, 3])?;
        }
        13 => Err(Box::<dyn std::error::Error + Send + Sync>::from(
            "my own error",
        ))?,
        14 => {
            let rt = eager::<f64>(Backend::Cpu, 0);
            let v = rt.vars();
            let two = Two {
                a: Linear::new(&v.pp("a"), 3, 4)?,
                b: Linear::new(&v.pp("b"), 5, 2)?,
            };
            rt.eval(&two, |g| two.forward(&g.input(Tensor::zeros([1, 3]))?))?;
        }
        _ => {}
    }
    Ok(())
}

/// Whether an error is of the expected variant.
type Variant = fn(&Error) -> bool;

#[test]
fn question_mark_converts_every_error_a_model_author_meets() {
    let expect: [(&str, Variant); 15] = [
        ("tensor:", |e| matches!(e, Error::Spec(_))),
        ("optimizer adam", |e| matches!(e, Error::Session(_))),
        ("eval: unknown id 9", |e| matches!(e, Error::Session(_))),
        ("unknown id 7", |e| matches!(e, Error::Session(_))),
        ("no CUDA device: none here", |e| {
            matches!(e, Error::Session(_))
        }),
        ("No such file", |e| matches!(e, Error::Other(_))),
        ("invalid digit", |e| matches!(e, Error::Other(_))),
        ("invalid float", |e| matches!(e, Error::Other(_))),
        ("out of range", |e| matches!(e, Error::Other(_))),
        ("invalid utf-8", |e| matches!(e, Error::Other(_))),
        ("invalid utf-8", |e| matches!(e, Error::Other(_))),
        ("error", |e| matches!(e, Error::Other(_))),
        ("", |e| matches!(e, Error::Other(_))),
        ("my own error", |e| matches!(e, Error::Other(_))),
        (
            r#"Linear "b": input [1, 4] has 4 features, expected 5"#,
            |e| matches!(e, Error::Input { .. }),
        ),
    ];
    for (i, (text, variant)) in expect.iter().enumerate() {
        let e = fails(i).expect_err("each case fails");
        let msg = e.to_string();
        assert!(msg.contains(text), "case {i}: {msg:?} lacks {text:?}");
        assert!(variant(&e), "case {i}: {e:?}");
    }
    // The boxed error is the original: it can be taken back out.
    match fails(5).unwrap_err() {
        Error::Other(b) => {
            let io = b.downcast_ref::<std::io::Error>().expect("an io::Error");
            assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        }
        e => panic!("{e:?}"),
    }
    fails(99).unwrap();
}
