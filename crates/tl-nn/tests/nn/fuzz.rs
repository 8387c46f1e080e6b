//! Generated corruptions of valid inputs: every reader refuses them with an error, never a
//! panic, an abort, a hang or an allocation the input's size does not justify.
//!
//! [`checkpoint_corruptions_are_refused_or_load_consistently`] starts from a real checkpoint
//! (an MLP with Adam's state, saved by `Runtime::save_with`) and applies one generated
//! corruption: a truncation at any byte, 1–8 byte flips, the header length set to boundary and
//! absurd values, or an edit of the header's JSON (shapes with huge dims, dims whose product
//! overflows `usize`, empty tensors of absurd shape, negative, reversed, overlapping,
//! out-of-range or non-integer `data_offsets`, unknown and wrong dtypes, renamed, removed and
//! duplicated tensors, deeply nested JSON, non-UTF-8 bytes, non-string metadata). Then:
//!
//! - `checkpoint::read` returns. An `Err` names the file; an `Ok` is consistent: every
//!   entry holds exactly its dims' product times its dtype's size in bytes.
//! - `Runtime::load_with` (model and optimizer) returns. An `Err` names the file and leaves the
//!   model's parameters and the optimizer's state as they were; an `Ok` leaves each parameter
//!   equal to its tensor decoded from the file's bytes, and the optimizer's state equal to the
//!   file's `optimizer.*` tensors.
//! - Neither call allocates a single buffer larger than [`ALLOC_FACTOR`] times the file's size
//!   plus [`ALLOC_SLACK`] (a header claiming a 2⁴⁰-element tensor in a 1 KiB file is refused
//!   before anything that size is asked for).
//!
//! The allocation is measured with a counting global allocator (`peak_alloc`), which sees every
//! thread; so the cases run in a child process with one test thread:
//! [`checkpoint_corruptions_are_refused_or_load_consistently`] runs this binary again, filtered to
//! [`checkpoint_fuzz_cases`], and fails unless the child exits successfully within a time
//! limit (an abort or a hang fails it too). A panic in a case fails the child, and proptest
//! prints the shrunk input (keep it as a named test in `checkpoint.rs`).
//!
//! | variable | effect | default |
//! |---|---|---|
//! | `TL_CASES` | cases per property | 1000 (about 0.2 s for the checkpoint's in a debug build) |
//! | `TL_SEED` | the seed (the same seed and count give the same cases) | tl-conformance's |
//!
//! `cargo test -p tl-nn --test nn fuzz::` runs them all.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

use peak_alloc::PeakAlloc;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use tl_conformance::RunConfig;
use tl_nn::Runtime;
use tl_nn::checkpoint::{self, Entry};
use tl_nn::data::Vocab;
use tl_session::{Backend, Optimizer, Session};
use tl_spec::{Shape, Tensor};

use crate::{eager, mlp, tensor};

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// Outcomes of the cases so far: files read, files loaded.
static READ_OK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static LOAD_OK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static RAN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The most bytes a read or load of one case held at once above its file's size.
static MAX_OVER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Set in the child process: only there does [`checkpoint_fuzz_cases`] run its cases.
const CHILD_VAR: &str = "TL_NN_FUZZ_IN_CHILD";
/// The largest single allocation a read may make, as a multiple of the file's size.
const ALLOC_FACTOR: usize = 4;
/// Plus this much (the runtime's own bookkeeping, error messages).
const ALLOC_SLACK: usize = 64 << 10;

/// Cases per property: `TL_CASES`, else 1000; `TL_SEED` picks the stream (tl-conformance's
/// [`RunConfig`]: the same seed and count give the same cases).
fn run_config() -> RunConfig {
    RunConfig::from_env_or(1000)
}

fn cases() -> u32 {
    run_config().cases
}

