//! The rest of the tape API that the [`Backend`] trait does not cover (the spine issue's list):
//! reverse accumulation from an explicit gradient array, over the first n nodes only, and the
//! sparse parameter-gradient map. Implemented for the CPU tape (f64, f32) and the CUDA sim.

use std::collections::HashMap;

use tl_ir::Id;
use tl_spec::{Scalar, Tensor};

use crate::backend::{CudaSim, SimProgram};
use crate::{Backend, CpuTape, TapeProgram};

/// A [`Backend`] whose tape also offers `backward_first_n` / `backward_dense_from` and
/// `backward_params`. Everything is indexed by graph id; `n` counts graph ids (the tapes record
/// one node per graph id, in order).
pub trait TapeApi: Backend {
    /// `Tape::backward_dense_from(grads0)`: reverse accumulation over the whole tape from one
    /// gradient per graph id.
    fn backward_dense_from(
        &self,
        program: &Self::Program,
        grads0: &[Tensor<Self::T>],
    ) -> Result<Vec<Tensor<Self::T>>, String>;

    /// `Tape::backward_first_n(n, grads0)`: visiting only ids n−1, …, 0.
    fn backward_first_n(
        &self,
        program: &Self::Program,
        n: usize,
        grads0: &[Tensor<Self::T>],
    ) -> Result<Vec<Tensor<Self::T>>, String>;

    /// `Tape::backward_params(out, seed, wanted)`: the sparse map of the wanted ids' gradients.
    fn backward_params(
        &self,
        program: &Self::Program,
        out: Id,
        seed: &Tensor<Self::T>,
        wanted: &[Id],
    ) -> Result<HashMap<Id, Tensor<Self::T>>, String>;
}

impl<T: Scalar> TapeProgram<T> {
    /// Graph-indexed tensors re-indexed by tape id (the tape must hold exactly the graph's ids).
    fn by_tape(&self, grads0: &[Tensor<T>]) -> Result<Vec<Tensor<T>>, String> {
        let len = self.tape.len();
        if grads0.len() != self.map.len() || len != self.map.len() {
            return Err(format!(
                "{} gradients for {} graph ids on a tape of {len} nodes",
                grads0.len(),
                self.map.len()
            ));
        }
        let mut out: Vec<Option<Tensor<T>>> = vec![None; len];
        for (&t, g) in self.map.iter().zip(grads0) {
            out[t] = Some(g.clone());
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn by_graph(&self, grads: &[Tensor<T>]) -> Result<Vec<Tensor<T>>, String> {
        self.map
            .iter()
            .map(|&t| {
                grads
                    .get(t)
                    .cloned()
                    .ok_or_else(|| format!("tape returned no gradient for tape id {t}"))
            })
            .collect()
    }
}

impl<T: Scalar> TapeApi for CpuTape<T> {
    fn backward_dense_from(
        &self,
        p: &TapeProgram<T>,
        grads0: &[Tensor<T>],
    ) -> Result<Vec<Tensor<T>>, String> {
        let g = p
            .tape
            .backward_dense_from(p.by_tape(grads0)?)
            .map_err(|e| format!("tape backward_dense_from failed: {e}"))?;
        p.by_graph(&g)
    }

    fn backward_first_n(
        &self,
        p: &TapeProgram<T>,
        n: usize,
        grads0: &[Tensor<T>],
    ) -> Result<Vec<Tensor<T>>, String> {
        let g = p
            .tape
            .backward_first_n(n, p.by_tape(grads0)?)
            .map_err(|e| format!("tape backward_first_n failed: {e}"))?;
        p.by_graph(&g)
    }

    fn backward_params(
        &self,
        p: &TapeProgram<T>,
        out: Id,
        seed: &Tensor<T>,
        wanted: &[Id],
    ) -> Result<HashMap<Id, Tensor<T>>, String> {
        let tape_id = |w: Id| {
            p.map
                .get(w)
                .copied()
                .ok_or_else(|| format!("graph id {w} was not recorded"))
        };
        let tape_wanted = wanted
            .iter()
            .map(|&w| tape_id(w))
            .collect::<Result<Vec<_>, _>>()?;
        let map = p
            .tape
            .backward_params(tape_id(out)?, seed, &tape_wanted)
            .map_err(|e| format!("tape backward_params failed: {e}"))?;
        wanted
            .iter()
            .zip(&tape_wanted)
            .map(|(&w, t)| {
                map.get(t)
                    .cloned()
                    .map(|g| (w, g))
                    .ok_or_else(|| format!("backward_params returned no gradient for id {w}"))
            })
            .collect()
    }
}

impl TapeApi for CudaSim {
    fn backward_dense_from(
        &self,
        p: &SimProgram,
        grads0: &[Tensor<f32>],
    ) -> Result<Vec<Tensor<f32>>, String> {
        self.note(p.backward_first_n(p.map.len(), grads0))
    }

    fn backward_first_n(
        &self,
        p: &SimProgram,
        n: usize,
        grads0: &[Tensor<f32>],
    ) -> Result<Vec<Tensor<f32>>, String> {
        self.note(p.backward_first_n(n, grads0))
    }

    fn backward_params(
        &self,
        p: &SimProgram,
        out: Id,
        seed: &Tensor<f32>,
        wanted: &[Id],
    ) -> Result<HashMap<Id, Tensor<f32>>, String> {
        self.note(p.backward_params(out, seed, wanted))
    }
}
