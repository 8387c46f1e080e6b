//! [`Lstm`] and [`Gru`]: multi-layer recurrent layers with PyTorch's formulas, gate order,
//! parameter names and initialisation, composed from the ops every session has (linear,
//! sigmoid, tanh, reshape, slices, concatenation), so they run eager (CPU, CUDA sim, CUDA) and
//! linked, and their gradients are the ops' gradients. PyTorch: `nn.LSTM`, `nn.GRU`.
//!
//! The time loop is unrolled: a sequence of length T records about 25 ops per step and layer.

use tl_session::{Param, Train};

use crate::error::usage;
use crate::{Init, Linear, Module, Parameters, Result, Var, Vars};

/// The options of [`Lstm`] and [`Gru`] beyond the sizes, with PyTorch's defaults: one layer,
/// biases, sequence-first input `(T, B, features)`, no dropout between layers.
///
/// ```
/// let cfg = tl_nn::RnnConfig::default().num_layers(2).batch_first(true);
/// assert_eq!((cfg.num_layers, cfg.bias, cfg.batch_first), (2, true, true));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RnnConfig {
    /// Stacked layers (≥ 1); layer `l > 0` reads layer `l − 1`'s output sequence.
    /// PyTorch: `num_layers`.
    pub num_layers: usize,
    /// Whether each layer has the biases `bias_ih_l{l}` and `bias_hh_l{l}`. PyTorch: `bias`.
    pub bias: bool,
    /// Input and output `(B, T, features)` instead of `(T, B, features)` (the states stay
    /// `(num_layers, B, H)`, as in PyTorch). PyTorch: `batch_first`.
    pub batch_first: bool,
    /// Dropout probability on each layer's output except the last, in training passes only
    /// (`0 ≤ p < 1`). PyTorch: `dropout`.
    pub dropout: f64,
}

impl Default for RnnConfig {
    fn default() -> Self {
        RnnConfig {
            num_layers: 1,
            bias: true,
            batch_first: false,
            dropout: 0.0,
        }
    }
}

impl RnnConfig {
    /// With `n` stacked layers.
    pub fn num_layers(self, n: usize) -> Self {
        RnnConfig {
            num_layers: n,
            ..self
        }
    }

    /// With or without biases.
    pub fn bias(self, bias: bool) -> Self {
        RnnConfig { bias, ..self }
    }

    /// Batch-first `(B, T, features)` input and output, or not.
    pub fn batch_first(self, batch_first: bool) -> Self {
        RnnConfig {
            batch_first,
            ..self
        }
    }

    /// With dropout probability `p` between layers.
    pub fn dropout(self, p: f64) -> Self {
        RnnConfig { dropout: p, ..self }
    }
}

/// The weights of one layer, as PyTorch names them under the layer's prefix (`l` the layer):
/// `weight_ih_l{l}` (G·H, in), `weight_hh_l{l}` (G·H, H), `bias_ih_l{l}` and `bias_hh_l{l}`
/// (G·H), the G gates stacked in PyTorch's order (LSTM: i, f, g, o; GRU: r, z, n).
#[derive(Debug, Clone)]
pub struct RnnWeights {
    /// Input-to-hidden weight (G·H, in).
    pub weight_ih: Param,
    /// Hidden-to-hidden weight (G·H, H).
    pub weight_hh: Param,
    /// Input-to-hidden bias (G·H), when the layer has biases.
    pub bias_ih: Option<Param>,
    /// Hidden-to-hidden bias (G·H), when the layer has biases.
    pub bias_hh: Option<Param>,
}

impl Parameters for RnnWeights {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight_ih);
        f(&self.weight_hh);
        self.bias_ih.visit_params(f);
        self.bias_hh.visit_params(f);
    }
}

impl RnnWeights {
    /// The input-to-hidden map as a [`Linear`] (same parameters).
    fn ih(&self) -> Linear {
        Linear {
            weight: self.weight_ih.clone(),
            bias: self.bias_ih.clone(),
        }
    }

