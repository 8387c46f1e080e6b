//! [`Module`] and [`Parameters`]: what a layer or a model is, [`Sequential`] to chain them, and
//! [`Flatten`] (the activations as modules: [`crate::Activation`]).

use tl_session::{Param, Train};

use crate::{Result, Var};

/// Something that owns parameters. PyTorch: `nn.Module.parameters()` and its buffers, and
/// what `print(model)` shows.
///
/// Write it with `#[derive(Parameters)]` (re-exported from `tl-nn-derive`): the derive visits
/// every field in order and names the fields as the model's children. A hand-written
/// `visit_params` must list every parameter the model's forward pass uses: one it leaves out
/// is an error at `Runtime::step`, `save` and `num_params` (see [`crate::Runtime`], "Listed
/// parameters").
pub trait Parameters {
    /// Call `f` on every parameter (and buffer), in a fixed order: the order of
    /// `named_params_of` and of checkpoints.
    fn visit_params(&self, f: &mut dyn FnMut(&Param));

    /// Call `f` on each sub-module with its name, in order: what [`crate::tree`] prints
    /// under this module and what [`crate::Runtime::summary`] breaks it into. PyTorch:
    /// `named_children()`. The derive names the fields; a layer has none (the default).
    fn visit_children(&self, f: &mut dyn FnMut(&str, &dyn Parameters)) {
        let _ = f;
    }

    /// The module's type as printed. PyTorch: the class name (`Linear`, `Conv2d`). Default:
    /// the Rust type's name without its path and generic arguments.
    fn module_name(&self) -> String {
        crate::display::short_type_name(std::any::type_name::<Self>())
    }

    /// The module's settings as printed between its parentheses. PyTorch: `extra_repr()`
    /// (`in_features=784, out_features=32, bias=True`). Default: none.
    fn extra_repr(&self) -> String {
        String::new()
    }
}

/// A layer or a model: `forward` is written once, generic over the session, and runs eager
/// (CPU, CUDA sim, CUDA) and linked. Whether the pass trains is [`crate::Scope::training`]
/// (set by `Runtime::step` / `Runtime::eval`, PyTorch's `model.train()` / `model.eval()`).
pub trait Module<O: Train>: Parameters {
    /// The output for input `x`. PyTorch: `forward(x)`.
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>>;
}

impl<P: Parameters + ?Sized> Parameters for Box<P> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        (**self).visit_params(f)
    }
    fn visit_children(&self, f: &mut dyn FnMut(&str, &dyn Parameters)) {
        (**self).visit_children(f)
    }
    fn module_name(&self) -> String {
        (**self).module_name()
    }
    fn extra_repr(&self) -> String {
        (**self).extra_repr()
    }
}

/// Every element, in order; printed as a list whose children are named `0`, `1`, ….
impl<P: Parameters> Parameters for Vec<P> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        for p in self {
            p.visit_params(f);
        }
    }
    fn visit_children(&self, f: &mut dyn FnMut(&str, &dyn Parameters)) {
        for (i, p) in self.iter().enumerate() {
            f(&i.to_string(), p);
        }
    }
    fn module_name(&self) -> String {
        "Vec".into()
    }
}

/// The module when present (printed as it), nothing when absent (printed `None`).
impl<P: Parameters> Parameters for Option<P> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        if let Some(p) = self {
            p.visit_params(f);
        }
    }
    fn visit_children(&self, f: &mut dyn FnMut(&str, &dyn Parameters)) {
        if let Some(p) = self {
            p.visit_children(f);
        }
    }
    fn module_name(&self) -> String {
        self.as_ref()
            .map_or_else(|| crate::display::NONE.into(), P::module_name)
    }
    fn extra_repr(&self) -> String {
        self.as_ref().map(P::extra_repr).unwrap_or_default()
    }
}

/// A bare parameter, printed with its shape: `Parameter([32, 16])`.
impl Parameters for Param {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(self)
    }
    fn module_name(&self) -> String {
        "Parameter".into()
    }
    fn extra_repr(&self) -> String {
        format!("{:?}", self.shape().dims())
    }
}

/// Modules applied in order. Name the layers' parameters by position (`vars.pp("0")`,
/// `vars.pp("2")`, counting parameter-free modules too) to match PyTorch's `nn.Sequential`
/// state_dict names. PyTorch: `nn.Sequential`.
pub struct Sequential<O: Train> {
    layers: Vec<Box<dyn Module<O>>>,
}

impl<O: Train> Default for Sequential<O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<O: Train> Sequential<O> {
    /// An empty sequence (the identity).
    pub fn new() -> Self {
        Sequential { layers: Vec::new() }
    }

    /// Append a module.
    #[allow(clippy::should_implement_trait)]
    pub fn add<M: Module<O> + 'static>(mut self, m: M) -> Self {
        self.layers.push(Box::new(m));
        self
    }

    /// The number of modules.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether there are no modules.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl<O: Train> Parameters for Sequential<O> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        for l in &self.layers {
            l.visit_params(f);
        }
    }
    fn visit_children(&self, f: &mut dyn FnMut(&str, &dyn Parameters)) {
        for (i, l) in self.layers.iter().enumerate() {
            f(&i.to_string(), &**l);
        }
    }
    fn module_name(&self) -> String {
        "Sequential".into()
    }
}

impl<O: Train> Module<O> for Sequential<O> {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h)?;
        }
        Ok(h)
    }
}

/// (B, …) → (B, ∏…). PyTorch: `nn.Flatten()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flatten;

impl Parameters for Flatten {
    fn visit_params(&self, _: &mut dyn FnMut(&Param)) {}
    fn extra_repr(&self) -> String {
        "start_dim=1, end_dim=-1".into()
    }
}

impl<O: Train> Module<O> for Flatten {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        x.flatten_batch()
    }
}
