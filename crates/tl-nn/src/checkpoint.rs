//! Checkpoints in the safetensors format, and atomic file writes.
//!
//! A model's file holds one tensor per parameter, named as PyTorch's `state_dict()` names it
//! (`0.weight`, `blocks.1.attn.wq`, `bn.running_mean`), in the session's scalar type (F32 for
//! `f32` sessions, F64 for `f64`), optionally the optimizer's state as F64 tensors named
//! `optimizer.<state name>`, and string metadata. So a state_dict PyTorch saved with
//! `safetensors.torch.save_file(model.state_dict(), path)` loads into the equivalent tl-nn
//! model (`num_batches_tracked`, which PyTorch's batch norm keeps and tl-nn does not need, is
//! skipped).
//!
//! Loading validates the whole file against the model before anything is written: a missing,
//! extra, misshapen or wrongly typed tensor is one [`Error::Checkpoint`] naming the tensor,
//! and the model is left as it was. Saving writes a temporary file in the same directory,
//! syncs it and renames it over the target ([`write_atomic`]), so a failed or interrupted save
//! leaves the previous file intact.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use tl_session::optim::StateDict;
use tl_session::{Optimizer, Train};
use tl_spec::{Scalar, Tensor};

use crate::{Error, Parameters, Result, Runtime};

/// The `format` metadata value tl-nn writes.
pub const FORMAT: &str = "tl-nn/1";

/// The name prefix of optimizer state tensors.
pub const OPTIMIZER_PREFIX: &str = "optimizer.";

/// The metadata key of the session's random counter ([`Train::random_counter`]), which
/// [`Runtime::save_with`] writes and [`Runtime::load_with`] restores with the optimizer's
/// state, so a resumed run draws the dropout masks the uninterrupted run draws.
pub const RANDOM_COUNTER: &str = "tl-nn.random_counter";

/// One tensor of a file: its dtype, dims and little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The element type.
    pub dtype: Dtype,
    /// The dimensions.
    pub dims: Vec<usize>,
    /// The elements, little-endian.
    pub bytes: Vec<u8>,
}

/// The dtype of `T` in a file (F32 for `f32`, F64 for `f64`).
pub fn dtype_of<T: Scalar>() -> Dtype {
    if std::mem::size_of::<T>() == 4 {
        Dtype::F32
    } else {
        Dtype::F64
    }
}

impl Entry {
    /// The entry of a tensor, in `T`'s own dtype.
    pub fn from_tensor<T: Scalar>(t: &Tensor<T>) -> Entry {
        let bytes = if dtype_of::<T>() == Dtype::F32 {
            t.data()
                .iter()
                .flat_map(|v| (v.as_f64() as f32).to_le_bytes())
                .collect()
        } else {
            t.data()
                .iter()
                .flat_map(|v| v.as_f64().to_le_bytes())
                .collect()
        };
        Entry {
            dtype: dtype_of::<T>(),
            dims: t.shape().dims().to_vec(),
            bytes,
        }
    }

    /// The tensor, which must be stored as `T`'s dtype with exactly its dims' elements' bytes
    /// (else an error naming the file, `name`, the shape and the byte counts).
    pub fn to_tensor<T: Scalar>(&self, path: &Path, name: &str) -> Result<Tensor<T>> {
        if self.dtype != dtype_of::<T>() {
            return Err(bad(
                path,
                format!(
                    "tensor {name:?} is {:?}, but the model's parameters are {:?}",
                    self.dtype,
                    dtype_of::<T>()
                ),
            ));
        }
        // The bytes must be exactly the dims' elements: a public `Entry` can be built with
        // any, and decoding would drop a partial element or let a short buffer through.
        let size = std::mem::size_of::<T>();
        let want = tl_spec::Shape::new(&self.dims)
            .checked_numel()
            .and_then(|n| n.checked_mul(size));
        if want != Some(self.bytes.len()) {
            return Err(bad(
                path,
                format!(
                    "tensor {name:?} of shape {:?} holds {} bytes, not {} ({size} per element)",
                    self.dims,
                    self.bytes.len(),
                    want.map_or_else(|| "a representable count".to_owned(), |n| n.to_string())
                ),
            ));
        }
        let data: Vec<T> = match self.dtype {
            Dtype::F32 => self
                .bytes
                .chunks_exact(4)
                .map(|c| T::lit(f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))))
                .collect(),
            _ => self
                .bytes
                .chunks_exact(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    T::lit(f64::from_le_bytes(b))
                })
                .collect(),
        };
        Tensor::new(self.dims.clone(), data).map_err(|e| bad(path, format!("tensor {name:?}: {e}")))
    }
}