    /// The hidden-to-hidden map as a [`Linear`] (same parameters).
    fn hh(&self) -> Linear {
        Linear {
            weight: self.weight_hh.clone(),
            bias: self.bias_hh.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    Lstm,
    Gru,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }

    /// The layer's name in errors (PyTorch's class name).
    fn name(self) -> &'static str {
        match self {
            Cell::Lstm => "LSTM",
            Cell::Gru => "GRU",
        }
    }

    fn new_op(self) -> &'static str {
        match self {
            Cell::Lstm => "Lstm::new",
            Cell::Gru => "Gru::new",
        }
    }

    /// The method `call` as its errors name it (`Lstm::forward_state`).
    fn op(self, call: Call) -> &'static str {
        match (self, call) {
            (Cell::Lstm, Call::Forward) => "Lstm::forward",
            (Cell::Lstm, Call::ForwardState) => "Lstm::forward_state",
            (Cell::Gru, Call::Forward) => "Gru::forward",
            (Cell::Gru, Call::ForwardState) => "Gru::forward_state",
        }
    }
}

/// The public method a pass came through, which its errors name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// [`Module::forward`].
    Forward,
    /// `Lstm::forward_state` / `Gru::forward_state`.
    ForwardState,
}

/// What both layers hold: the sizes, the options and each layer's weights.
#[derive(Debug, Clone)]
struct Stack {
    cell: Cell,
    path: String,
    input_size: usize,
    hidden_size: usize,
    config: RnnConfig,
    layers: Vec<RnnWeights>,
}

/// A state tensor per layer: (B, H) each.
type States<'g, O> = Vec<Var<'g, O>>;

impl Stack {
    fn new<O: Train>(
        cell: Cell,
        vars: &Vars<'_, O>,
        input_size: usize,
        hidden_size: usize,
        config: RnnConfig,
    ) -> Result<Self> {
        let path = vars.full_name("").trim_end_matches('.').to_owned();
        let bad = |detail: String| {
            Err(usage(
                cell.new_op(),
                format!("{} {path:?}: {detail}", cell.name()),
            ))
        };
        if input_size == 0 {
            return bad("input_size must be ≥ 1, got 0".into());
        }
        if hidden_size == 0 {
            return bad("hidden_size must be ≥ 1, got 0".into());
        }
        if config.num_layers == 0 {
            return bad("num_layers must be ≥ 1, got 0".into());
        }
        if !(0.0..1.0).contains(&config.dropout) {
            return bad(format!(
                "dropout must be a probability in [0, 1), got {}",
                config.dropout
            ));
        }
        let rows = hidden_size.checked_mul(cell.gates()).ok_or_else(|| {
            usage(
                cell.new_op(),
                format!(
                    "{} {path:?}: {} gates × hidden_size {hidden_size} overflow usize",
                    cell.name(),
                    cell.gates()
                ),
            )
        })?;
        // The whole model's size, checked before anything is allocated (a huge num_layers of
        // small layers is an error, not a long loop that ends in an abort).
        let (layers, name) = (config.num_layers, cell.name());
        crate::models::check_params::<O>(
            cell.new_op(),
            &format_args!("{name} {path:?} of {layers} layer(s) of hidden_size {hidden_size}"),
            &[
                // weight_ih of the first layer and of the others, weight_hh, the two biases.
                (1, &[rows, input_size]),
                (layers - 1, &[rows, hidden_size]),
                (layers, &[rows, hidden_size]),
                (layers, &[2, rows]),
            ],
        )?;
        // PyTorch: every weight and bias uniform in ±1/√H.
        let k = 1.0 / (hidden_size as f64).sqrt();
        let init = Init::Uniform { lo: -k, hi: k };
        let mut layers = Vec::new();
        for l in 0..config.num_layers {
            let inputs = if l == 0 { input_size } else { hidden_size };
            let weight_ih = vars.param(&format!("weight_ih_l{l}"), &[rows, inputs], init)?;
            let weight_hh = vars.param(&format!("weight_hh_l{l}"), &[rows, hidden_size], init)?;
            let (bias_ih, bias_hh) = if config.bias {
                (
                    Some(vars.param(&format!("bias_ih_l{l}"), &[rows], init)?),
                    Some(vars.param(&format!("bias_hh_l{l}"), &[rows], init)?),
                )
            } else {
                (None, None)
            };
            layers.push(RnnWeights {
                weight_ih,
                weight_hh,
                bias_ih,
                bias_hh,
            });
        }
        Ok(Stack {
            cell,
            path,
            input_size,
            hidden_size,
            config,
            layers,
        })
    }

