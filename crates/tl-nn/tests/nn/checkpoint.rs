//! Checkpoints: PyTorch state_dicts load and give PyTorch's logits; save/load round trips with
//! optimizer state; every bad file is one clear error naming the tensor and changes nothing.

use std::path::{Path, PathBuf};

use tl_nn::checkpoint::{self, Entry};
use tl_nn::{
    Activation, BatchNorm, Conv, ConvConfig, Flatten, Labels, Linear, MaxPool, Module, Runtime,
    Sequential,
};
use tl_session::{Backend, Optimizer, Train};
use tl_spec::Tensor;

use crate::{eager, linked, max_diff, mlp, tensor};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn expected(name: &str) -> (Tensor<f32>, Tensor<f64>) {
    let f = checkpoint::read(&fixture(&format!("{name}_expected.safetensors"))).unwrap();
    let p = fixture(name);
    (
        f.tensors["input"].to_tensor(&p, "input").unwrap(),
        f.tensors["logits"].to_tensor(&p, "logits").unwrap(),
    )
}

/// A file path `name` in a fresh directory of its own, removed with what it holds when the
/// value is dropped (at the end of the test, passed or failed).
struct Tmp {
    dir: PathBuf,
    path: PathBuf,
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl std::ops::Deref for Tmp {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Tmp {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

fn tmp(name: &str) -> Tmp {
    let dir = std::env::temp_dir().join(format!("tl-nn-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Tmp {
        path: dir.join(name),
        dir,
    }
}

/// PyTorch's `nn.Sequential(Conv2d(1,3,3,padding=1), BatchNorm2d(3), ReLU(), MaxPool2d(2),
/// Flatten(), Linear(27,4))`, names by position.
fn cnn<O: Train>(rt: &Runtime<O>) -> Sequential<O> {
    let v = rt.vars();
    let same = ConvConfig {
        stride: 1,
        padding: 1,
    };
    Sequential::new()
        .add(Conv::conv2d(&v.pp(0), 1, 3, 3, same).unwrap())
        .add(BatchNorm::new(&v.pp(1), 3).unwrap())
        .add(Activation::Relu)
        .add(MaxPool::new(&[2, 2]).unwrap())
        .add(Flatten)
        .add(Linear::new(&v.pp(5), 27, 4).unwrap())
}

#[test]
fn pytorch_state_dicts_load_and_give_pytorchs_logits() {
    fn check_mlp<O: Train<T = f32>>(mut rt: Runtime<O>) {
        let m = mlp(&rt, 6, 8, 3);
        rt.load(&m, fixture("mlp.safetensors")).unwrap();
        let (x, want) = expected("mlp");
        let got = rt.eval(&m, |g| m.forward(&g.input(x.clone())?)).unwrap();
        assert!(
            max_diff(&got, &want) < 1e-5,
            "mlp: {:?} vs {:?}",
            got.data(),
            want.data()
        );
    }
    fn check_cnn<O: Train<T = f32>>(mut rt: Runtime<O>) {
        let c = cnn(&rt);
        // PyTorch's num_batches_tracked (int64) is in the file and skipped.
        rt.load(&c, fixture("cnn.safetensors")).unwrap();
        let (x, want) = expected("cnn");
        let got = rt.eval(&c, |g| c.forward(&g.input(x.clone())?)).unwrap();
        assert!(
            max_diff(&got, &want) < 1e-5,
            "cnn: {:?} vs {:?}",
            got.data(),
            want.data()
        );
    }
    check_mlp(eager::<f32>(Backend::Cpu, 0));
    check_mlp(eager::<f32>(Backend::CudaSim, 0));
    check_mlp(linked::<f32>(0));
    check_cnn(eager::<f32>(Backend::Cpu, 0));
    check_cnn(eager::<f32>(Backend::CudaSim, 0));
    check_cnn(linked::<f32>(0));
}

#[test]
fn save_then_load_restores_parameters_and_optimizer_state() {
    let mut rt = eager::<f64>(Backend::Cpu, 1);
    let m = mlp(&rt, 4, 5, 3);
    let x = tensor::<f64>(&[6, 4], 2);
    let labels = Labels::new(vec![0, 1, 2, 0, 1, 2], 3).unwrap();
    let mut opt = Optimizer::adam(0.05).unwrap();
    let step = |rt: &mut Runtime<_>, opt: &mut Optimizer| {
        rt.step(&m, opt, |g| {
            m.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
        })
        .unwrap()
    };
    step(&mut rt, &mut opt);
    let path = tmp("roundtrip.safetensors");
    let meta = [("epoch".to_string(), "1".to_string())].into();
    rt.save_with(&m, &path, Some(&opt), &meta).unwrap();
    let saved = rt.state_dict(&m).unwrap();
    // Continue uninterrupted for a reference trajectory.
    let reference: Vec<f64> = (0..3).map(|_| step(&mut rt, &mut opt)).collect();

    // A fresh runtime with another seed, loaded from the file, continues identically.
    let mut rt2 = eager::<f64>(Backend::Cpu, 99);
    let m2 = mlp(&rt2, 4, 5, 3);
    let mut opt2 = Optimizer::adam(0.05).unwrap();
    let got_meta = rt2.load_with(&m2, &path, Some(&mut opt2)).unwrap();
    assert_eq!(got_meta["epoch"], "1");
    assert_eq!(got_meta["format"], checkpoint::FORMAT);
    assert_eq!(rt2.state_dict(&m2).unwrap(), saved);
    let resumed: Vec<f64> = (0..3)
        .map(|_| {
            rt2.step(&m2, &mut opt2, |g| {
                m2.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
            })
            .unwrap()
        })
        .collect();
    assert_eq!(resumed, reference, "Adam's moments must come back too");
}

/// A model with dropout resumes bit for bit: the file keeps the session's random counter
/// (`checkpoint::RANDOM_COUNTER`) and `load_with` restores it with the optimizer's state, so the
/// resumed steps draw the masks the uninterrupted run draws (eager and linked, the same seed).
/// Without the counter (a file from before it, or the counter edited) the masks, and so the
/// parameters, differ. A counter that is not a whole number is an error that changes nothing.
#[test]
fn a_dropout_model_resumes_bit_for_bit_with_the_random_counter() {
    fn model<O: Train>(rt: &Runtime<O>) -> Sequential<O> {
        let v = rt.vars();
        Sequential::new()
            .add(Linear::new(&v.pp("0"), 4, 8).unwrap())
            .add(Activation::Relu)
            .add(tl_nn::Dropout::new(0.3).unwrap())
            .add(Linear::new(&v.pp("3"), 8, 3).unwrap())
    }
    fn check<O: Train>(name: &str, make: impl Fn() -> Runtime<O>) {
        let x = tensor::<f64>(&[6, 4], 2).cast::<O::T>();
        let labels = Labels::new(vec![0, 1, 2, 0, 1, 2], 3).unwrap();
        let step = |rt: &mut Runtime<O>, m: &Sequential<O>, opt: &mut Optimizer| {
            rt.step(m, opt, |g| {
                m.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
            })
            .unwrap()
        };
        let mut rt = make();
        let m = model(&rt);
        let mut opt = Optimizer::adamw(0.05).unwrap();
        for _ in 0..3 {
            step(&mut rt, &m, &mut opt);
        }
        let path = tmp(&format!("dropout-{name}.safetensors"));
        rt.save_with(&m, &path, Some(&opt), &Default::default())
            .unwrap();
        let reference: Vec<f64> = (0..4).map(|_| step(&mut rt, &m, &mut opt)).collect();
        let want = rt.state_dict(&m).unwrap();
        let resume = |file: &Path| {
            let mut rt2 = make();
            let m2 = model(&rt2);
            let mut opt2 = Optimizer::adamw(0.05).unwrap();
            rt2.load_with(&m2, file, Some(&mut opt2)).unwrap();
            let losses: Vec<f64> = (0..4).map(|_| step(&mut rt2, &m2, &mut opt2)).collect();
            (losses, rt2.state_dict(&m2).unwrap())
        };
        assert_eq!(resume(&path), (reference, want.clone()), "{name}: resumed");
        // The same file without the counter: the masks of steps 0.. again, other parameters.
        let mut file = checkpoint::read(&path).unwrap();
        file.metadata.remove(checkpoint::RANDOM_COUNTER);
        let stale = tmp(&format!("dropout-{name}-no-counter.safetensors"));
        checkpoint::write(&stale, &file).unwrap();
        assert_ne!(
            resume(&stale).1,
            want,
            "{name}: the counter made no difference"
        );
        // A counter that is not a number: one error naming it; nothing loaded.
        file.metadata
            .insert(checkpoint::RANDOM_COUNTER.into(), "-1".into());
        checkpoint::write(&stale, &file).unwrap();
        let mut rt3 = make();
        let m3 = model(&rt3);
        let before = (rt3.state_dict(&m3).unwrap(), rt3.session().random_counter());
        let e = rt3
            .load_with(&m3, &stale, Some(&mut Optimizer::adamw(0.05).unwrap()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(checkpoint::RANDOM_COUNTER) && e.contains("\"-1\""),
            "{e}"
        );
        let after = (rt3.state_dict(&m3).unwrap(), rt3.session().random_counter());
        assert_eq!(after, before, "{name}: a refused file changed the runtime");
    }
    check("eager", || eager::<f64>(Backend::Cpu, 5));
    check("eager-f32", || eager::<f32>(Backend::Cpu, 5));
    check("linked", || linked::<f64>(5));
}

/// Write `file` (a variation of a good checkpoint), try to load it into a fresh model, and
/// return the error; the model must be unchanged.
fn load_error(name: &str, edit: impl FnOnce(&mut checkpoint::File)) -> String {
    let mut rt = eager::<f32>(Backend::Cpu, 3);
    let m = mlp(&rt, 4, 5, 3);
    let good = tmp(&format!("good-{name}.safetensors"));
    rt.save(&m, &good).unwrap();
    let mut file = checkpoint::read(&good).unwrap();
    edit(&mut file);
    let bad = tmp(&format!("bad-{name}.safetensors"));
    checkpoint::write(&bad, &file).unwrap();
    // Move the model away from the file's values, so a partial load would show.
    for (_, p) in rt.named_params_of(&m) {
        rt.set_value(&p, Tensor::full(p.shape().clone(), 0.25))
            .unwrap();
    }
    let before = rt.state_dict(&m).unwrap();
    let err = rt.load(&m, &bad).unwrap_err().to_string();
    assert_eq!(
        rt.state_dict(&m).unwrap(),
        before,
        "{name}: the model changed"
    );
    err
}

#[test]
fn bad_checkpoints_are_one_clear_error_and_change_nothing() {
    let e = load_error("missing", |f| {
        f.tensors.remove("2.bias");
    });
    assert!(e.contains("missing tensor \"2.bias\""), "{e}");
    let e = load_error("extra", |f| {
        let b = f.tensors["2.bias"].clone();
        f.tensors.insert("3.bias".into(), b);
    });
    assert!(e.contains("unexpected tensor \"3.bias\""), "{e}");
    let e = load_error("shape", |f| {
        let w = f.tensors.get_mut("0.weight").unwrap();
        w.dims = vec![4, 5];
    });
    assert!(e.contains("\"0.weight\"") && e.contains("shape"), "{e}");
    let e = load_error("dtype", |f| {
        let b = f.tensors.get_mut("2.bias").unwrap();
        *b = Entry::from_tensor(&Tensor::<f64>::zeros([3]));
    });
    assert!(e.contains("\"2.bias\"") && e.contains("F64"), "{e}");
    // The missing tensor is checked after earlier good ones were decoded: still nothing loaded.
    let e = load_error("last-missing", |f| {
        f.tensors.remove("2.weight");
    });
    assert!(e.contains("2.weight"), "{e}");
}

#[test]
fn corrupt_files_are_errors() {
    let rt = eager::<f32>(Backend::Cpu, 3);
    let m = mlp(&rt, 4, 5, 3);
    let good = tmp("corrupt-src.safetensors");
    rt.save(&m, &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let mut rt = rt;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", bytes[..bytes.len() - 7].to_vec()),
        ("header-only", bytes[..12].to_vec()),
        ("empty", Vec::new()),
        ("huge-header", {
            let mut b = bytes.clone();
            b[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
            b
        }),
        ("not-json", {
            let mut b = bytes.clone();
            b[9] = b'#';
            b
        }),
    ];
    for (name, b) in cases {
        let p = tmp(&format!("corrupt-{name}.safetensors"));
        std::fs::write(&p, b).unwrap();
        let e = rt.load(&m, &p).unwrap_err().to_string();
        assert!(
            e.contains("checkpoint") && e.contains("safetensors"),
            "{name}: {e}"
        );
    }
    let e = rt.load(&m, tmp("does-not-exist.safetensors")).unwrap_err();
    assert!(e.to_string().contains("does-not-exist"), "{e}");
}

/// A safetensors file of one F32 scalar per header entry, all at bytes 0..4 (the header as
/// written, so it may name a tensor twice).
fn file_with_header(entries: &[&str]) -> Vec<u8> {
    let body: Vec<String> = entries
        .iter()
        .map(|name| format!(r#"{name}:{{"dtype":"F32","shape":[],"data_offsets":[0,4]}}"#))
        .collect();
    let header = format!("{{{}}}", body.join(", "));
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(&1.5f32.to_le_bytes());
    b
}

/// A JSON map parse keeps one of two entries of the same name: the file is refused, naming
/// the tensor, however the name is spelt (an escape decodes to the same name).
#[test]
fn a_header_naming_a_tensor_twice_is_refused() {
    let p = tmp("duplicate.safetensors");
    std::fs::write(&p, file_with_header(&[r#""w""#])).unwrap();
    let f = checkpoint::read(&p).unwrap();
    assert_eq!(f.tensors.len(), 1, "one name: read");
    for names in [[r#""w""#, r#""w""#], [r#""w""#, r#""\u0077""#]] {
        std::fs::write(&p, file_with_header(&names)).unwrap();
        let e = checkpoint::read(&p).unwrap_err().to_string();
        assert!(
            e.contains("\"w\"") && e.contains("more than once"),
            "{names:?}: {e}"
        );
    }
}

#[test]
fn a_failed_save_leaves_the_previous_file_intact() {
    let path = tmp("atomic.safetensors");
    std::fs::write(&path, b"previous").unwrap();
    let err = checkpoint::write_atomic_with(&path, |f| {
        use std::io::Write;
        f.write_all(b"half a file")?;
        Err(std::io::Error::other("disk full (injected)"))
    })
    .unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"previous");
    // No temporary file is left behind.
    let dir = path.parent().unwrap();
    let leftovers = std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".atomic.safetensors.tmp")
        })
        .count();
    assert_eq!(leftovers, 0);
    checkpoint::write_atomic(&path, b"new").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
}

#[test]
fn paths_that_are_not_regular_files_are_refused_before_they_are_opened() {
    let dir = tmp("not-a-file");
    // A directory where the checkpoint should be.
    std::fs::create_dir_all(&*dir).unwrap();
    let e = checkpoint::read(&dir).unwrap_err().to_string();
    assert!(
        e.contains("not a regular file") && e.contains("directory"),
        "{e}"
    );
    let e = checkpoint::write_atomic(&dir, b"x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a regular file"), "{e}");
    // A FIFO: reading it would block until a writer comes; it is refused at once.
    let fifo = dir.parent().unwrap().join("pipe.safetensors");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let e = checkpoint::read(&fifo).unwrap_err().to_string();
        assert!(
            e.contains("not a regular file") && e.contains("FIFO"),
            "{e}"
        );
        let mut rt = eager::<f32>(Backend::Cpu, 0);
        let model = mlp(&rt, 3, 4, 2);
        let e = rt.load(&model, &fifo).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
    }
}

#[test]
fn a_save_removes_the_temporary_files_a_killed_save_left() {
    let path = tmp("stale.safetensors");
    let dir = path.parent().unwrap().to_path_buf();
    // What a save killed mid-write leaves: a temp file of a process that no longer runs (no pid
    // reaches u32::MAX − 1), and one of this process, which is kept (a save may be running).
    let dead = dir.join(".stale.safetensors.tmp-4294967294-0");
    let ours = dir.join(format!(".stale.safetensors.tmp-{}-999", std::process::id()));
    let other = dir.join(".other.safetensors.tmp-4294967294-0");
    for f in [&dead, &ours, &other] {
        std::fs::write(f, b"half a file").unwrap();
    }
    checkpoint::write_atomic(&path, b"new").unwrap();
    assert_eq!(std::fs::read(&*path).unwrap(), b"new");
    assert!(!dead.exists(), "the dead process's temp file is removed");
    assert!(
        ours.exists() && other.exists(),
        "only this path's dead temp files go"
    );
}

/// Found by `fuzz::entries_whose_bytes_do_not_fit_their_dims_are_errors`: an `Entry` of 5 bytes
/// for a scalar F32 decoded to the scalar of its first 4 (the odd byte dropped). Now the bytes
/// must be exactly the dims' elements.
#[test]
fn an_entry_whose_bytes_do_not_fit_its_dims_is_an_error() {
    let path = Path::new("five-bytes.safetensors");
    for (dims, len) in [(vec![], 5), (vec![2], 9), (vec![2], 4), (vec![0], 1)] {
        let e = Entry {
            dtype: safetensors::Dtype::F32,
            dims: dims.clone(),
            bytes: vec![0; len],
        };
        let err = e.to_tensor::<f32>(path, "w").unwrap_err().to_string();
        assert!(
            err.contains("five-bytes.safetensors")
                && err.contains("\"w\"")
                && err.contains(&format!("holds {len} bytes")),
            "{dims:?} {len}: {err}"
        );
    }
}