/// A fresh directory of this process for the fuzz files.
fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("tl-nn-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One tensor of a file, as the header describes it (JSON values, so they can be made wrong).
#[derive(Debug, Clone)]
struct Tensor0 {
    name: String,
    dtype: Value,
    shape: Value,
    data: Vec<u8>,
}

/// A safetensors file taken apart: its tensors in file order and its metadata.
#[derive(Debug, Clone)]
struct Layout {
    tensors: Vec<Tensor0>,
    metadata: Value,
}

impl Layout {
    /// The layout of a valid file.
    fn of(bytes: &[u8]) -> Layout {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Map<String, Value> =
            serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let data = &bytes[8 + n..];
        let mut tensors: Vec<(u64, Tensor0)> = Vec::new();
        let mut metadata = Value::Null;
        for (name, v) in header {
            if name == "__metadata__" {
                metadata = v;
                continue;
            }
            let o = v["data_offsets"].as_array().unwrap();
            let (s, e) = (o[0].as_u64().unwrap(), o[1].as_u64().unwrap());
            tensors.push((
                s,
                Tensor0 {
                    name,
                    dtype: v["dtype"].clone(),
                    shape: v["shape"].clone(),
                    data: data[s as usize..e as usize].to_vec(),
                },
            ));
        }
        tensors.sort_by_key(|t| t.0);
        Layout {
            tensors: tensors.into_iter().map(|t| t.1).collect(),
            metadata,
        }
    }

    /// The header's entries, offsets contiguous in file order, as JSON text pieces.
    fn entries(&self) -> Vec<(String, serde_json::Map<String, Value>)> {
        let mut at = 0usize;
        let mut out = Vec::new();
        for t in &self.tensors {
            let mut m = serde_json::Map::new();
            m.insert("dtype".into(), t.dtype.clone());
            m.insert("shape".into(), t.shape.clone());
            m.insert("data_offsets".into(), json!([at, at + t.data.len()]));
            at += t.data.len();
            out.push((t.name.clone(), m));
        }
        out
    }

    fn data(&self) -> Vec<u8> {
        self.tensors.iter().flat_map(|t| t.data.clone()).collect()
    }
}

/// The file of `header` text and `data`, with the correct header length.
fn file_of(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend_from_slice(data);
    b
}

/// The header text of `entries` and `metadata` (entries written in order, so a name may
/// appear twice).
fn header_text(entries: &[(String, serde_json::Map<String, Value>)], metadata: &Value) -> String {
    let mut parts: Vec<String> = entries
        .iter()
        .map(|(n, m)| format!("{}:{}", Value::from(n.as_str()), Value::Object(m.clone())))
        .collect();
    if !metadata.is_null() {
        parts.push(format!("\"__metadata__\":{metadata}"));
    }
    format!("{{{}}}", parts.join(","))
}

/// A dims list: small, zero, or absurd (products that overflow, that wrap to small numbers).
fn dims() -> impl Strategy<Value = Value> {
    let dim = prop_oneof![
        4 => (0u64..6).prop_map(Value::from),
        1 => Just(Value::from(1u64 << 32)),
        1 => Just(Value::from(1u64 << 40)),
        1 => Just(Value::from(1u64 << 62)),
        1 => Just(Value::from(u64::MAX)),
        1 => Just(Value::from(6_148_914_691_236_517_206u64)), // 3 × this wraps to 2
        1 => Just(Value::from(-1i64)),
        1 => Just(json!(1.5)),
        1 => Just(json!("3")),
    ];
    prop_oneof![
        6 => prop::collection::vec(dim, 0..5).prop_map(Value::from),
        1 => Just(json!([0, 1u64 << 62, 1u64 << 62])),
        1 => Just(json!([1u64 << 62, 1u64 << 62, 0])),
        1 => Just(json!(5)),
        1 => Just(Value::Null),
    ]
}

/// A `data_offsets` bound: in range, at the edges, negative, past the end, not an integer.
fn offset() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0u64..2000).prop_map(Value::from),
        1 => Just(Value::from(-1i64)),
        1 => Just(Value::from(u64::MAX)),
        1 => Just(Value::from(1u64 << 40)),
        1 => Just(json!(1e300)),
        1 => Just(json!(4.0)),
        1 => Just(Value::Null),
    ]
}

fn dtype() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("F32")),
        Just(json!("F64")),
        Just(json!("F16")),
        Just(json!("BF16")),
        Just(json!("I64")),
        Just(json!("U8")),
        Just(json!("BOOL")),
        Just(json!("F8_E4M3")),
        Just(json!("f32")),
        Just(json!("Q4")),
        Just(json!("")),
        Just(json!(7)),
    ]
}