    /// An error of the method `call`, naming the layer.
    fn error(&self, call: Call, detail: String) -> crate::Error {
        usage(
            self.cell.op(call),
            format!("{} {:?}: {detail}", self.cell.name(), self.path),
        )
    }

    /// The input's (T, B) and whether it is unbatched, from its shape.
    fn geometry<O: Train>(&self, call: Call, x: &Var<'_, O>) -> Result<(usize, usize, bool)> {
        let (t, b, unbatched) = match (x.dims(), self.config.batch_first) {
            ([t, _], _) => (*t, 1, true),
            ([b, t, _], true) => (*t, *b, false),
            ([t, b, _], false) => (*t, *b, false),
            _ => {
                let layout = if self.config.batch_first {
                    "(B, T, features)"
                } else {
                    "(T, B, features)"
                };
                return Err(self.error(
                    call,
                    format!(
                        "x must be {layout} or unbatched (T, features), got {}",
                        x.shape()
                    ),
                ));
            }
        };
        let features = x.dims()[x.dims().len() - 1];
        if features != self.input_size {
            return Err(self.error(
                call,
                format!(
                    "x {} must end in the layer's {} input features, got {features}",
                    x.shape(),
                    self.input_size
                ),
            ));
        }
        if t == 0 || b == 0 {
            return Err(self.error(
                call,
                format!(
                    "x {} has an empty sequence or batch (T = {t}, B = {b})",
                    x.shape()
                ),
            ));
        }
        Ok((t, b, unbatched))
    }

