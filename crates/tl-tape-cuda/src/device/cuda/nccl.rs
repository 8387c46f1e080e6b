//! NCCL, the collective library of NVIDIA GPUs, over [`CudaDevice`] buffers (features `cuda`
//! and `cuda-emu`): the engine of data-parallel training on GPUs (tl-nn's `dist::Nccl`).
//!
//! NCCL is **loaded at run time** (`dlopen`, through `libloading`), never linked, so every
//! build links without it and a program that never asks for NCCL never needs it:
//! [`Nccl::load`] opens the file named by `TL_NCCL_LIBRARY` ([`LIBRARY_VAR`]) or else
//! `libnccl.so.2` ([`DEFAULT_LIBRARY`]) on the loader's path. A missing library or symbol is
//! an [`Error::Nccl`] naming what was tried and the variable; a failed call names the call,
//! NCCL's result code and `ncclGetErrorString`'s message.
//!
//! Wrapped: `ncclGetVersion` ([`Nccl::version`]), `ncclGetUniqueId` ([`Nccl::unique_id`]),
//! `ncclCommInitRank` ([`NcclComm::init`]), `ncclAllReduce` with `ncclSum` on `f32` and `f64`
//! ([`NcclComm::all_reduce_sum`]; in place over several buffers in one
//! `ncclGroupStart`/`ncclGroupEnd` with [`NcclComm::all_reduce_sum_in_place`]),
//! `ncclBroadcast` ([`NcclComm::broadcast`]), `ncclCommGetAsyncError` and `ncclCommAbort` (the
//! collectives' timeout) and `ncclCommDestroy` (when a [`NcclComm`] drops). Collectives run on
//! the device's stream (the legacy default stream of the process-wide context, where every
//! kernel and copy of [`CudaDevice`] runs) and are waited for before they return: by polling
//! `cuStreamQuery` and `ncclCommGetAsyncError`, with a deadline ([`NcclComm::set_timeout`],
//! default [`DEFAULT_TIMEOUT`]). A collective that has not finished by then (a rank that does
//! not take part: lost, or stuck elsewhere), or that NCCL reports failed, is an error; the
//! communicator is aborted (`ncclCommAbort`) and every later call on it is an error saying so.
//! Ranks, sizes, roots and lengths are checked against NCCL's `int` and the buffers' lengths
//! before any call.
//!
//! `cargo xtask nccl-stub` builds a one-rank stand-in (`target/nccl-stub/libnccl.so.2`) for
//! machines without NCCL: over the kernel emulator (`cuda-emu`) its copies really run, so the
//! whole path is tested in CI. docs/cuda.md, "NCCL".
//!
//! Every `unsafe` block of this module is a call through a symbol of the loaded library (or
//! the loading itself), with a `// SAFETY:` comment.