/// An edit of the header's JSON; `usize`s pick a tensor (modulo their count).
#[derive(Debug, Clone)]
enum Edit {
    /// New dims, data unchanged.
    Shape(usize, Value),
    /// New dims with data of exactly their size when that is small (a consistent file).
    Reshape(usize, Vec<u64>),
    /// New `data_offsets`, the others unchanged.
    Offsets(usize, Value, Value),
    /// Swap a tensor's offsets with the next one's (overlapping, out of order).
    SwapOffsets(usize),
    Dtype(usize, Value),
    Rename(usize, String),
    Remove(usize),
    Duplicate(usize),
    /// A metadata value nested `depth` arrays deep.
    Nest(usize),
    /// A metadata value that is not a string.
    MetadataValue(Value),
    /// Byte `usize` of the header text replaced by a byte that is not valid UTF-8 there.
    NonUtf8(usize, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    let name = prop_oneof![
        Just("0.weight".to_owned()),
        Just("2.bias".to_owned()),
        Just("optimizer.adam.m.0.weight".to_owned()),
        Just("optimizer.nonsense".to_owned()),
        Just("__metadata__".to_owned()),
        Just("bn.num_batches_tracked".to_owned()),
        ".{0,12}",
    ];
    prop_oneof![
        3 => (any::<usize>(), dims()).prop_map(|(i, d)| Edit::Shape(i, d)),
        2 => (any::<usize>(), prop::collection::vec(0u64..7, 0..4))
            .prop_map(|(i, d)| Edit::Reshape(i, d)),
        3 => (any::<usize>(), offset(), offset()).prop_map(|(i, s, e)| Edit::Offsets(i, s, e)),
        1 => any::<usize>().prop_map(Edit::SwapOffsets),
        2 => (any::<usize>(), dtype()).prop_map(|(i, d)| Edit::Dtype(i, d)),
        2 => (any::<usize>(), name).prop_map(|(i, n)| Edit::Rename(i, n)),
        1 => any::<usize>().prop_map(Edit::Remove),
        1 => any::<usize>().prop_map(Edit::Duplicate),
        1 => prop_oneof![1usize..10, 100usize..200, 1000usize..5000].prop_map(Edit::Nest),
        1 => prop_oneof![Just(json!(1)), Just(json!(null)), Just(json!(["a"])), Just(json!({"k": 1}))]
            .prop_map(Edit::MetadataValue),
        1 => (any::<usize>(), prop_oneof![Just(0xffu8), Just(0xc3), Just(0x80), Just(0xe2)])
            .prop_map(|(i, b)| Edit::NonUtf8(i, b)),
    ]
}

/// One corruption of a valid file.
#[derive(Debug, Clone)]
enum Corruption {
    /// Keep the first `index` bytes.
    Truncate(prop::sample::Index),
    /// XOR these bytes with these non-zero masks.
    Flip(Vec<(prop::sample::Index, u8)>),
    /// XOR the lowest byte of these 4-byte words of the tensor data (a mantissa byte of an
    /// f32 and of an f64 alike) with these masks: new finite values in a valid file, which
    /// must load as its bytes say (so every seed exercises the consistency half).
    Values(Vec<(prop::sample::Index, u8)>),
    /// Set the header length field.
    HeaderLen(u64),
    /// The header length field off by this much from the true one.
    HeaderLenBy(i64),
    /// Edit the header's JSON.
    Header(Edit),
}

fn corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        2 => any::<prop::sample::Index>().prop_map(Corruption::Truncate),
        2 => prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..=8)
            .prop_map(Corruption::Flip),
        1 => prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..=8)
            .prop_map(Corruption::Values),
        1 => prop_oneof![
            Just(0u64),
            Just(1),
            Just(7),
            Just(8),
            Just(u64::MAX),
            Just(u64::MAX / 2),
            Just(1 << 32),
            Just(100_000_001),
            any::<u64>(),
        ]
        .prop_map(Corruption::HeaderLen),
        1 => (-16i64..16).prop_map(Corruption::HeaderLenBy),
        6 => edit().prop_map(Corruption::Header),
    ]
}

