//! The FNO paper's Burgers data set (Li et al., "Fourier Neural Operator for Parametric
//! Partial Differential Equations", ICLR 2021, §5.1), made by our own solver: `u_t + u u_x =
//! ν u_xx` on the periodic interval (0, 1), ν = 0.1, initial conditions from the Gaussian random
//! field `N(0, 625(−Δ + 25I)^(−2))` ([`crate::grf`]), solved to T = 1 on 8192 points
//! ([`crate::burgers::Solver`], IFRK4 with step [`PAPER_DT`]) and subsampled to the training
//! grid s (every (8192/s)-th point, as the paper's `x_data[:, ::sub]`); the first
//! [`PaperData::n_train`] pairs train, the next [`PaperData::n_test`] test.
//!
//! Every pair has its own random stream (draw `i` from `Draws::new(splitmix64(seed ^ i·φ))`), so
//! the set is the same whatever the number of threads that solve it.
//!
//! **The cache.** Solving 1200 fields at 8192 points takes minutes, so the set is written once,
//! at the source resolution, to a safetensors file (`u0` and `uT`, F32, (pairs, 8192)) in the
//! cache directory, atomically (temporary file, then rename), and read by later runs (and by
//! the JAX twin, `benches/jax/fno_burgers.py`). Its name carries a hash of every parameter
//! (seed, source grid, ν, T, dt, the field's σ τ γ, the counts), and its metadata every parameter
//! in full, which a reader compares before it uses a value; a checksum (FNV-1a, 64 bits) of the
//! tensors' bytes catches a damaged file. A file that fails any check is an error naming it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use safetensors::Dtype;
use tl_nn::checkpoint::{Entry, File};
use tl_nn::models::FnoConfig;
use tl_session::{Optimizer, Schedule};

use crate::burgers::{Draws, Solver};
use crate::dataset::{Dataset, Fields};
use crate::grf::{Grf, PAPER_GRF};
use crate::{CliError, Result};

/// The solver's step for the paper's set: the solution at ν = 0.1 is smooth, and with the
/// integrating factor the step is limited by accuracy, not by an advective CFL. Halving it
/// changes u(T) by less than 1e-8 (absolute; 1e-6 of u(T)'s size, which ν = 0.1 damps to about
/// 0.01), far below the FNO's errors (docs/benchmarks.md; test
/// `fno_paper::tests::the_step_is_converged`).
pub const PAPER_DT: f64 = 1.0 / 200.0;

/// The `format` metadata value of a cache file.
pub const CACHE_FORMAT: &str = "tl-burgers-cache/1";

/// Everything that decides the data set (each is part of the cache's key).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperData {
    /// Seed of the fields.
    pub seed: u64,
    /// Points of the solver's grid (a power of two ≥ 8).
    pub source_grid: usize,
    /// Training pairs.
    pub n_train: usize,
    /// Test pairs.
    pub n_test: usize,
    /// Viscosity ν.
    pub nu: f64,
    /// Final time T.
    pub t_end: f64,
    /// The solver's time step.
    pub dt: f64,
    /// The initial conditions' field.
    pub grf: Grf,
}

/// The paper's set: 1000 + 200 pairs on 8192 points, ν = 0.1, T = 1.
pub const PAPER: PaperData = PaperData {
    seed: 0xF0_2021,
    source_grid: 8192,
    n_train: 1000,
    n_test: 200,
    nu: 0.1,
    t_end: 1.0,
    dt: PAPER_DT,
    grf: PAPER_GRF,
};

/// The pairs at the source resolution: row `i` of `u0` and `ut` is pair `i`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pairs {
    /// Points per row.
    pub grid: usize,
    /// Initial conditions, (pairs, grid) row-major.
    pub u0: Vec<f32>,
    /// Solutions at T, (pairs, grid) row-major.
    pub ut: Vec<f32>,
}