/// A whole file: tensors by name, and metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct File {
    /// Every tensor, by name.
    pub tensors: BTreeMap<String, Entry>,
    /// String metadata (`format`, and whatever the writer adds).
    pub metadata: BTreeMap<String, String>,
}

fn bad(path: &Path, detail: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

/// Encode `file` and write it to `path` atomically.
pub fn write(path: &Path, file: &File) -> Result<()> {
    let views = file
        .tensors
        .iter()
        .map(|(name, e)| {
            TensorView::new(e.dtype, e.dims.clone(), &e.bytes)
                .map(|v| (name.clone(), v))
                .map_err(|err| bad(path, format!("tensor {name:?}: {err}")))
        })
        .collect::<Result<Vec<_>>>()?;
    // The map type safetensors takes (std's or hashbrown's, by its `std` feature), inferred.
    let meta = file
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let bytes = safetensors::serialize(views, Some(meta))
        .map_err(|e| bad(path, format!("cannot encode: {e}")))?;
    write_atomic(path, &bytes)
}

/// Read and decode the file at `path`. A file larger than the allocation cap
/// ([`tl_spec::alloc`]) is refused before it is read, naming its size; a file that is not
/// valid safetensors (truncated, corrupt, a header that claims more than the file holds) is an
/// error; the crate checks the header's claims against the bytes read before anything is
/// allocated from them.
pub fn read(path: &Path) -> Result<File> {
    regular_or_absent(path)?;
    let bytes = read_capped(path)?;
    let invalid = |why: String| {
        bad(
            path,
            format!("not a valid safetensors file ({why}); it may be truncated or corrupt"),
        )
    };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| invalid(e.to_string()))?;
    // The header's JSON object is read into a map, which keeps one of two entries of the same
    // name: a file naming a tensor twice is refused instead.
    if let Some(name) = duplicate_name(&bytes) {
        return Err(bad(
            path,
            format!("the header names tensor {name:?} more than once"),
        ));
    }
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| invalid(e.to_string()))?;
    let metadata = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut tensors = BTreeMap::new();
    for name in st.names() {
        let v = st.tensor(name).map_err(|e| invalid(e.to_string()))?;
        tensors.insert(
            name.to_owned(),
            Entry {
                dtype: v.dtype(),
                dims: v.shape().to_vec(),
                bytes: v.data().to_vec(),
            },
        );
    }
    Ok(File { tensors, metadata })
}

/// The whole file at `path`, its length (from the open file's metadata) checked against the
/// allocation cap first: a file of more bytes than one buffer may hold is an error naming the
/// file and its size, and nothing is allocated for it. The buffer is reserved fallibly, and no
/// more than that length is read (a file that grows meanwhile reads as truncated).
fn read_capped(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let n = usize::try_from(len).unwrap_or(usize::MAX);
    tl_spec::alloc::check_len::<u8>(
        "tl_nn::checkpoint::read",
        &format!("the file ({len} bytes)"),
        n,
    )
    .map_err(|e| bad(path, format!("cannot read it: {e}")))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(n)
        .map_err(|e| bad(path, format!("cannot read its {len} bytes: {e}")))?;
    f.take(len).read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}

/// The first name the header of safetensors `bytes` gives twice (a tensor or `__metadata__`),
/// if any. For a file [`SafeTensors::deserialize`] accepted: its header is a JSON object.
fn duplicate_name(bytes: &[u8]) -> Option<String> {
    let len = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header = std::str::from_utf8(bytes.get(8..8usize.checked_add(len)?)?).ok()?;
    let mut seen = std::collections::HashSet::new();
    let skip_ws = |at: usize| at + header[at..].len() - header[at..].trim_start().len();
    let mut at = skip_ws(0);
    if !header[at..].starts_with('{') {
        return None;
    }
    at = skip_ws(at + 1);
    while header[at..].starts_with('"') {
        // The key's extent: up to the first quote not escaped by a backslash.
        let mut end = at + 1;
        let raw = header.as_bytes();
        while end < raw.len() && raw[end] != b'"' {
            end += if raw[end] == b'\\' { 2 } else { 1 };
        }
        let key: String = serde_json::from_str(header.get(at..=end)?).ok()?;
        if !seen.insert(key.clone()) {
            return Some(key);
        }
        at = skip_ws(end + 1);
        if !header[at..].starts_with(':') {
            return None;
        }
        at = skip_ws(at + 1);
        // The value: one JSON value, whose length the streaming parser reports.
        let mut values =
            serde_json::Deserializer::from_str(&header[at..]).into_iter::<serde_json::Value>();
        values.next()?.ok()?;
        at = skip_ws(at + values.byte_offset());
        match header[at..].chars().next()? {
            ',' => at = skip_ws(at + 1),
            _ => return None,
        }
    }
    None
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An error unless `path` is a regular file or does not exist: a directory, a FIFO (whose read
/// would block until a writer comes), a socket or a device is refused before it is opened.
fn regular_or_absent(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(bad(
            path,
            format!(
                "not a regular file (a {}); a checkpoint is read from and written to a file",
                kind_of(&m.file_type())
            ),
        )),
        _ => Ok(()),
    }
}

/// What a non-regular file is, in words.
fn kind_of(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "FIFO";
        }
        if t.is_socket() {
            return "socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "device";
        }
    }
    if t.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// Remove the temporary files an earlier save to `dir/name` left behind when its process was