/// `good` with `c` applied.
fn corrupt(good: &[u8], c: &Corruption) -> Vec<u8> {
    let mut b = good.to_vec();
    match c {
        Corruption::Truncate(at) => b.truncate(at.index(good.len())),
        Corruption::Flip(flips) => {
            for (at, mask) in flips {
                b[at.index(good.len())] ^= mask;
            }
        }
        Corruption::Values(flips) => {
            let start = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
            let words = (good.len() - start) / 4;
            for (at, mask) in flips {
                b[start + 4 * at.index(words)] ^= mask;
            }
        }
        Corruption::HeaderLen(n) => b[..8].copy_from_slice(&n.to_le_bytes()),
        Corruption::HeaderLenBy(d) => {
            let n = u64::from_le_bytes(b[..8].try_into().unwrap());
            b[..8].copy_from_slice(&n.wrapping_add_signed(*d).to_le_bytes());
        }
        Corruption::Header(e) => return edited(good, e),
    }
    b
}

fn edited(good: &[u8], e: &Edit) -> Vec<u8> {
    let mut l = Layout::of(good);
    let n = l.tensors.len();
    match e {
        Edit::Shape(i, d) => l.tensors[i % n].shape = d.clone(),
        Edit::Reshape(i, d) => {
            let t = &mut l.tensors[i % n];
            let size = if t.dtype == json!("F32") { 4 } else { 8 };
            let numel: u64 = d.iter().product();
            t.shape = json!(d);
            t.data = (0..numel as usize * size)
                .map(|k| (k * 37 % 251) as u8)
                .collect();
        }
        Edit::Dtype(i, d) => l.tensors[i % n].dtype = d.clone(),
        Edit::Rename(i, name) => l.tensors[i % n].name = name.clone(),
        Edit::Remove(i) => {
            l.tensors.remove(i % n);
        }
        Edit::Nest(depth) => {
            let v = format!("{}1{}", "[".repeat(*depth), "]".repeat(*depth));
            let mut entries = l.entries();
            let header = header_text(&entries, &Value::Null);
            entries.clear();
            let header = format!(
                "{}, \"__metadata__\": {{\"format\": {v}}}}}",
                &header[..header.len() - 1]
            );
            return file_of(header.as_bytes(), &l.data());
        }
        Edit::MetadataValue(v) => l.metadata = json!({ "format": v }),
        Edit::Offsets(..) | Edit::SwapOffsets(_) | Edit::Duplicate(_) | Edit::NonUtf8(..) => {}
    }
    let mut entries = l.entries();
    match e {
        Edit::Offsets(i, s, end) => {
            entries[i % n]
                .1
                .insert("data_offsets".into(), json!([s, end]));
        }
        Edit::SwapOffsets(i) => {
            let (a, b) = (i % n, (i + 1) % n);
            let oa = entries[a].1["data_offsets"].clone();
            let ob = entries[b].1["data_offsets"].clone();
            entries[a].1.insert("data_offsets".into(), ob);
            entries[b].1.insert("data_offsets".into(), oa);
        }
        Edit::Duplicate(i) => {
            let d = entries[i % n].clone();
            entries.push(d);
        }
        _ => {}
    }
    let mut header = header_text(&entries, &l.metadata).into_bytes();
    if let Edit::NonUtf8(i, byte) = e {
        let at = i % header.len();
        header[at] = *byte;
    }
    file_of(&header, &l.data())
}

/// The bytes one element of `dtype` takes, for the dtypes tl-nn reads.
fn dtype_size(d: safetensors::Dtype) -> usize {
    d.bitsize() / 8
}

/// The session, model and optimizer the fuzzed files come from and are loaded into.
struct Subject {
    rt: Runtime<Session<f32>>,
    model: tl_nn::Sequential<Session<f32>>,
    opt: Optimizer,
    good: Vec<u8>,
}

fn subject(dir: &Path) -> Subject {
    let mut rt = eager::<f32>(Backend::Cpu, 5);
    let model = mlp(&rt, 3, 4, 2);
    let mut opt = Optimizer::adam(0.01).unwrap();
    let x = tensor::<f32>(&[2, 3], 1);
    let labels = tl_nn::Labels::new(vec![0, 1], 2).unwrap();
    rt.step(&model, &mut opt, |g| {
        use tl_nn::Module;
        model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
    })
    .unwrap();
    let path = dir.join("good.safetensors");
    let meta = BTreeMap::from([("epochs".to_owned(), "1".to_owned())]);
    rt.save_with(&model, &path, Some(&opt), &meta).unwrap();
    let good = std::fs::read(&path).unwrap();
    // Move the model away from the file, so a partial load would show.
    for (_, p) in rt.named_params_of(&model) {
        rt.set_value(&p, Tensor::full(p.shape().clone(), 0.25))
            .unwrap();
    }
    Subject {
        rt,
        model,
        opt,
        good,
    }
}