impl Pairs {
    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.u0.len() / self.grid.max(1)
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pairs `range`, subsampled to `s` points (every (grid/s)-th, starting at x = 0); `s` must
    /// divide the source grid.
    pub fn fields(&self, range: std::ops::Range<usize>, s: usize) -> Result<Fields> {
        if s == 0 || !self.grid.is_multiple_of(s) {
            return Err(CliError::usage(format!(
                "--grid {s}: must divide the source grid of {} points",
                self.grid
            )));
        }
        let step = self.grid / s;
        let pick = |v: &[f32]| -> Vec<f32> {
            range
                .clone()
                .flat_map(|i| (0..s).map(move |j| v[i * self.grid + j * step]))
                .collect()
        };
        Ok(Fields {
            grid: s,
            x: pick(&self.u0),
            y: pick(&self.ut),
        })
    }
}

/// One solved pair: its index, u0 and u(T).
type Solved = (usize, Vec<f64>, Vec<f64>);

/// `work(t, stop)` for each `t` in `0..threads`, each on a scoped thread made by `builder(t)`,
/// their results in the order of `t` (a thread that panicked gives `T::default()`). When the
/// system refuses to start thread `t` (`Builder::spawn_scoped`'s error, where `thread::scope`'s
/// `spawn` panics), `stop` is raised for the threads already running (`work` should look at it
/// between items), they are joined, and the error is `(t, the system's error)`.
fn on_threads<T: Send + Default>(
    threads: usize,
    builder: impl Fn(usize) -> std::thread::Builder,
    work: impl Fn(usize, &AtomicBool) -> T + Sync,
) -> std::result::Result<Vec<T>, (usize, std::io::Error)> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..threads {
            let (work, stop) = (&work, &stop);
            match builder(t)
                .name(format!("tl-burgers-{t}"))
                .spawn_scoped(s, move || work(t, stop))
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err((t, e));
                }
            }
        }
        Ok(handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect())
    })
}

/// `Draws` stream of pair `i`.
fn stream(seed: u64, i: usize) -> Draws {
    Draws::new(tl_spec::rng::splitmix64(
        seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    ))
}

/// FNV-1a (64 bits) of `bytes`, continuing from `h`.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Largest number of values (pairs × grid) a set may hold: 2³⁰ f32 per field, 4 GiB each.
const MAX_VALUES: usize = 1 << 30;