/// killed mid-write (`.{name}.tmp-{pid}-{n}` whose process no longer runs). Only where the
/// system lists its processes under `/proc`; elsewhere nothing is removed.
fn remove_stale_temps(dir: &Path, name: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Write `bytes` to `path` atomically: a temporary file in the same directory, synced, then
/// renamed over `path`. On any failure the temporary file is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// [`write_atomic`] with the content written by `fill` (which may fail: then nothing changes).
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| bad(path, "the path names no file"))?
        .to_string_lossy()
        .into_owned();
    regular_or_absent(path)?;
    remove_stale_temps(&dir, &name);
    let tmp = dir.join(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        fill(&mut f)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // Make the rename durable; not every platform can sync a directory.
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

impl<O: Train> Runtime<O> {
    /// `model`'s parameters by full name, read back to the host. PyTorch:
    /// `model.state_dict()`. An error naming them when `model` does not list parameters its
    /// passes used ([`Runtime`], "Listed parameters"): the file would lack them.
    pub fn state_dict<M: Parameters + ?Sized>(
        &self,
        model: &M,
    ) -> Result<Vec<(String, Tensor<O::T>)>> {
        self.check_listed("Runtime::state_dict", model)?;
        self.named_params_of(model)
            .into_iter()
            .map(|(name, p)| Ok((name, self.value_of(&p)?)))
            .collect()
    }

    /// Save `model`'s parameters to `path` (safetensors, written atomically). PyTorch:
    /// `safetensors.torch.save_file(model.state_dict(), path)`.
    pub fn save<M: Parameters + ?Sized>(&self, model: &M, path: impl AsRef<Path>) -> Result<()> {
        self.save_with(model, path.as_ref(), None, &BTreeMap::new())
    }

    /// Save `model`'s parameters, `opt`'s state (as `optimizer.*` F64 tensors) when given, and
    /// `metadata` (plus `format`). In a data-parallel group ([`Runtime::data_parallel`]) every
    /// rank calls it, rank 0 writes, and a failed write is an error on every rank.
    pub fn save_with<M: Parameters + ?Sized>(
        &self,
        model: &M,
        path: &Path,
        opt: Option<&Optimizer>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<()> {
        // In a data-parallel group rank 0 writes, and every rank hears how that went.
        let write_here = self.rank() == 0;
        let written = if write_here {
            self.save_file(model, path, opt, metadata)
        } else {
            Ok(())
        };
        self.agree_group("Runtime::save", written)
    }

    fn save_file<M: Parameters + ?Sized>(
        &self,
        model: &M,
        path: &Path,
        opt: Option<&Optimizer>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<()> {
        self.check_listed("Runtime::save", model)?;
        let mut file = File {
            metadata: metadata.clone(),
            ..File::default()
        };
        file.metadata.insert("format".into(), FORMAT.into());
        let counter = self.session().random_counter();
        file.metadata
            .insert(RANDOM_COUNTER.into(), counter.to_string());
        for (name, t) in self.state_dict(model)? {
            file.tensors.insert(name, Entry::from_tensor(&t));
        }
        if let Some(opt) = opt {
            for (name, t) in self.session().optimizer_state(opt)? {
                file.tensors
                    .insert(format!("{OPTIMIZER_PREFIX}{name}"), Entry::from_tensor(&t));
            }
        }
        write(path, &file)
    }

    /// Load `model`'s parameters from `path`; returns the file's metadata. See the module
    /// docs for what is checked; on any error nothing changes. Optimizer state in the file
    /// is ignored (see [`Runtime::load_with`]). PyTorch: `model.load_state_dict(load_file(path))`.
    pub fn load<M: Parameters + ?Sized>(
        &mut self,
        model: &M,
        path: impl AsRef<Path>,
    ) -> Result<BTreeMap<String, String>> {
        self.load_with(model, path.as_ref(), None)
    }

    /// [`Runtime::load`], and `opt`'s state from the file's `optimizer.*` tensors when `opt`
    /// is given (a file without them leaves `opt` as it is), with the session's random counter
    /// ([`RANDOM_COUNTER`]; a file without it leaves the counter as it is): a run resumed on a
    /// session of the same seed (`Options::seed`) continues the uninterrupted run's steps bit
    /// for bit, dropout's masks included. On any error neither the model, `opt` nor the
    /// counter changes. In a data-parallel group every rank loads the file, and a load that fails
    /// on one rank is an error on every rank (a rank whose own load succeeded keeps the file's
    /// values: stop the run).
    pub fn load_with<M: Parameters + ?Sized>(
        &mut self,
        model: &M,
        path: &Path,
        opt: Option<&mut Optimizer>,
    ) -> Result<BTreeMap<String, String>> {
        let loaded = (|| {
            self.check_listed("Runtime::load", model)?;
            let file = read(path)?;
            self.load_file(model, path, &file, opt)?;
            Ok(file.metadata)
        })();
        // In a data-parallel group a load that fails on one rank fails on every rank.
        self.agree_group("Runtime::load", loaded)
    }

    /// Load `model`'s parameters (and `opt`'s state) from an already read `file`.
    pub fn load_file<M: Parameters + ?Sized>(
        &mut self,
        model: &M,
        path: &Path,
        file: &File,
        opt: Option<&mut Optimizer>,
    ) -> Result<()> {
        self.check_listed("Runtime::load", model)?;
        let named = self.named_params_of(model);
        // Validate everything first: the model must not be left half loaded.
        let mut values = Vec::with_capacity(named.len());
        for (name, p) in &named {
            let e = file.tensors.get(name).ok_or_else(|| {
                bad(
                    path,
                    format!(
                        "missing tensor {name:?} (the model's parameter of shape {})",
                        p.shape()
                    ),
                )
            })?;
            if e.dims != p.shape().dims() {
                return Err(bad(
                    path,
                    format!(
                        "tensor {name:?} has shape {:?}, the model's parameter is {}",
                        e.dims,
                        p.shape()
                    ),
                ));
            }
            values.push((p.clone(), e.to_tensor::<O::T>(path, name)?));
        }
        let mut state = StateDict::new();
        for (name, e) in &file.tensors {
            if let Some(key) = name.strip_prefix(OPTIMIZER_PREFIX) {
                state.insert(key.to_owned(), e.to_tensor::<f64>(path, name)?);
            } else if !named.iter().any(|(n, _)| n == name)
                && !name.ends_with("num_batches_tracked")
            {
                return Err(bad(
                    path,
                    format!("unexpected tensor {name:?}: the model has no parameter of that name"),
                ));
            }
        }
        // The random counter comes back with a training state (`opt` given).
        let counter = match (&opt, file.metadata.get(RANDOM_COUNTER)) {
            (Some(_), Some(v)) => Some(v.parse::<u64>().map_err(|_| {
                bad(
                    path,
                    format!(
                        "metadata {RANDOM_COUNTER} is {v:?}, not a whole number of at most 2^64 - 1"
                    ),
                )
            })?),
            _ => None,
        };
        let new_opt = match opt {
            Some(opt) if !state.is_empty() => {
                let mut o = opt.clone();
                self.session_mut()
                    .load_optimizer_state(&mut o, &state)
                    .map_err(|e| bad(path, format!("the optimizer state does not fit: {e}")))?;
                Some((opt, o))
            }
            _ => None,
        };
        for (p, v) in values {
            self.set_value(&p, v)?;
        }
        if let Some((opt, o)) = new_opt {
            *opt = o;
        }
        if let Some(c) = counter {
            self.session_mut().set_random_counter(c);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file larger than the allocation cap is refused from its length, before it is read (it
    /// was read whole: an abort or an out-of-memory kill), naming the file and its size. The file
    /// is sparse: nothing of its size is written or read.
    #[test]
    fn a_file_past_the_allocation_cap_is_refused_before_it_is_read() {
        let dir = std::env::temp_dir().join(format!("tl-nn-huge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("huge.safetensors");
        let len = tl_spec::alloc::max_alloc_bytes() as u64 + 1;
        std::fs::File::create(&p).unwrap().set_len(len).unwrap();
        let e = read(&p).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            e.contains(&p.display().to_string())
                && e.contains(&format!("{len} bytes"))
                && e.contains("allocation cap"),
            "{e}"
        );
    }
}