use std::ffi::{CStr, OsStr, c_char, c_int, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{CudaDevice, driver};
use crate::device::{Buffer, Device};
use crate::{Error, Result};

/// The environment variable naming the NCCL library file to load.
pub const LIBRARY_VAR: &str = "TL_NCCL_LIBRARY";

/// The library [`Nccl::load`] opens when [`LIBRARY_VAR`] is not set (found on the loader's
/// path: `LD_LIBRARY_PATH`, the system's library directories).
pub const DEFAULT_LIBRARY: &str = "libnccl.so.2";

/// The bytes of an `ncclUniqueId` (`NCCL_UNIQUE_ID_BYTES` of nccl.h).
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclResult_t`.
type NcclResult = c_int;
/// `ncclComm_t`: an opaque pointer.
type RawComm = *mut c_void;

/// `ncclUniqueId` as nccl.h lays it out (passed by value to `ncclCommInitRank`).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawUniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

/// `ncclSum` of `ncclRedOp_t`.
const NCCL_SUM: c_int = 0;

/// `ncclInProgress` of `ncclResult_t`: an operation still running (NCCL 2.14 and later).
const NCCL_IN_PROGRESS: NcclResult = 7;

/// How long a collective may take by default before it is taken for a hang
/// ([`NcclComm::set_timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest pause between two polls of a running collective.
const MAX_POLL_PAUSE: Duration = Duration::from_micros(200);

// The signatures of nccl.h (NCCL 2.x; the ABI of these calls has not changed since 2.0).
type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> NcclResult;
type GetUniqueIdFn = unsafe extern "C" fn(*mut RawUniqueId) -> NcclResult;
type CommInitRankFn = unsafe extern "C" fn(*mut RawComm, c_int, RawUniqueId, c_int) -> NcclResult;
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> NcclResult;
type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> NcclResult;
type CommDestroyFn = unsafe extern "C" fn(RawComm) -> NcclResult;
type GroupFn = unsafe extern "C" fn() -> NcclResult;
type CommGetAsyncErrorFn = unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult;
type CommAbortFn = unsafe extern "C" fn(RawComm) -> NcclResult;
type GetErrorStringFn = unsafe extern "C" fn(NcclResult) -> *const c_char;

/// The entry points, resolved once when the library is loaded.
#[derive(Clone, Copy)]
struct Fns {
    get_version: GetVersionFn,
    get_unique_id: GetUniqueIdFn,
    comm_init_rank: CommInitRankFn,
    all_reduce: AllReduceFn,
    broadcast: BroadcastFn,
    comm_destroy: CommDestroyFn,
    group_start: GroupFn,
    group_end: GroupFn,
    comm_get_async_error: CommGetAsyncErrorFn,
    comm_abort: CommAbortFn,
    get_error_string: GetErrorStringFn,
}

/// The element type of a collective. [`CudaDevice`] buffers hold `f32` words; an `f64`
/// collective reads a buffer of two words per value (the value's bits, e.g. `f64::to_bits`
/// split into its low and high halves in memory order), so its length must be even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// `ncclFloat32`: one word per value.
    F32,
    /// `ncclFloat64`: two words per value.
    F64,
}

impl Elem {
    /// `ncclDataType_t`.
    fn nccl_type(self) -> c_int {
        match self {
            Elem::F32 => 7,
            Elem::F64 => 8,
        }
    }

    /// The `f32` words of one value.
    pub fn words(self) -> usize {
        match self {
            Elem::F32 => 1,
            Elem::F64 => 2,
        }
    }

    /// The number of values in a buffer of `len` words; an error for a length that is not a
    /// multiple of [`Elem::words`].
    fn count(self, call: &'static str, len: usize) -> Result<usize> {
        if !len.is_multiple_of(self.words()) {
            return Err(Error::Nccl {
                call,
                detail: format!(
                    "an f64 collective takes a buffer of two f32 words per value; this one has \
                     {len} words (odd)"
                ),
            });
        }
        Ok(len / self.words())
    }
}

/// NCCL's version, as `ncclGetVersion` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclVersion {
    /// The raw code (`NCCL_VERSION_CODE`: `major·10000 + minor·100 + patch` since 2.9).
    pub code: i32,
    /// Major version.
    pub major: i32,
    /// Minor version.
    pub minor: i32,
    /// Patch level.
    pub patch: i32,
}

impl NcclVersion {
    /// Decode a version code (codes below 10000 use the old `major·1000 + minor·100 + patch`).
    pub fn from_code(code: i32) -> NcclVersion {
        let (major, minor, patch) = if code >= 10_000 {
            (code / 10_000, (code % 10_000) / 100, code % 100)
        } else {
            (code / 1000, (code % 1000) / 100, code % 100)
        };
        NcclVersion {
            code,
            major,
            minor,
            patch,
        }
    }
}

impl std::fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The rendezvous token of one communicator (`ncclUniqueId`): rank 0 makes it
/// ([`Nccl::unique_id`]) and sends its bytes to every other rank by some other channel (tl-nn
/// uses its bootstrap engine, normally MPI); every rank passes it to [`NcclComm::init`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// The token's bytes, to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// The token from the bytes rank 0 sent; an error unless there are exactly
    /// [`UNIQUE_ID_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let b: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| Error::Nccl {
            call: "UniqueId::from_bytes",
            detail: format!(
                "an ncclUniqueId has {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ),
        })?;
        Ok(UniqueId(b))
    }

    fn raw(&self) -> RawUniqueId {
        RawUniqueId {
            internal: self.0.map(|b| b as c_char),
        }
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({} bytes)", UNIQUE_ID_BYTES)
    }
}