impl PaperData {
    /// Check the parameters before anything input-sized is allocated.
    pub fn validate(&self) -> Result<()> {
        let g = self.source_grid;
        if !(g.is_power_of_two() && g >= 8) {
            return Err(CliError::new(format!(
                "Burgers source grid {g}: the solver needs a power of two ≥ 8"
            )));
        }
        let pairs = self.n_train.checked_add(self.n_test);
        match pairs.and_then(|p| p.checked_mul(g)) {
            Some(v) if v <= MAX_VALUES && self.n_train >= 1 && self.n_test >= 1 => {}
            _ => {
                return Err(CliError::new(format!(
                    "Burgers data set of {} + {} pairs on {g} points: need at least one pair in each split and at most {MAX_VALUES} values",
                    self.n_train, self.n_test
                )));
            }
        }
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(CliError::new(format!(
                    "Burgers data set: {name} {v} must be a finite value > 0"
                )))
            }
        };
        positive("ν", self.nu)?;
        positive("T", self.t_end)?;
        positive("dt", self.dt)?;
        positive("σ", self.grf.sigma)?;
        positive("τ", self.grf.tau)?;
        positive("γ", self.grf.gamma)
    }

    /// Pairs in both splits.
    pub fn pairs(&self) -> usize {
        self.n_train + self.n_test
    }

    /// The cache key: every parameter, exactly (floats in Rust's round-trip form).
    pub fn key(&self) -> BTreeMap<String, String> {
        let f = |v: f64| format!("{v:?}");
        BTreeMap::from([
            ("format".to_owned(), CACHE_FORMAT.to_owned()),
            (
                "equation".to_owned(),
                "burgers on (0,1), periodic".to_owned(),
            ),
            ("solver".to_owned(), "ifrk4, 2/3 dealiased".to_owned()),
            ("seed".to_owned(), self.seed.to_string()),
            ("source_grid".to_owned(), self.source_grid.to_string()),
            ("n_train".to_owned(), self.n_train.to_string()),
            ("n_test".to_owned(), self.n_test.to_string()),
            ("nu".to_owned(), f(self.nu)),
            ("t_end".to_owned(), f(self.t_end)),
            ("dt".to_owned(), f(self.dt)),
            ("grf_sigma".to_owned(), f(self.grf.sigma)),
            ("grf_tau".to_owned(), f(self.grf.tau)),
            ("grf_gamma".to_owned(), f(self.grf.gamma)),
        ])
    }

    /// The cache file's name in `dir`: `burgers-fno-paper-<hash of the key>.safetensors`.
    pub fn cache_path(&self, dir: &Path) -> PathBuf {
        let text: String = self
            .key()
            .iter()
            .map(|(k, v)| format!("{k}={v};"))
            .collect();
        dir.join(format!(
            "burgers-fno-paper-{:016x}.safetensors",
            fnv1a(FNV_START, text.as_bytes())
        ))
    }

    /// Pair `i`: the field and its solution at T, on the source grid.
    pub fn pair(&self, solver: &Solver, i: usize) -> (Vec<f64>, Vec<f64>) {
        let u0 = self.grf.sample(solver, &mut stream(self.seed, i));
        let ut = solver.solve(&u0, self.t_end, self.dt);
        (u0, ut)
    }

    /// Solve every pair on `threads` threads (pair i on thread i mod threads; no more threads
    /// than pairs). A thread the system refuses to start (a `TL_NUM_THREADS` past its limits) is an
    /// error naming the count, after the threads already started have stopped.
    pub fn generate(&self, threads: usize) -> Result<Pairs> {
        self.validate()?;
        let (n, g) = (self.pairs(), self.source_grid);
        let threads = threads.clamp(1, n);
        let rows = on_threads(threads, |_| std::thread::Builder::new(), |t, stop| {
            let solver = Solver::on(g, self.nu, 1.0);
            (t..n)
                .step_by(threads)
                .take_while(|_| !stop.load(Ordering::Relaxed))
                .map(|i| {
                    let (u0, ut) = self.pair(&solver, i);
                    (i, u0, ut)
                })
                .collect::<Vec<Solved>>()
        })
        .map_err(|(t, e)| {
            CliError::new(format!(
                "Burgers data set: cannot start solver thread {} of {threads}: {e} (set TL_NUM_THREADS lower)",
                t + 1
            ))
        })?;
        let (mut u0, mut ut) = (vec![0f32; n * g], vec![0f32; n * g]);
        let mut done = 0;
        for (i, a, b) in rows.into_iter().flatten() {
            let row = i * g..(i + 1) * g;
            for (d, v) in u0[row.clone()].iter_mut().zip(&a) {
                *d = *v as f32;
            }
            for (d, v) in ut[row].iter_mut().zip(&b) {
                *d = *v as f32;
            }
            done += 1;
        }
        if done != n {
            return Err(CliError::new(format!(
                "Burgers data set: a solver thread failed ({done} of {n} pairs solved)"
            )));
        }
        if let Some(bad) = ut.iter().position(|v| !v.is_finite()) {
            return Err(CliError::new(format!(
                "Burgers data set: pair {} diverged (dt {} too large?)",
                bad / g,
                self.dt
            )));
        }
        Ok(Pairs { grid: g, u0, ut })
    }

    /// The file that holds `pairs` under this key.
    fn encode(&self, pairs: &Pairs) -> File {
        let entry = |v: &[f32]| Entry {
            dtype: Dtype::F32,
            dims: vec![self.pairs(), self.source_grid],
            bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let (a, b) = (entry(&pairs.u0), entry(&pairs.ut));
        let mut metadata = self.key();
        metadata.insert(
            "checksum".to_owned(),
            format!("{:016x}", fnv1a(fnv1a(FNV_START, &a.bytes), &b.bytes)),
        );
        File {
            tensors: BTreeMap::from([("u0".to_owned(), a), ("uT".to_owned(), b)]),
            metadata,
        }
    }

    /// Read the cache file at `path`, checking its key, shapes and checksum.
    pub fn read_cache(&self, path: &Path) -> Result<Pairs> {
        let shown = path.display();
        let bad = |why: String| {
            CliError::new(format!(
                "data cache {shown}: {why}; delete the file to make it again"
            ))
        };
        let file = tl_nn::checkpoint::read(path).map_err(|e| bad(e.to_string()))?;
        for (k, want) in self.key() {
            match file.metadata.get(&k) {
                Some(v) if *v == want => {}
                Some(v) => return Err(bad(format!("metadata {k} is {v:?}, expected {want:?}"))),
                None => return Err(bad(format!("no {k} in the metadata"))),
            }
        }
        let dims = [self.pairs(), self.source_grid];
        let mut hash = FNV_START;
        let mut take = |name: &str| -> Result<Vec<f32>> {
            let e = file
                .tensors
                .get(name)
                .ok_or_else(|| bad(format!("no tensor {name}")))?;
            if e.dtype != Dtype::F32 || e.dims != dims {
                return Err(bad(format!(
                    "tensor {name} is {:?} {:?}, expected F32 {dims:?}",
                    e.dtype, e.dims
                )));
            }
            hash = fnv1a(hash, &e.bytes);
            Ok(e.bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        let (u0, ut) = (take("u0")?, take("uT")?);
        let sum = format!("{hash:016x}");
        if file.metadata.get("checksum") != Some(&sum) {
            return Err(bad(format!(
                "checksum {:?} does not match the data ({sum}): the file is damaged",
                file.metadata.get("checksum")
            )));
        }
        Ok(Pairs {
            grid: self.source_grid,
            u0,
            ut,
        })
    }

    /// The set from the cache in `dir`, or solved (on `threads` threads) and written there
    /// first; `log` hears what happens.
    pub fn load_or_generate(
        &self,
        dir: &Path,
        threads: usize,
        log: &mut dyn FnMut(&str),
    ) -> Result<Pairs> {
        self.validate()?;
        let path = self.cache_path(dir);
        std::fs::create_dir_all(dir).map_err(|e| {
            CliError::new(format!(
                "cannot create the data cache directory {}: {e}",
                dir.display()
            ))
        })?;
        match std::fs::metadata(&path) {
            Ok(_) => {
                let p = self.read_cache(&path)?;
                log(&format!("data: read {}", path.display()));
                return Ok(p);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(CliError::new(format!("data cache {}: {e}", path.display())));
            }
        }
        log(&format!(
            "data: solving {} Burgers pairs on {} points ({} thread(s)); written once to {}",
            self.pairs(),
            self.source_grid,
            threads,
            path.display()
        ));
        let start = std::time::Instant::now();
        let pairs = self.generate(threads)?;
        tl_nn::checkpoint::write(&path, &self.encode(&pairs)).map_err(|e| {
            CliError::new(format!(
                "cannot write the data cache {}: {e}",
                path.display()
            ))
        })?;
        log(&format!(
            "data: solved in {:.1} s",
            start.elapsed().as_secs_f64()
        ));
        Ok(pairs)
    }
}

/// The paper's epochs.
pub const PAPER_EPOCHS: usize = 500;
/// The paper's minibatch.
pub const PAPER_BATCH: usize = 20;
/// The paper's learning rate (Adam).
pub const PAPER_LR: f64 = 1e-3;
/// The paper's schedule: the rate is multiplied by [`PAPER_GAMMA`] every this many epochs.
pub const PAPER_STEP_EPOCHS: usize = 100;
/// The paper's decay factor.
pub const PAPER_GAMMA: f64 = 0.5;
/// The paper's code's Adam weight decay (L2, added to the gradient of the loss summed over the
/// batch).
pub const PAPER_WEIGHT_DECAY: f64 = 1e-4;
/// The paper's Fourier modes.
pub const PAPER_MODES: usize = 16;
/// The paper's training grid of the table's first column.
pub const PAPER_GRID: usize = 256;
/// The preset's output scale: the FNO's output is multiplied by this constant, so the network
/// itself fits u(·, 1)/0.01, of order 1 (`Fno1d::with_output_scale`; `--output-scale 1` is the
/// paper's model as published). With ν = 0.1, u(·, 1) is about 1.6% of u0's size (rms about
/// 0.009 against 0.53), and Adam moves each parameter by about the learning rate per step
/// whatever the gradient's size, so without the scale the output bias alone jitters by 1e-3 at
/// lr 1e-3 against targets of 0.009: the relative error then follows lr / rms(u(1)) down the
/// schedule (docs/benchmarks.md, "Why the output scale").
pub const PAPER_OUTPUT_SCALE: f64 = 0.01;

/// What a `--preset fno-paper` checkpoint records beside its parameters (metadata `preset`,
/// `grid`, `modes`, `output_scale`): the model it holds and the grid it was trained at, so
/// `tl eval` and `--resume` rebuild the same model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperModel {
    /// The training grid s.
    pub grid: usize,
    /// Fourier modes.
    pub modes: usize,
    /// The output scale.
    pub output_scale: f64,
}

impl PaperModel {
    /// The metadata value of `preset`.
    pub const PRESET: &'static str = "fno-paper";

    /// Add the metadata entries to `m`.
    pub fn write(&self, m: &mut BTreeMap<String, String>) {
        m.insert("preset".into(), Self::PRESET.into());
        m.insert("grid".into(), self.grid.to_string());
        m.insert("modes".into(), self.modes.to_string());
        m.insert("output_scale".into(), format!("{:?}", self.output_scale));
    }

    /// The entries of a checkpoint's metadata (`None` without a `preset` entry); an error
    /// names the entry that is missing or bad.
    pub fn read(m: &BTreeMap<String, String>) -> std::result::Result<Option<Self>, String> {
        match m.get("preset").map(String::as_str) {
            None => return Ok(None),
            Some(Self::PRESET) => {}
            Some(other) => return Err(format!("unknown preset {other:?} in the metadata")),
        }
        fn get<T: std::str::FromStr>(
            m: &BTreeMap<String, String>,
            k: &str,
        ) -> std::result::Result<T, String> {
            m.get(k).and_then(|v| v.parse().ok()).ok_or_else(|| {
                format!("--preset fno-paper checkpoint without a valid `{k}` in the metadata")
            })
        }
        let model = PaperModel {
            grid: get(m, "grid")?,
            modes: get(m, "modes")?,
            output_scale: get(m, "output_scale")?,
        };
        if model.modes == 0 || !(model.output_scale.is_finite() && model.output_scale > 0.0) {
            return Err(format!("bad --preset fno-paper metadata {model:?}"));
        }
        Ok(Some(model))
    }
}

/// A `--preset fno-paper` run: the data set, the training grid, the super-resolution grid, the
/// modes, the cache directory.
#[derive(Debug, Clone, PartialEq)]
pub struct PaperRun {
    /// The data set.
    pub data: PaperData,
    /// Training (and test) grid s.
    pub grid: usize,
    /// Grid of the zero-shot super-resolution test (the test pairs subsampled there).
    pub super_grid: Option<usize>,
    /// Fourier modes.
    pub modes: usize,
    /// Directory of the data cache.
    pub cache_dir: PathBuf,
    /// The model's output scale ([`PAPER_OUTPUT_SCALE`] unless
    /// [`with_output_scale`](Self::with_output_scale) sets it).
    pub output_scale: f64,
}

/// Check the grid `s` given by `flag` (`--grid`, `--super-grid`): a power of two up to the
/// solver's `source_grid` (its subsampling); a usage error naming the flag and `s` if not.
pub fn check_grid(flag: &str, s: usize, source_grid: usize) -> Result<()> {
    if s.is_power_of_two() && s <= source_grid {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "{flag} {s}: must be a power of two up to {source_grid} (the solver's {source_grid}-point grid subsampled)"
        )))
    }
}

