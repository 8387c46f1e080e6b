//! [`ModuleList`]: layers held in order and named by position. PyTorch: `nn.ModuleList`.

use tl_session::{Param, Train};

use crate::{Parameters, Result, Vars};

/// Layers held in order and named by position under the list's prefix (`blocks.0.…`,
/// `blocks.1.…`), as PyTorch's `nn.ModuleList` names them in a `state_dict`. It lists its
/// layers' parameters in order (it is [`Parameters`]); the model decides how to call them
/// (it has no `forward` of its own, as in PyTorch). Hold one kind of layer (`ModuleList<Block>`)
/// or any (`ModuleList<Box<dyn Module<O>>>`).
///
/// ```
/// use tl_nn::{Linear, ModuleList, Runtime};
/// use tl_session::{Options, Session};
///
/// # fn main() -> tl_nn::Result<()> {
/// let rt = Runtime::new(Session::<f32>::new(Options::default())?);
/// let v = rt.vars().pp("layers");
/// let mut layers = ModuleList::from_fn(&v, 2, |v, _| Linear::new(v, 4, 4))?;
/// layers.push_with(&v, |v| Linear::new(v, 4, 2))?; // named layers.2.*
/// assert_eq!(layers.len(), 3);
/// assert_eq!(rt.named_params_of(&layers)[4].0, "layers.2.weight");
/// assert_eq!(rt.named_params_of(&layers[1])[1].0, "layers.1.bias");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ModuleList<M> {
    items: Vec<M>,
}

impl<M> Default for ModuleList<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> ModuleList<M> {
    /// An empty list.
    pub fn new() -> Self {
        ModuleList { items: Vec::new() }
    }

    /// `n` layers, layer `i` made by `make(&vars.pp(i), i)`.
    pub fn from_fn<O: Train>(
        vars: &Vars<'_, O>,
        n: usize,
        mut make: impl FnMut(&Vars<'_, O>, usize) -> Result<M>,
    ) -> Result<Self> {
        let mut list = Self::new();
        for i in 0..n {
            list.items.push(make(&vars.pp(i), i)?);
        }
        Ok(list)
    }

    /// Append a layer made by `make(&vars.pp(len))`: its parameters are named by its position
    /// under `vars` (the list's prefix). PyTorch: `append`.
    pub fn push_with<O: Train>(
        &mut self,
        vars: &Vars<'_, O>,
        make: impl FnOnce(&Vars<'_, O>) -> Result<M>,
    ) -> Result<()> {
        let m = make(&vars.pp(self.items.len()))?;
        self.items.push(m);
        Ok(())
    }

    /// Append a layer already made (create it under `vars.pp(list.len())` to keep PyTorch's
    /// names). PyTorch: `append`.
    pub fn push(&mut self, m: M) {
        self.items.push(m);
    }

    /// The number of layers. PyTorch: `len(list)`.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Layer `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&M> {
        self.items.get(i)
    }

    /// The layers in order. PyTorch: `for m in list`.
    pub fn iter(&self) -> std::slice::Iter<'_, M> {
        self.items.iter()
    }
}

impl<M> std::ops::Index<usize> for ModuleList<M> {
    type Output = M;

    /// Layer `i`; panics past the end, as a slice does (use [`ModuleList::get`] to check).
    fn index(&self, i: usize) -> &M {
        &self.items[i]
    }
}

impl<'a, M> IntoIterator for &'a ModuleList<M> {
    type Item = &'a M;
    type IntoIter = std::slice::Iter<'a, M>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl<M: Parameters> Parameters for ModuleList<M> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.items.visit_params(f)
    }
}