/// A loaded NCCL library: its entry points, valid while this value lives (communicators hold
/// it through an [`Arc`]).
pub struct Nccl {
    /// What was loaded (the path given or the default name).
    path: String,
    fns: Fns,
    /// Keeps the library mapped: `fns` point into it. Never used after loading otherwise.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("path", &self.path).finish()
    }
}

impl Nccl {
    /// Load NCCL from the file `TL_NCCL_LIBRARY` names, else `libnccl.so.2` from the loader's
    /// path. An [`Error::Nccl`] names what was tried, the loader's message and the variable.
    pub fn load() -> Result<Arc<Nccl>> {
        match std::env::var_os(LIBRARY_VAR) {
            Some(p) if !p.is_empty() => Self::open_as(&p, Some(LIBRARY_VAR)),
            _ => Self::open_as(OsStr::new(DEFAULT_LIBRARY), None),
        }
    }

    /// Load NCCL from `path` (a file, or a name the loader searches for).
    pub fn open(path: impl AsRef<OsStr>) -> Result<Arc<Nccl>> {
        Self::open_as(path.as_ref(), None)
    }

    fn open_as(path: &OsStr, from_var: Option<&str>) -> Result<Arc<Nccl>> {
        const CALL: &str = "load NCCL";
        let shown = path.to_string_lossy().into_owned();
        let origin = match from_var {
            Some(var) => format!("named by {var}"),
            None if shown == DEFAULT_LIBRARY => format!("the default; {LIBRARY_VAR} is not set"),
            None => "given".to_owned(),
        };
        let hint = format!(
            "set {LIBRARY_VAR} to the path of libnccl.so.2 (PyTorch's wheels ship it: \
             python3 -c \"import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])\" \
             prints the folder whose lib/ holds it), or, without a GPU, to the one-rank stub of \
             `cargo xtask nccl-stub`"
        );
        // SAFETY: loading runs the library's initialisers. NCCL's (and the stub's) only set up
        // its own state; the file is the one the user named (or the system's libnccl.so.2).
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| Error::Nccl {
            call: CALL,
            detail: format!("cannot load {shown} ({origin}): {e}; {hint}"),
        })?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the symbol is the nccl.h function of this name, whose C signature
                // `$ty` transcribes; the pointer is used only while `lib` is loaded (it is
                // kept in the same `Nccl`).
                let s = unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
                *s.map_err(|e| Error::Nccl {
                    call: CALL,
                    detail: format!(
                        "{shown} ({origin}) has no symbol {}: {e} (not an NCCL 2 library?); {hint}",
                        $name
                    ),
                })?
            }};
        }
        let fns = Fns {
            get_version: sym!("ncclGetVersion", GetVersionFn),
            get_unique_id: sym!("ncclGetUniqueId", GetUniqueIdFn),
            comm_init_rank: sym!("ncclCommInitRank", CommInitRankFn),
            all_reduce: sym!("ncclAllReduce", AllReduceFn),
            broadcast: sym!("ncclBroadcast", BroadcastFn),
            comm_destroy: sym!("ncclCommDestroy", CommDestroyFn),
            group_start: sym!("ncclGroupStart", GroupFn),
            group_end: sym!("ncclGroupEnd", GroupFn),
            comm_get_async_error: sym!("ncclCommGetAsyncError", CommGetAsyncErrorFn),
            comm_abort: sym!("ncclCommAbort", CommAbortFn),
            get_error_string: sym!("ncclGetErrorString", GetErrorStringFn),
        };
        Ok(Arc::new(Nccl {
            path: shown,
            fns,
            _lib: lib,
        }))
    }

    /// What was loaded: the path (or name) given to the loader.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `Ok` for `ncclSuccess`, else an error naming `call`, the code and NCCL's message.
    fn check(&self, call: &'static str, what: &str, r: NcclResult) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: `ncclGetErrorString` takes any result code and returns a pointer to a static
        // NUL-terminated string (or null, which is checked).
        let p = unsafe { (self.fns.get_error_string)(r) };
        let message = if p.is_null() {
            "no message".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated and static (above).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(Error::Nccl {
            call,
            detail: format!("{what}returned {r} ({message}) [library {}]", self.path),
        })
    }

    /// `ncclGetVersion`.
    pub fn version(&self) -> Result<NcclVersion> {
        let mut code: c_int = 0;
        // SAFETY: `code` is a valid out-pointer for one int.
        let r = unsafe { (self.fns.get_version)(&mut code) };
        self.check("ncclGetVersion", "", r)?;
        Ok(NcclVersion::from_code(code))
    }

    /// `ncclGetUniqueId`: a fresh rendezvous token (on rank 0; see [`UniqueId`]).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut raw = RawUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: `raw` is a valid out-pointer for one ncclUniqueId.
        let r = unsafe { (self.fns.get_unique_id)(&mut raw) };
        self.check("ncclGetUniqueId", "", r)?;
        Ok(UniqueId(raw.internal.map(|c| c as u8)))
    }
}