    /// An initial state `(num_layers, B, H)` (or `(num_layers, H)` unbatched) split per
    /// layer into (B, H); zeros when absent.
    fn initial<'g, O: Train>(
        &self,
        call: Call,
        x: &Var<'g, O>,
        name: &str,
        state: Option<&Var<'g, O>>,
        b: usize,
        unbatched: bool,
    ) -> Result<States<'g, O>> {
        let (l, h) = (self.layers.len(), self.hidden_size);
        let Some(s) = state else {
            let zeros = x.scope().full(&[b, h], 0.0)?;
            return Ok(vec![zeros; l]);
        };
        let want: Vec<usize> = if unbatched { vec![l, h] } else { vec![l, b, h] };
        if s.dims() != want.as_slice() {
            return Err(self.error(
                call,
                format!(
                    "{name} must be (num_layers, {}H) = {want:?} for x {}, got {}",
                    if unbatched { "" } else { "B, " },
                    x.shape(),
                    s.shape()
                ),
            ));
        }
        let s = s.reshape(&[l * b, h])?;
        (0..l).map(|i| s.narrow0(i * b, b)).collect()
    }

    /// The input as (T, B, in).
    fn time_major<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        t: usize,
        unbatched: bool,
    ) -> Result<Var<'g, O>> {
        if unbatched {
            x.reshape(&[t, 1, self.input_size])
        } else if self.config.batch_first {
            swap01(x)
        } else {
            Ok(x.clone())
        }
    }

    /// Run every layer over the sequence: the last layer's output sequence (in the input's
    /// layout) and each state's final value per layer as `(num_layers, B, H)` (or
    /// `(num_layers, H)` unbatched). `states` holds one initial state per layer for each of the
    /// cell's state tensors (LSTM: h, c; GRU: h).
    fn run<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        states: Vec<States<'g, O>>,
        t: usize,
        b: usize,
        unbatched: bool,
    ) -> Result<(Var<'g, O>, Vec<Var<'g, O>>)> {
        let h = self.hidden_size;
        let last = self.layers.len() - 1;
        let mut seq = self.time_major(x, t, unbatched)?;
        let mut finals: Vec<Vec<Var<'g, O>>> = vec![Vec::new(); states.len()];
        for (l, w) in self.layers.iter().enumerate() {
            // The input projections of every step at once: (T·B, G·H).
            let gi = w.ih().forward(&seq)?;
            let gi = gi.reshape(&[t * b, self.cell.gates() * h])?;
            let hh = w.hh();
            let mut state: Vec<Var<'g, O>> = states.iter().map(|s| s[l].clone()).collect();
            let mut outs = Vec::with_capacity(t);
            for step in 0..t {
                let gi_t = gi.narrow0(step * b, b)?;
                let gh = hh.forward(&state[0])?;
                state = match self.cell {
                    Cell::Lstm => lstm_step(&gi_t, &gh, &state[1], b)?,
                    Cell::Gru => vec![gru_step(&gi_t, &gh, &state[0], b)?],
                };
                outs.push(state[0].clone());
            }
            for (f, s) in finals.iter_mut().zip(state) {
                f.push(s);
            }
            seq = cat0(outs)?.reshape(&[t, b, h])?;
            if l < last && self.config.dropout > 0.0 && x.scope().training() {
                seq = seq.dropout(1.0 - self.config.dropout)?;
            }
        }
        let out = if unbatched {
            seq.reshape(&[t, h])?
        } else if self.config.batch_first {
            swap01(&seq)?
        } else {
            seq
        };
        let n = self.layers.len();
        let dims: Vec<usize> = if unbatched { vec![n, h] } else { vec![n, b, h] };
        let finals = finals
            .into_iter()
            .map(|f| cat0(f)?.reshape(&dims))
            .collect::<Result<_>>()?;
        Ok((out, finals))
    }

    /// The `N` final states `run` returned.
    fn finals<'g, O: Train, const N: usize>(
        &self,
        call: Call,
        finals: Vec<Var<'g, O>>,
    ) -> Result<[Var<'g, O>; N]> {
        let n = finals.len();
        finals
            .try_into()
            .map_err(|_| self.error(call, format!("expected {N} final states, got {n}")))
    }

    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        self.layers.visit_params(f)
    }
}

/// `v` (B, G·H) split into its G gates, each (B, H).
fn gates<'g, O: Train>(v: &Var<'g, O>, b: usize, g: usize) -> Result<Vec<Var<'g, O>>> {
    let h = v.dims()[1] / g;
    // (B, G, H) → (G, B, H) → (G·B, H): gate k is rows k·B..(k+1)·B.
    let by_gate = swap01(&v.reshape(&[b, g, h])?)?.reshape(&[g * b, h])?;
    (0..g).map(|k| by_gate.narrow0(k * b, b)).collect()
}

/// One LSTM step from the input and hidden projections: `[h', c']`.
fn lstm_step<'g, O: Train>(
    gi: &Var<'g, O>,
    gh: &Var<'g, O>,
    c: &Var<'g, O>,
    b: usize,
) -> Result<Vec<Var<'g, O>>> {
    let z = gates(&(gi + gh)?, b, 4)?;
    let (i, f, g, o) = (
        z[0].sigmoid()?,
        z[1].sigmoid()?,
        z[2].tanh()?,
        z[3].sigmoid()?,
    );
    let c = ((&f * c)? + (&i * &g)?)?;
    let h = (&o * &c.tanh()?)?;
    Ok(vec![h, c])
}

