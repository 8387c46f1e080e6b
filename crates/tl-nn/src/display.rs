//! Seeing a model: [`tree`] prints it as PyTorch's `print(model)` does (the layers'
//! `Display` is the same text), and [`Runtime::summary`] tabulates its layers with their
//! parameter shapes and counts.

use std::fmt;

use tl_session::Train;

use crate::runtime::is_buffer;
use crate::{
    Activation, AvgPool, BatchNorm, Conv, ConvTranspose, Dropout, Embedding, Flatten, GroupNorm,
    LayerNorm, Linear, MaxPool, MultiHeadAttention, Parameters, Result, RmsNorm, Runtime,
    Sequential, SpectralConv1d, UserLayer,
};

/// The printed name of an absent `Option` module.
pub(crate) const NONE: &str = "None";

/// `my_crate::model::Block<tl_session::Session<f32>>` → `Block`.
pub(crate) fn short_type_name(full: &str) -> String {
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base).trim().to_owned()
}

/// A float as Python prints it (`1e-05`, `0.1`, `1.0`), for PyTorch-like settings.
pub(crate) fn py_float(v: f64) -> String {
    if v.is_finite() && v != 0.0 && !(1e-4..1e16).contains(&v.abs()) {
        let s = format!("{v:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        format!("{mantissa}e{sign}{digits:0>2}")
    } else if v.is_finite() && v.fract() == 0.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// A tuple as Python prints it: `(3, 3)`, `(3,)`.
pub(crate) fn py_tuple(v: &[usize]) -> String {
    match v {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            v.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `True` / `False`.
pub(crate) fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// `module` printed as PyTorch prints a module: `Name(settings)` for a layer, and for a
/// module with children one `(name): child` line each, indented:
///
/// ```text
/// Sequential(
///   (0): Linear(in_features=64, out_features=32, bias=True)
///   (1): ReLU()
///   (2): Linear(in_features=32, out_features=10, bias=True)
/// )
/// ```
///
/// Sequential and every layer's `Display` print this; a model of your own prints it through
/// `tree(&model)` (its children are what `#[derive(Parameters)]` names: its fields). PyTorch:
/// `print(model)`.
pub fn tree(module: &dyn Parameters) -> Tree<'_> {
    Tree(module)
}

/// A module as a printable tree; see [`tree`].
#[derive(Clone, Copy)]
pub struct Tree<'a>(pub &'a dyn Parameters);

impl fmt::Display for Tree<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&repr(self.0))
    }
}

/// PyTorch's `Module.__repr__`.
fn repr(m: &dyn Parameters) -> String {
    let (name, extra) = (m.module_name(), m.extra_repr());
    let mut children = Vec::new();
    m.visit_children(&mut |key, child| {
        // Every line of the child's text but its first is indented by two (`_addindent`).
        children.push(format!("({key}): {}", repr(child).replace('\n', "\n  ")));
    });
    if name == NONE && extra.is_empty() && children.is_empty() {
        return NONE.into();
    }
    let extra_lines: Vec<&str> = if extra.is_empty() {
        Vec::new()
    } else {
        extra.lines().collect()
    };
    let mut out = format!("{name}(");
    if extra_lines.len() == 1 && children.is_empty() {
        out.push_str(extra_lines[0]);
    } else if !extra_lines.is_empty() || !children.is_empty() {
        let lines: Vec<&str> = extra_lines
            .into_iter()
            .chain(children.iter().map(String::as_str))
            .collect();
        out.push_str("\n  ");
        out.push_str(&lines.join("\n  "));
        out.push('\n');
    }
    out.push(')');
    out
}

/// `impl Display` as [`tree`] for each type.
macro_rules! display_as_tree {
    ($($t:ty),* $(,)?) => {
        $(
            impl fmt::Display for $t {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str(&repr(self))
                }
            }
        )*
    };
}

display_as_tree!(
    Activation,
    Flatten,
    Linear,
    Conv,
    ConvTranspose,
    MaxPool,
    AvgPool,
    LayerNorm,
    BatchNorm,
    RmsNorm,
    GroupNorm,
    Embedding,
    MultiHeadAttention,
    Dropout,
    SpectralConv1d,
    UserLayer,
);

impl<O: Train> fmt::Display for Sequential<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&repr(self))
    }
}

/// One row of a [`Summary`]: a module without children (a layer), or the parameters a
/// module with children lists beyond theirs.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// The path of children names from the model (`blocks.0.up`; empty for the model itself).
    pub path: String,
    /// The printed type ([`Parameters::module_name`]: `Linear`, `Conv2d`, `ReLU`).
    pub module: String,
    /// The parameters and buffers, each with its full name (as in checkpoints) and dims.
    pub params: Vec<(String, Vec<usize>)>,
    /// The number of parameter values, buffers not counted.
    pub count: usize,
    /// The number of buffer values (batch norm's running statistics).
    pub buffers: usize,
}