impl PaperRun {
    /// The paper's run at `grid` (`None`: [`PAPER_GRID`]) with `modes` (`None`:
    /// [`PAPER_MODES`]) and the super-resolution grid `super_grid` (`None`: 4·grid, at most the
    /// source grid, none if that is not finer than `grid`; `Some(0)`: none), checked.
    pub fn new(
        data: PaperData,
        grid: Option<usize>,
        super_grid: Option<usize>,
        modes: Option<usize>,
        cache_dir: PathBuf,
    ) -> Result<Self> {
        let grid = grid.unwrap_or(PAPER_GRID);
        let super_grid = match super_grid {
            Some(0) => None,
            Some(s) => Some(s),
            None => Some(grid.saturating_mul(4).min(data.source_grid)).filter(|&s| s > grid),
        };
        let run = PaperRun {
            data,
            grid,
            super_grid,
            modes: modes.unwrap_or(PAPER_MODES),
            cache_dir,
            output_scale: PAPER_OUTPUT_SCALE,
        };
        run.validate()?;
        Ok(run)
    }

    /// The run with the model's output multiplied by `scale` (finite and positive; 1 is the
    /// paper's model as published).
    pub fn with_output_scale(mut self, scale: f64) -> Result<Self> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(CliError::usage(format!(
                "--output-scale {scale}: must be a positive number"
            )));
        }
        self.output_scale = scale;
        Ok(self)
    }

    /// What a checkpoint of this run records.
    pub fn model(&self) -> PaperModel {
        PaperModel {
            grid: self.grid,
            modes: self.modes,
            output_scale: self.output_scale,
        }
    }

    /// Check that a checkpoint's `--preset fno-paper` record (`None`: not a preset checkpoint)
    /// holds this run's model; the grid may differ (the operator is resolution-invariant).
    pub fn check_checkpoint(&self, path: &Path, saved: Option<PaperModel>) -> Result<()> {
        let shown = path.display();
        let Some(saved) = saved else {
            return Err(CliError::new(format!(
                "checkpoint {shown} holds the default fno model, not --preset fno-paper's"
            )));
        };
        if saved.modes != self.modes {
            return Err(CliError::new(format!(
                "checkpoint {shown} has {} modes; this run has --modes {}",
                saved.modes, self.modes
            )));
        }
        if saved.output_scale != self.output_scale {
            return Err(CliError::new(format!(
                "checkpoint {shown} was trained with --output-scale {}; this run has --output-scale {}",
                saved.output_scale, self.output_scale
            )));
        }
        Ok(())
    }

    /// Check the grids and modes against each other and the data; a bad grid or mode count
    /// is a usage error naming its flag (`tl eval` makes one of a checkpoint's values a
    /// runtime error).
    pub fn validate(&self) -> Result<()> {
        self.data.validate()?;
        let src = self.data.source_grid;
        check_grid("--grid", self.grid, src)?;
        if let Some(s) = self.super_grid {
            check_grid("--super-grid", s, src)?;
        }
        let min_grid = self.super_grid.map_or(self.grid, |s| s.min(self.grid));
        // `modes > s/2` rather than `2 * modes > s`: a --modes of 2⁶³ or more (from the command
        // line or a checkpoint) must not overflow.
        if self.modes == 0 || self.modes > min_grid / 2 {
            return Err(CliError::usage(format!(
                "--modes {}: must be between 1 and s/2 = {} (the grid of {min_grid} points keeps at most s/2 Fourier modes)",
                self.modes,
                min_grid / 2
            )));
        }
        Ok(())
    }

    /// The paper's FNO: input (u0, x) lifted to width 64, 4 Fourier layers of `modes` modes
    /// (spectral conv + pointwise 1×1, exact GELU between), projection 64 → 128 → 1.
    pub fn fno_config(&self) -> FnoConfig {
        FnoConfig {
            in_channels: 2,
            out_channels: 1,
            width: 64,
            modes: self.modes,
            layers: 4,
            proj_hidden: 128,
            exact_gelu: true,
        }
    }

    /// The paper's optimizer for `train_len` pairs in batches of `batch` (each of the
    /// `lr` / `optimizer` flags already checked against the paper's): Adam, rate `lr`, halved
    /// every [`PAPER_STEP_EPOCHS`] epochs (StepLR with the epoch's steps), weight decay
    /// [`PAPER_WEIGHT_DECAY`] / batch. The paper's loss is the sum of the batch's relative
    /// errors; ours is their mean (so the log shows the relative error), and Adam's step does
    /// not change when the loss is scaled, except for the L2 weight decay added to the
    /// gradient, which is scaled to match.
    pub fn optimizer(&self, lr: f64, train_len: usize, batch: usize) -> Result<Optimizer> {
        let steps = train_len.div_ceil(batch.max(1)).max(1) as u64;
        Ok(Optimizer::adam(lr)?
            .weight_decay(PAPER_WEIGHT_DECAY / batch.max(1) as f64)?
            .schedule(Schedule::step(
                PAPER_STEP_EPOCHS as u64 * steps,
                PAPER_GAMMA,
            )?)?)
    }

    /// The train and test splits at `grid` and the test split at `super_grid`, from the cache
    /// (made first if absent, on [`tl_nn::threads`] threads, `TL_NUM_THREADS`, but no more
    /// than the cores this process may run on: the solver is bound by them, and more threads
    /// only ask the system for more than it may give).
    pub fn splits(&self, log: &mut dyn FnMut(&str)) -> Result<(Dataset, Dataset, Option<Dataset>)> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pairs =
            self.data
                .load_or_generate(&self.cache_dir, tl_nn::threads().min(cores), log)?;
        let (tr, te) = (0..self.data.n_train, self.data.n_train..self.data.pairs());
        let sup = match self.super_grid {
            Some(s) => Some(Dataset::Fields(pairs.fields(te.clone(), s)?)),
            None => None,
        };
        Ok((
            Dataset::Fields(pairs.fields(tr, self.grid)?),
            Dataset::Fields(pairs.fields(te, self.grid)?),
            sup,
        ))
    }
}