/// Run `f`, returning its result and the largest number of bytes live at once meanwhile,
/// above what was live before.
fn peak_of<R>(f: impl FnOnce() -> R) -> (R, usize) {
    ALLOC.reset_peak_usage();
    let before = ALLOC.current_usage();
    let r = f();
    (r, ALLOC.peak_usage().saturating_sub(before))
}

/// The property for one corrupted file `bytes` at `path`.
fn check_file(s: &mut Subject, path: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    std::fs::write(path, bytes).unwrap();
    RAN.fetch_add(1, Relaxed);
    let shown = path.display().to_string();
    let bound = ALLOC_FACTOR * bytes.len() + ALLOC_SLACK;
    let (read, peak) = peak_of(|| checkpoint::read(path));
    MAX_OVER.fetch_max(peak.saturating_sub(bytes.len()), Relaxed);
    prop_assert!(
        peak <= bound,
        "checkpoint::read of a {} byte file held {peak} bytes at once",
        bytes.len()
    );
    match &read {
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.contains(&shown), "the error names the file: {msg}");
        }
        Ok(f) => {
            READ_OK.fetch_add(1, Relaxed);
            let mut total = 0usize;
            for (name, e) in &f.tensors {
                let numel = Shape::new(&e.dims).checked_numel();
                prop_assert_eq!(
                    numel.and_then(|n| n.checked_mul(dtype_size(e.dtype))),
                    Some(e.bytes.len()),
                    "tensor {:?}: {:?} {:?} holds {} bytes",
                    name,
                    e.dtype,
                    &e.dims,
                    e.bytes.len()
                );
                total += e.bytes.len();
            }
            prop_assert!(
                total <= bytes.len(),
                "{total} bytes of tensors in {}",
                bytes.len()
            );
        }
    }

    let params_before = s.rt.state_dict(&s.model).unwrap();
    let opt_before = s.rt.session().optimizer_state(&s.opt).unwrap();
    let mut opt = s.opt.clone();
    let (loaded, peak) = peak_of(|| s.rt.load_with(&s.model, path, Some(&mut opt)));
    MAX_OVER.fetch_max(peak.saturating_sub(bytes.len()), Relaxed);
    prop_assert!(
        peak <= bound,
        "Runtime::load_with of a {} byte file held {peak} bytes at once",
        bytes.len()
    );
    let params_after = s.rt.state_dict(&s.model).unwrap();
    let opt_after = s.rt.session().optimizer_state(&opt).unwrap();
    match loaded {
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.contains(&shown), "the error names the file: {msg}");
            prop_assert!(
                params_after == params_before,
                "a failed load changed the model: {msg}"
            );
            prop_assert!(
                opt_after == opt_before,
                "a failed load changed the optimizer: {msg}"
            );
        }
        Ok(_) => {
            LOAD_OK.fetch_add(1, Relaxed);
            let f = read.expect("a file that loads is one that reads");
            // The file holds the model's parameters, optimizer state and nothing else but
            // PyTorch's batch-norm counters (which tl-nn skips).
            for name in f.tensors.keys() {
                prop_assert!(
                    params_after.iter().any(|(n, _)| n == name)
                        || name.starts_with(checkpoint::OPTIMIZER_PREFIX)
                        || name.ends_with("num_batches_tracked"),
                    "a file with tensor {name:?} loaded"
                );
            }
            for (name, value) in &params_after {
                let want: Tensor<f32> = f.tensors[name].to_tensor(path, name).unwrap();
                prop_assert!(
                    bits(value) == bits(&want),
                    "parameter {name} after the load differs from the file's bytes"
                );
            }
            let state: BTreeMap<String, Tensor<f64>> = f
                .tensors
                .iter()
                .filter_map(|(n, e)| {
                    let k = n.strip_prefix(checkpoint::OPTIMIZER_PREFIX)?;
                    Some((k.to_owned(), e.to_tensor(path, n).unwrap()))
                })
                .collect();
            if !state.is_empty() {
                prop_assert!(
                    state.keys().eq(opt_after.keys()),
                    "optimizer state names {:?} after loading {:?}",
                    opt_after.keys().collect::<Vec<_>>(),
                    state.keys().collect::<Vec<_>>()
                );
                // An f32 session keeps the state in f32: the file's f64 values, rounded. A step
                // count must be a 0-d tensor, so its dims are the exported scalar's too.
                for (k, v) in &state {
                    let (file, loaded) = (f32_bits(v), f32_bits(&opt_after[k]));
                    prop_assert!(
                        file == loaded,
                        "optimizer state {k} differs: file {:?}, loaded {:?}",
                        v.data(),
                        opt_after[k].data()
                    );
                }
            }
            // Back to the common starting point for the next case.
            for (_, p) in s.rt.named_params_of(&s.model) {
                s.rt.set_value(&p, Tensor::full(p.shape().clone(), 0.25))
                    .unwrap();
            }
        }
    }
    Ok(())
}