/// A model's layers with their parameter shapes and counts; `Display` prints a table.
/// PyTorch: `torchinfo.summary(model)` (without output shapes).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// One row per layer, in the model's order.
    pub rows: Vec<SummaryRow>,
    /// The parameter values of all rows (buffers not counted).
    pub total: usize,
    /// The trainable ones: [`Runtime::num_params`].
    pub trainable: usize,
}

impl<O: Train> Runtime<O> {
    /// `model`'s layers (the leaves of its [`tree`]), each with its path, type, parameter
    /// names and shapes and parameter count; totals of all and of the trainable parameters
    /// (`trainable` is [`Runtime::num_params`], and the rows' counts add up to `total`). An
    /// error like `num_params` when the model does not list a parameter its passes used.
    pub fn summary<M: Parameters>(&self, model: &M) -> Result<Summary> {
        self.check_listed("Runtime::summary", model)?;
        let trainable = self.num_params(model)?;
        let mut rows = Vec::new();
        self.summary_rows(model, String::new(), &mut rows);
        let total = rows.iter().map(|r| r.count).sum();
        Ok(Summary {
            rows,
            total,
            trainable,
        })
    }

    /// The rows of `m` at `path`: one for the parameters it lists beyond its children's (all
    /// of them for a layer), then its children's.
    fn summary_rows(&self, m: &dyn Parameters, path: String, rows: &mut Vec<SummaryRow>) {
        let mut own = Vec::new();
        m.visit_params(&mut |p| own.push(p.clone()));
        let mut below = Vec::new();
        let mut has_children = false;
        m.visit_children(&mut |key, child| {
            has_children = true;
            child.visit_params(&mut |p| {
                if let Some(i) = own.iter().position(|q| q == p) {
                    own.remove(i);
                }
            });
            let child_path = if path.is_empty() {
                key.to_owned()
            } else {
                format!("{path}.{key}")
            };
            self.summary_rows(child, child_path, &mut below);
        });
        let absent = m.module_name() == NONE && !has_children && own.is_empty();
        if !absent && (!has_children || !own.is_empty()) {
            let mut row = SummaryRow {
                path,
                module: m.module_name(),
                params: Vec::new(),
                count: 0,
                buffers: 0,
            };
            for p in own {
                let name = self.name_of(&p);
                let n = p.shape().numel();
                if is_buffer(&name) {
                    row.buffers += n;
                } else {
                    row.count += n;
                }
                row.params.push((name, p.shape().dims().to_vec()));
            }
            rows.push(row);
        }
        rows.append(&mut below);
    }
}

/// `1234567` → `1,234,567`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A table: path, type, parameters (last name segment and dims), count; then the totals.
///
/// ```text
/// layer  type    parameters                  count
/// 0      Linear  weight [32, 64], bias [32]  2,080
/// 1      ReLU                                    0
/// 2      Linear  weight [10, 32], bias [10]    330
/// total params: 2,410
/// trainable params: 2,410
/// non-trainable params: 0
/// ```
impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cells: Vec<[String; 4]> = self
            .rows
            .iter()
            .map(|r| {
                let params = r
                    .params
                    .iter()
                    .map(|(name, dims)| {
                        let short = name.rsplit('.').next().unwrap_or(name);
                        format!("{short} {dims:?}")
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let path = if r.path.is_empty() { "-" } else { &r.path };
                [
                    path.to_owned(),
                    r.module.clone(),
                    params,
                    thousands(r.count),
                ]
            })
            .collect();
        let header = ["layer", "type", "parameters", "count"].map(String::from);
        let mut width = [0usize; 4];
        for row in std::iter::once(&header).chain(&cells) {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        for row in std::iter::once(&header).chain(&cells) {
            writeln!(
                f,
                "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}",
                row[0],
                row[1],
                row[2],
                row[3],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2],
                w3 = width[3]
            )?;
        }
        let buffers: usize = self.rows.iter().map(|r| r.buffers).sum();
        writeln!(f, "total params: {}", thousands(self.total))?;
        writeln!(f, "trainable params: {}", thousands(self.trainable))?;
        write!(
            f,
            "non-trainable params: {}",
            thousands(self.total.saturating_sub(self.trainable))
        )?;
        if buffers > 0 {
            write!(f, "\nbuffer values: {}", thousands(buffers))?;
        }
        Ok(())
    }
}