/// The default cache directory: `$TL_CACHE_DIR`, else `$XDG_CACHE_HOME/tl`, else
/// `$HOME/.cache/tl`, else `.tl-cache` in the working directory.
pub fn default_cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("TL_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tl")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("tl")))
        .unwrap_or_else(|| PathBuf::from(".tl-cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small set for the tests: 64 points, 3 + 2 pairs.
    const SMALL: PaperData = PaperData {
        source_grid: 64,
        n_train: 3,
        n_test: 2,
        ..PAPER
    };

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tl-fno-paper-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_set_is_the_same_on_any_number_of_threads() {
        let a = SMALL.generate(1).unwrap();
        assert_eq!(a, SMALL.generate(3).unwrap());
        assert_eq!((a.len(), a.grid), (5, 64));
        // Different pairs differ.
        assert_ne!(a.u0[..64], a.u0[64..128]);
        let f = a.fields(3..5, 16).unwrap();
        assert_eq!((f.grid, f.x.len()), (16, 32));
        assert_eq!(f.x[1], a.u0[3 * 64 + 4]);
        assert_eq!(f.y[16], a.ut[4 * 64]);
        assert!(a.fields(0..1, 48).is_err());
    }

    /// A thread the system refuses to start is an error, not a panic, and the threads already
    /// running are told to stop and joined (they wait for the flag here: without it, a hang).
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    #[test]
    fn a_thread_the_system_refuses_is_an_error() {
        // A stack of 2⁵⁰ bytes is past the address space: pthread_create fails.
        let huge = |t: usize| {
            let b = std::thread::Builder::new();
            if t == 2 { b.stack_size(1 << 50) } else { b }
        };
        let r = on_threads(4, huge, |t, stop| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            t
        });
        let (t, e) = r.unwrap_err();
        assert_eq!(t, 2, "{e}");
        let ok = on_threads(3, |_| std::thread::Builder::new(), |t, _| t * 10).unwrap();
        assert_eq!(ok, [0, 10, 20]);
    }

    #[test]
    fn the_cache_round_trips_and_refuses_damage_and_other_keys() {
        let dir = scratch("cache");
        let mut log = Vec::new();
        let a = SMALL
            .load_or_generate(&dir, 2, &mut |l| log.push(l.to_owned()))
            .unwrap();
        let path = SMALL.cache_path(&dir);
        assert!(path.exists() && log[0].contains("solving"), "{log:?}");
        let b = SMALL
            .load_or_generate(&dir, 2, &mut |l| log.push(l.to_owned()))
            .unwrap();
        assert_eq!(a, b);
        assert!(log.last().unwrap().contains("read"), "{log:?}");
        // Another parameter is another file.
        let other = PaperData {
            dt: SMALL.dt / 2.0,
            ..SMALL
        };
        assert_ne!(other.cache_path(&dir), path);
        // A file under this name with another key is refused, naming the key.
        std::fs::copy(&path, other.cache_path(&dir)).unwrap();
        let e = other
            .read_cache(&other.cache_path(&dir))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("metadata dt") && e.contains("burgers-fno-paper"),
            "{e}"
        );
        // One flipped data byte: the checksum.
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let e = SMALL
            .load_or_generate(&dir, 2, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("checksum") && e.contains(&path.display().to_string()),
            "{e}"
        );
        // Truncated: not safetensors.
        std::fs::write(&path, &bytes[..100]).unwrap();
        let e = SMALL.read_cache(&path).unwrap_err().to_string();
        assert!(
            e.starts_with("data cache") && e.contains("delete the file"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Halving [`PAPER_DT`] changes u(T) of the paper's first `pairs` fields on `grid` points
    /// by less than 1e-8 in the max norm, and less than 1e-6 of its size.
    fn step_converged(grid: usize, pairs: usize) {
        let data = PaperData {
            source_grid: grid,
            ..PAPER
        };
        let solver = Solver::on(grid, data.nu, 1.0);
        for i in 0..pairs {
            let (u0, ut) = data.pair(&solver, i);
            let half = solver.solve(&u0, data.t_end, data.dt / 2.0);
            let size = ut.iter().fold(0f64, |m, v| m.max(v.abs()));
            let diff = ut
                .iter()
                .zip(&half)
                .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                size > 1e-3 && diff < 1e-8 && diff < 1e-6 * size,
                "pair {i}: {diff:e} of {size}"
            );
        }
    }

    /// On 512 points (the dynamics of the 8192-point grid: the fields' modes above 170, which
    /// the 512-point grid drops, hold less than 1e-6 of u0's energy and decay within the first
    /// step), three fields.
    #[test]
    fn the_step_is_converged() {
        step_converged(512, 3);
    }

    /// On the paper's 8192 points, ten fields (slow in a debug build: `cargo test --release -p
    /// tl-cli --lib fno_paper -- --ignored`).
    #[test]
    #[ignore]
    fn the_step_is_converged_on_the_papers_grid() {
        step_converged(8192, 10);
    }

    #[test]
    fn bad_parameters_are_refused_before_solving() {
        for bad in [
            PaperData {
                source_grid: 96,
                ..SMALL
            },
            PaperData { n_test: 0, ..SMALL },
            PaperData {
                n_train: usize::MAX,
                ..SMALL
            },
            PaperData { dt: 0.0, ..SMALL },
        ] {
            assert!(bad.generate(1).is_err(), "{bad:?}");
        }
    }
}