/// A tensor's dims and elements' bits (so NaNs from flipped bytes compare equal).
fn bits<T: tl_spec::Scalar>(t: &Tensor<T>) -> (Vec<usize>, Vec<u64>) {
    (
        t.shape().dims().to_vec(),
        t.data().iter().map(|v| v.as_f64().to_bits()).collect(),
    )
}

/// A tensor's dims and elements rounded to f32, as bits (every NaN the same).
fn f32_bits(t: &Tensor<f64>) -> (Vec<usize>, Vec<u32>) {
    let bits = |v: f64| {
        if v.is_nan() {
            u32::MAX
        } else {
            (v as f32).to_bits()
        }
    };
    (
        t.shape().dims().to_vec(),
        t.data().iter().map(|&v| bits(v)).collect(),
    )
}

/// The cases, in the child process only (see the module docs).
#[test]
#[ignore = "run by checkpoint_corruptions_are_refused_or_load_consistently"]
fn checkpoint_fuzz_cases() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    // The counter sees an allocation the size of the ones it must catch.
    let (v, peak) = peak_of(|| vec![1u8; 8 << 20]);
    assert!(
        peak >= v.len(),
        "the allocation counter saw {peak} bytes of 8 MiB"
    );
    drop(v);
    let dir = dir();
    let s = std::cell::RefCell::new(subject(&dir));
    let good = s.borrow().good.clone();
    let mut runner = run_config().runner("fuzz checkpoint");
    let result = runner.run(&corruption(), |c| {
        // A new file per case: truncating and rewriting one makes ext4 flush it.
        let path = dir.join(format!("corrupt-{}.safetensors", RAN.load(Relaxed)));
        let r = check_file(&mut s.borrow_mut(), &path, &corrupt(&good, &c));
        let _ = std::fs::remove_file(&path);
        r
    });
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        panic!("{e}");
    }
    // What the parent checks: the cases ran, and some corruptions were still loadable files
    // (so the consistency half of the property was exercised).
    println!(
        "fuzz: {} files, {} read, {} loaded ({} bytes the most held above a file's size; the \
         good file has {})",
        RAN.load(Relaxed),
        READ_OK.load(Relaxed),
        LOAD_OK.load(Relaxed),
        MAX_OVER.load(Relaxed),
        good.len()
    );
}

/// Runs [`checkpoint_fuzz_cases`] in a child process (one test thread, so the allocation
/// counter sees only the reads), and fails unless it exits successfully within the limit.
#[test]
fn checkpoint_corruptions_are_refused_or_load_consistently() {
    use std::process::Command;
    use std::time::{Duration, Instant};

    if std::env::var_os(CHILD_VAR).is_some() {
        return; // never recurse
    }
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let name = format!("{module}::checkpoint_fuzz_cases");
    let start = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            &name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .output()
        .unwrap();
    let took = start.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the fuzz child failed ({}):\n{text}",
        out.status
    );
    // The child ran every case, and some corruptions were still loadable files.
    let counts: Vec<usize> = text
        .lines()
        .find_map(|l| l.split("fuzz: ").nth(1))
        .map(|l| l.split(' ').filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default();
    assert!(
        counts.len() == 3 && counts[0] == cases() as usize && counts[2] > 0,
        "the child's counts {counts:?} (files, read, loaded):\n{text}"
    );
    assert!(
        took < Duration::from_secs(120),
        "{} cases took {took:?}",
        cases()
    );
}