/// One GRU step: `h' = n + z·(h − n)` (PyTorch's `(1 − z)·n + z·h`, as its kernels write it).
fn gru_step<'g, O: Train>(
    gi: &Var<'g, O>,
    gh: &Var<'g, O>,
    h: &Var<'g, O>,
    b: usize,
) -> Result<Var<'g, O>> {
    let (xi, hi) = (gates(gi, b, 3)?, gates(gh, b, 3)?);
    let r = (&xi[0] + &hi[0])?.sigmoid()?;
    let z = (&xi[1] + &hi[1])?.sigmoid()?;
    let n = (&xi[2] + &(&r * &hi[2])?)?.tanh()?;
    &n + &(&z * &(h - &n)?)?
}

/// Axes 0 and 1 swapped. PyTorch: `x.transpose(0, 1)`.
fn swap01<'g, O: Train>(x: &Var<'g, O>) -> Result<Var<'g, O>> {
    x.op("rnn", &[], |s| s.swap_adjacent(x.tensor_ref(), 0))
}

/// The parts joined along axis 0, pairwise in a balanced tree (each element copied
/// `log₂ n` times, not `n`).
fn cat0<'g, O: Train>(mut parts: Vec<Var<'g, O>>) -> Result<Var<'g, O>> {
    while parts.len() > 1 {
        let mut next = Vec::with_capacity(parts.len().div_ceil(2));
        let mut it = parts.into_iter();
        while let Some(a) = it.next() {
            next.push(match it.next() {
                Some(b) => a.concat0(&b)?,
                None => a,
            });
        }
        parts = next;
    }
    parts
        .pop()
        .ok_or_else(|| usage("rnn", "nothing to concatenate (an empty sequence)"))
}

macro_rules! accessors {
    () => {
        /// The number of input features.
        pub fn input_size(&self) -> usize {
            self.stack.input_size
        }

        /// The number of hidden features H.
        pub fn hidden_size(&self) -> usize {
            self.stack.hidden_size
        }

        /// The options it was built with.
        pub fn config(&self) -> RnnConfig {
            self.stack.config
        }

        /// Each layer's weights, layer 0 first.
        pub fn layers(&self) -> &[RnnWeights] {
            &self.stack.layers
        }
    };
}

/// A multi-layer LSTM with PyTorch's formulas and gate order (i, f, g, o):
/// `i, f, g, o = σ(·), σ(·), tanh(·), σ(·)` of `W_ih x + b_ih + W_hh h + b_hh`,
/// `c' = f·c + i·g`, `h' = o·tanh(c')`. Input `(T, B, in)` (`(B, T, in)` batch-first, or
/// unbatched `(T, in)`); states `(num_layers, B, H)`. Parameters as PyTorch names them
/// (`weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0`, `…_l1`, …), each uniform in
/// ±1/√H, so a PyTorch `state_dict` loads with [`crate::Runtime::load`]. PyTorch:
/// `nn.LSTM(input_size, hidden_size, num_layers, bias, batch_first, dropout)` (not
/// bidirectional, no projection).
///
/// [`Module::forward`] returns the output sequence; [`Lstm::forward_state`] also takes an
/// initial state and returns the final one.
#[derive(Debug, Clone)]
pub struct Lstm {
    stack: Stack,
}

impl Lstm {
    /// An LSTM from `input_size` features to `hidden_size`, with `config`'s options.
    pub fn new<O: Train>(
        vars: &Vars<'_, O>,
        input_size: usize,
        hidden_size: usize,
        config: RnnConfig,
    ) -> Result<Self> {
        Ok(Lstm {
            stack: Stack::new(Cell::Lstm, vars, input_size, hidden_size, config)?,
        })
    }

    accessors!();

