//! [`Embedding`]: rows of a table picked by index. PyTorch: `nn.Embedding`.

use tl_session::{Param, Train};

use super::At;
use crate::error::usage;
use crate::{Init, Parameters, Result, Scope, Var, Vars};

/// A table (num, dim) of `N(0, 1)` rows; `forward` picks rows by index, and the gradient
/// scatter-adds into the picked rows. PyTorch: `nn.Embedding(num, dim)`.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// The table (num, dim), named `weight`.
    pub weight: Param,
}

impl Embedding {
    /// A table of `num` rows of width `dim`.
    pub fn new<O: Train>(vars: &Vars<'_, O>, num: usize, dim: usize) -> Result<Self> {
        if num == 0 || dim == 0 {
            return Err(usage(
                "Embedding::new",
                format!("need num ≥ 1 and dim ≥ 1, got {num} × {dim}"),
            ));
        }
        let weight = vars.param(
            "weight",
            &[num, dim],
            Init::Normal {
                mean: 0.0,
                std: 1.0,
            },
        )?;
        Ok(Embedding { weight })
    }

    /// The rows at `ids` as (ids.len(), dim). An id out of range is an error naming it and
    /// the table's size (the spec's totalised gather would give a zero row). PyTorch:
    /// `emb(torch.tensor(ids))`.
    pub fn forward<'g, O: Train>(&self, g: &Scope<'g, O>, ids: &[usize]) -> Result<Var<'g, O>> {
        let [num, _] = self.table(g, "Embedding::forward")?;
        if let Some((i, &id)) = ids.iter().enumerate().find(|(_, id)| **id >= num) {
            return Err(At::new(g.rt, self, &self.weight).input(format!(
                "id {id} at position {i} is out of range for a table of {num} rows (num_embeddings {num})"
            )));
        }
        let table = g.param(&self.weight)?;
        let at = g.rt.borrow_mut().record_nat_vec(ids).pos();
        let k = ids.len();
        table.op("Embedding::forward", &[], |s| {
            s.gather_rows_nat_vec(table.tensor_ref(), at, k)
        })
    }

    /// The rows at `ids`, an id tensor of shape `dims` stored row-major (`(B, n)` for a batch
    /// of sequences), as `dims ++ (dim)`: `(B, n, dim)`. PyTorch: `emb(ids)` with `ids` of
    /// shape `dims`.
    pub fn forward_shaped<'g, O: Train>(
        &self,
        g: &Scope<'g, O>,
        ids: &[usize],
        dims: &[usize],
    ) -> Result<Var<'g, O>> {
        let n = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if n != Some(ids.len()) {
            return Err(usage(
                "Embedding::forward_shaped",
                format!(
                    "an id tensor of shape {dims:?} holds {} ids, got {}",
                    n.map_or("more than usize".into(), |n| n.to_string()),
                    ids.len()
                ),
            ));
        }
        let rows = self.forward(g, ids)?;
        let [_, dim] = self.table(g, "Embedding::forward_shaped")?;
        let mut out = dims.to_vec();
        out.push(dim);
        rows.reshape(&out)
    }

    /// The table's (num, dim): the weight is a public field, so checked at use as the
    /// constructor makes it (rank 2); an error naming the layer and `what` otherwise.
    fn table<O: Train>(&self, g: &Scope<'_, O>, what: &'static str) -> Result<[usize; 2]> {
        let at = At::new(g.rt, self, &self.weight);
        let d = at.param_dims(what, "weight", &self.weight, 2..=2, "(num_embeddings, dim)")?;
        Ok([d[0], d[1]])
    }

    /// The rows at a batch of equally long id sequences, as `(B, n, dim)`. PyTorch: `emb(ids)`
    /// with `ids` of shape `(B, n)`.
    pub fn forward_batch<'g, O: Train, S: AsRef<[usize]>>(
        &self,
        g: &Scope<'g, O>,
        batch: &[S],
    ) -> Result<Var<'g, O>> {
        let n = batch.first().map_or(0, |s| s.as_ref().len());
        if let Some((i, s)) = batch
            .iter()
            .enumerate()
            .find(|(_, s)| s.as_ref().len() != n)
        {
            return Err(usage(
                "Embedding::forward_batch",
                format!(
                    "the sequences must have one length: sequence 0 has {n} ids, sequence {i} has {}",
                    s.as_ref().len()
                ),
            ));
        }
        let ids: Vec<usize> = batch
            .iter()
            .flat_map(|s| s.as_ref().iter().copied())
            .collect();
        self.forward_shaped(g, &ids, &[batch.len(), n])
    }
}

impl Parameters for Embedding {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
    }
    fn extra_repr(&self) -> String {
        // A weight of another rank (a public field) prints its missing sizes as 0.
        let d = |i: usize| self.weight.shape().dims().get(i).copied().unwrap_or(0);
        format!("{}, {}", d(0), d(1))
    }
}