/// Any text is a vocabulary; it encodes itself and decodes back; other text and any tokens are
/// either translated exactly or refused naming the character or token.
#[test]
fn vocab_encode_decode_take_any_text_and_tokens() {
    let mut runner = run_config().runner("fuzz vocab");
    runner
        .run(
            &(
                ".{0,40}",
                ".{0,20}",
                prop::collection::vec(0usize..64, 0..20),
            ),
            |(text, other, tokens)| {
                let v = match Vocab::from_text(&text) {
                    Ok(v) => v,
                    Err(e) => {
                        prop_assert!(text.is_empty(), "{e}");
                        return Ok(());
                    }
                };
                let ids = v.encode(&text).unwrap();
                prop_assert_eq!(v.decode(&ids).unwrap(), text.clone());
                match v.encode(&other) {
                    Ok(ids) => prop_assert_eq!(v.decode(&ids).unwrap(), other.clone()),
                    Err(e) => {
                        let c = other.chars().find(|c| !text.contains(*c)).unwrap();
                        prop_assert!(e.to_string().contains(&format!("{c:?}")), "{e}");
                    }
                }
                match v.decode(&tokens) {
                    Ok(s) => prop_assert_eq!(s.chars().count(), tokens.len()),
                    Err(e) => {
                        let t = tokens.iter().find(|&&t| t >= v.len()).unwrap();
                        prop_assert!(e.to_string().contains(&format!("token {t} ")), "{e}");
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}

/// `TL_MAX_ALLOC_BYTES`'s parser takes any text: a byte count with a suffix is exactly its
/// value times the unit (or refused when that overflows), and anything else is refused or
/// read as one of those.
#[test]
fn alloc_cap_parser_takes_any_text() {
    use tl_spec::alloc::parse_bytes;
    let mut runner = run_config().runner("fuzz alloc cap");
    runner
        .run(
            &(any::<usize>(), 0usize..5, "\\PC{0,12}"),
            |(n, unit, junk)| {
                let (suffix, shift) = [("", 0), ("K", 10), ("m", 20), ("GiB", 30), ("T", 40)][unit];
                prop_assert_eq!(
                    parse_bytes(&format!(" {n}{suffix} ")),
                    n.checked_mul(1 << shift)
                );
                // Never a panic; what parses is a count the digits say.
                if let Some(v) = parse_bytes(&junk) {
                    prop_assert!(junk.chars().any(|c| c.is_ascii_digit()), "{junk:?} → {v}");
                }
                Ok(())
            },
        )
        .unwrap();
}

/// `Entry::to_tensor` and `checkpoint::write` take entries whose bytes do not fit their dims:
/// an error naming the tensor, never a panic.
#[test]
fn entries_whose_bytes_do_not_fit_their_dims_are_errors() {
    let dir = dir();
    let path = dir.join("entry.safetensors");
    let mut runner = run_config().runner("fuzz entries");
    runner
        .run(
            &(prop::collection::vec(0usize..5, 0..4), 0usize..80),
            |(dims, len)| {
                let e = Entry {
                    dtype: safetensors::Dtype::F32,
                    dims: dims.clone(),
                    bytes: vec![0; len],
                };
                let fits = dims.iter().product::<usize>() * 4 == len;
                let t = e.to_tensor::<f32>(&path, "w");
                prop_assert_eq!(
                    t.is_ok(),
                    fits,
                    "{:?} {}: {:?}",
                    &dims,
                    len,
                    t.as_ref().err()
                );
                let file = checkpoint::File {
                    tensors: BTreeMap::from([("w".to_owned(), e)]),
                    metadata: BTreeMap::new(),
                };
                match checkpoint::write(&path, &file) {
                    Ok(()) => prop_assert!(fits),
                    Err(err) => {
                        prop_assert!(!fits, "{err}");
                        prop_assert!(err.to_string().contains("\"w\""), "{err}");
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