    /// The output sequence (`(T, B, H)`, `(B, T, H)` batch-first, `(T, H)` unbatched) and the
    /// final `(h_n, c_n)`, each `(num_layers, B, H)` (`(num_layers, H)` unbatched), from the
    /// initial `(h_0, c_0)` of those shapes (zeros when `None`). PyTorch:
    /// `output, (h_n, c_n) = lstm(x, (h_0, c_0))`. Errors name `Lstm::forward_state`, the
    /// layer and the shapes.
    #[allow(clippy::type_complexity)]
    pub fn forward_state<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        state: Option<(&Var<'g, O>, &Var<'g, O>)>,
    ) -> Result<(Var<'g, O>, (Var<'g, O>, Var<'g, O>))> {
        self.pass(Call::ForwardState, x, state)
    }

    /// [`Lstm::forward_state`] for the method `call` (which its errors name).
    #[allow(clippy::type_complexity)]
    fn pass<'g, O: Train>(
        &self,
        call: Call,
        x: &Var<'g, O>,
        state: Option<(&Var<'g, O>, &Var<'g, O>)>,
    ) -> Result<(Var<'g, O>, (Var<'g, O>, Var<'g, O>))> {
        let s = &self.stack;
        let (t, b, unbatched) = s.geometry(call, x)?;
        let h0 = s.initial(call, x, "h_0", state.map(|s| s.0), b, unbatched)?;
        let c0 = s.initial(call, x, "c_0", state.map(|s| s.1), b, unbatched)?;
        let (out, finals) = s.run(x, vec![h0, c0], t, b, unbatched)?;
        let [h, c] = s.finals(call, finals)?;
        Ok((out, (h, c)))
    }
}

impl Parameters for Lstm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.stack.visit(f)
    }
}

impl<O: Train> Module<O> for Lstm {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        Ok(self.pass(Call::Forward, x, None)?.0)
    }
}

/// A multi-layer GRU with PyTorch's formulas and gate order (r, z, n):
/// `r = σ(W_ir x + b_ir + W_hr h + b_hr)`, `z` likewise, `n = tanh(W_in x + b_in + r·(W_hn h +
/// b_hn))`, `h' = (1 − z)·n + z·h`. Shapes, options, names and initialisation as [`Lstm`]'s.
/// PyTorch: `nn.GRU(input_size, hidden_size, num_layers, bias, batch_first, dropout)` (not
/// bidirectional).
///
/// [`Module::forward`] returns the output sequence; [`Gru::forward_state`] also takes an
/// initial state and returns the final one.
#[derive(Debug, Clone)]
pub struct Gru {
    stack: Stack,
}

impl Gru {
    /// A GRU from `input_size` features to `hidden_size`, with `config`'s options.
    pub fn new<O: Train>(
        vars: &Vars<'_, O>,
        input_size: usize,
        hidden_size: usize,
        config: RnnConfig,
    ) -> Result<Self> {
        Ok(Gru {
            stack: Stack::new(Cell::Gru, vars, input_size, hidden_size, config)?,
        })
    }

    accessors!();

    /// The output sequence (`(T, B, H)`, `(B, T, H)` batch-first, `(T, H)` unbatched) and the
    /// final `h_n` (`(num_layers, B, H)`, `(num_layers, H)` unbatched) from the initial `h_0`
    /// of that shape (zeros when `None`). PyTorch: `output, h_n = gru(x, h_0)`. Errors name
    /// `Gru::forward_state`, the layer and the shapes.
    pub fn forward_state<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        h0: Option<&Var<'g, O>>,
    ) -> Result<(Var<'g, O>, Var<'g, O>)> {
        self.pass(Call::ForwardState, x, h0)
    }

    /// [`Gru::forward_state`] for the method `call` (which its errors name).
    fn pass<'g, O: Train>(
        &self,
        call: Call,
        x: &Var<'g, O>,
        h0: Option<&Var<'g, O>>,
    ) -> Result<(Var<'g, O>, Var<'g, O>)> {
        let s = &self.stack;
        let (t, b, unbatched) = s.geometry(call, x)?;
        let h0 = s.initial(call, x, "h_0", h0, b, unbatched)?;
        let (out, finals) = s.run(x, vec![h0], t, b, unbatched)?;
        let [h] = s.finals(call, finals)?;
        Ok((out, h))
    }
}

impl Parameters for Gru {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.stack.visit(f)
    }
}

impl<O: Train> Module<O> for Gru {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        Ok(self.pass(Call::Forward, x, None)?.0)
    }
}