/// One rank's communicator (`ncclComm_t`), destroyed when dropped. Its collectives read and
/// write [`CudaDevice`] buffers; every rank must make the same calls in the same order with
/// buffers of the same length (NCCL waits for the others otherwise).
pub struct NcclComm {
    nccl: Arc<Nccl>,
    raw: RawComm,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Set once `ncclCommAbort` has run: `raw` is gone.
    aborted: bool,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("library", &self.nccl.path)
            .finish()
    }
}

impl NcclComm {
    /// `ncclCommInitRank`: rank `rank` of `size` on the device of the process-wide CUDA context
    /// (made current first; [`Error::NoDevice`] without a GPU). Every rank calls it with the
    /// same `id` and `size`; it returns when all have. An error before any call when `size` is
    /// 0, `rank >= size` or either does not fit NCCL's `int`.
    pub fn init(nccl: &Arc<Nccl>, id: &UniqueId, rank: usize, size: usize) -> Result<NcclComm> {
        const CALL: &str = "ncclCommInitRank";
        let bad = |detail: String| Err(Error::Nccl { call: CALL, detail });
        if size == 0 {
            return bad("a communicator needs at least one rank, got size 0".to_owned());
        }
        if rank >= size {
            return bad(format!("rank {rank} is not below the size {size}"));
        }
        let (Ok(n), Ok(r)) = (c_int::try_from(size), c_int::try_from(rank)) else {
            return bad(format!(
                "size {size} does not fit NCCL's int (at most {})",
                c_int::MAX
            ));
        };
        driver::enter()?;
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `id` is passed by value as nccl.h declares;
        // 0 <= r < n (checked above); the CUDA context is current on this thread (`enter`).
        let rc = unsafe { (nccl.fns.comm_init_rank)(&mut raw, n, id.raw(), r) };
        nccl.check(CALL, &format!("rank {rank} of {size}: "), rc)?;
        if raw.is_null() {
            return bad(format!(
                "rank {rank} of {size}: returned success but no communicator [library {}]",
                nccl.path
            ));
        }
        Ok(NcclComm {
            nccl: Arc::clone(nccl),
            raw,
            rank,
            size,
            timeout: DEFAULT_TIMEOUT,
            aborted: false,
        })
    }

    /// How long a collective may run before it is an error and the communicator is aborted
    /// (default [`DEFAULT_TIMEOUT`]): longer than any collective of the job takes when every
    /// rank takes part.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The collectives' timeout ([`NcclComm::set_timeout`]).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the communicator was aborted (a collective timed out or failed): every call on
    /// it is an error from then on.
    pub fn is_aborted(&self) -> bool {
        self.aborted
    }

    /// An error unless the communicator is usable.
    fn usable(&self, call: &'static str) -> Result<()> {
        if self.aborted {
            return Err(Error::Nccl {
                call,
                detail: format!(
                    "rank {} of {}: the communicator was aborted after an earlier collective \
                     failed or timed out; make a new one",
                    self.rank, self.size
                ),
            });
        }
        Ok(())
    }

    /// `ncclCommAbort`, once: NCCL stops the communicator's running operations and frees it.
    fn abort(&mut self) {
        if !self.aborted {
            self.aborted = true;
            // SAFETY: `raw` is this live communicator (never aborted before: the flag), freed
            // by this call and never used again (every call checks `usable`; `Drop` skips it).
            let _ = unsafe { (self.nccl.fns.comm_abort)(self.raw) };
        }
    }

    /// Wait for the collective just enqueued: poll NCCL's asynchronous state and the stream
    /// until both say done, an error, or the timeout (then abort; see the module docs).
    fn wait(&mut self, call: &'static str, what: &str) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(5);
        loop {
            let mut state: NcclResult = 0;
            // SAFETY: `raw` is this live communicator (checked usable before the collective);
            // `state` is a valid out-pointer for one ncclResult_t.
            let rc = unsafe { (self.nccl.fns.comm_get_async_error)(self.raw, &mut state) };
            let nccl = &self.nccl;
            let polled = nccl
                .check("ncclCommGetAsyncError", what, rc)
                .and_then(|()| match state {
                    0 => driver::stream_done(call),
                    NCCL_IN_PROGRESS => Ok(false),
                    failed => nccl
                        .check(call, &format!("{what}asynchronously: "), failed)
                        .map(|()| false),
                });
            match polled {
                Ok(true) => return Ok(()),
                Ok(false) if start.elapsed() < self.timeout => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_POLL_PAUSE);
                }
                Ok(false) => {
                    self.abort();
                    return Err(Error::Nccl {
                        call,
                        detail: format!(
                            "{what}not finished after {:.3} s (the timeout): a rank did not take \
                             part (lost, or stuck elsewhere); the communicator is aborted",
                            self.timeout.as_secs_f64()
                        ),
                    });
                }
                Err(e) => {
                    self.abort();
                    return Err(e);
                }
            }
        }
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The library the communicator runs on.
    pub fn library(&self) -> &Arc<Nccl> {
        &self.nccl
    }

    /// `ncclAllReduce` with `ncclSum`: a fresh buffer holding the element-wise sum of every
    /// rank's `x` (values of type `elem`; `x` is left as it was). PyTorch:
    /// `dist.all_reduce(t)` (in place there).
    pub fn all_reduce_sum(
        &mut self,
        dev: &mut CudaDevice,
        x: Buffer,
        elem: Elem,
    ) -> Result<Buffer> {
        self.collective("ncclAllReduce", dev, x, elem, None)
    }

    /// `ncclBroadcast`: a fresh buffer holding rank `root`'s `x` on every rank (each rank's `x`
    /// as long as the root's). PyTorch: `dist.broadcast(t, src=root)`.
    pub fn broadcast(
        &mut self,
        dev: &mut CudaDevice,
        x: Buffer,
        root: usize,
        elem: Elem,
    ) -> Result<Buffer> {
        self.collective("ncclBroadcast", dev, x, elem, Some(root))
    }

    /// `ncclAllReduce` with `ncclSum`, in place, on every buffer of `bufs` (values of type
    /// `elem`), inside one `ncclGroupStart`/`ncclGroupEnd` (NCCL fuses the calls of a group
    /// into one launch: a data-parallel step's gradient bucket), waited for before it returns.
    /// Every rank passes buffers of the same lengths in the same order. The buffers stay on the
    /// device: no host copy is made. PyTorch: `dist.all_reduce` of each tensor in a
    /// `dist._coalescing_manager`.
    pub fn all_reduce_sum_in_place(
        &mut self,
        dev: &mut CudaDevice,
        bufs: &[Buffer],
        elem: Elem,
    ) -> Result<()> {
        const CALL: &str = "ncclAllReduce";
        self.usable(CALL)?;
        // Every check before the group opens: an error leaves nothing half-enqueued.
        let mut calls = Vec::with_capacity(bufs.len());
        for &b in bufs {
            let count = elem.count(CALL, b.len())?;
            if count > 0 {
                calls.push((dev.ptr(CALL, b)?, count));
            }
        }
        if calls.is_empty() {
            return Ok(());
        }
        driver::enter()?;
        let nccl = &self.nccl;
        let what = format!(
            "rank {} of {}, {} in-place buffer(s) of {elem:?} values: ",
            self.rank,
            self.size,
            calls.len()
        );
        // SAFETY: no arguments; the group is closed below on every path.
        let rc = unsafe { (nccl.fns.group_start)() };
        nccl.check("ncclGroupStart", &what, rc)?;
        let mut enqueued = Ok(());
        for (p, count) in calls {
            let ptr = p as usize as *mut c_void;
            // SAFETY: `ptr` is the live allocation of one buffer of `bufs` holding `count`
            // values of the element type (checked by `ptr` and `count`), passed as both send
            // and receive (NCCL's in-place form); `self.raw` is this live communicator; the
            // null stream is the legacy default stream of the current context (`enter`),
            // where the device's kernels and copies run.
            let rc = unsafe {
                (nccl.fns.all_reduce)(
                    ptr,
                    ptr,
                    count,
                    elem.nccl_type(),
                    NCCL_SUM,
                    self.raw,
                    std::ptr::null_mut(),
                )
            };
            enqueued = nccl.check(CALL, &what, rc);
            if enqueued.is_err() {
                break;
            }
        }
        // SAFETY: no arguments; closes the group opened above.
        let rc = unsafe { (nccl.fns.group_end)() };
        enqueued?;
        nccl.check("ncclGroupEnd", &what, rc)?;
        self.wait(CALL, &what)
    }

    /// An all-reduce (`root == None`) or a broadcast from `root` of `x` into a fresh buffer.
    fn collective(
        &mut self,
        call: &'static str,
        dev: &mut CudaDevice,
        x: Buffer,
        elem: Elem,
        root: Option<usize>,
    ) -> Result<Buffer> {
        self.usable(call)?;
        let count = elem.count(call, x.len())?;
        let root = match root {
            None => None,
            Some(r) if r < self.size => Some(r as c_int), // size fits c_int (init)
            Some(r) => {
                return Err(Error::Nccl {
                    call,
                    detail: format!(
                        "root {r} is not a rank of this communicator of {}",
                        self.size
                    ),
                });
            }
        };
        let px = dev.ptr(call, x)?;
        driver::enter()?;
        let (nccl, raw) = (&self.nccl, self.raw);
        let what = format!(
            "rank {} of {}, {count} {elem:?} values: ",
            self.rank, self.size
        );
        let out = dev.with_out(call, x.len(), |_, out| {
            if count == 0 {
                return Ok(());
            }
            let (send, recv) = (px as usize as *const c_void, out as usize as *mut c_void);
            let ty = elem.nccl_type();
            let rc = match root {
                // SAFETY: `send` is the live allocation of `x` and `recv` a fresh one of the
                // same length, each of `count` values of `ty` (count·words f32 words; checked
                // by `ptr`, `count` and `with_out`); `raw` is this live communicator (destroyed
                // only on drop); the null stream is the legacy default stream of the current
                // context (`enter`), where the device's kernels and copies run.
                None => unsafe {
                    (nccl.fns.all_reduce)(
                        send,
                        recv,
                        count,
                        ty,
                        NCCL_SUM,
                        raw,
                        std::ptr::null_mut(),
                    )
                },
                // SAFETY: as for the all-reduce; `r` is a rank of the communicator (checked).
                Some(r) => unsafe {
                    (nccl.fns.broadcast)(send, recv, count, ty, r, raw, std::ptr::null_mut())
                },
            };
            nccl.check(call, &what, rc)
        })?;
        if count > 0
            && let Err(e) = self.wait(call, &what)
        {
            dev.release(out);
            return Err(e);
        }
        Ok(out)
    }
}

impl Drop for NcclComm {
    /// `ncclCommDestroy` (its result is ignored: nothing is left to undo), unless the
    /// communicator was aborted (`ncclCommAbort` freed it).
    fn drop(&mut self) {
        if self.aborted {
            return;
        }
        // SAFETY: `raw` came from `ncclCommInitRank`, was not aborted, and is destroyed once,
        // here; the library is still loaded (`self.nccl` holds it).
        let _ = unsafe { (self.nccl.fns.comm_destroy)(self.raw) };
    }
}
