//! The sim path has teeth: a CUDA sim tape whose `mul` backward is wrong (recorded, inside this
//! test only, as `mul(detach(a), b) + ½·a·a − ½·detach(a)·detach(a)`: the same value, exactly,
//! but a cotangent `g·a` for `a` instead of `g·b`) makes check 2 on the sim fail, per op and on
//! random DAGs, while check 1 still passes.

use std::cell::RefCell;

use tl_conformance::backend::{SimError, SimProgram};
use tl_conformance::checks::forward_case;
use tl_conformance::checks::sim::{check_backward_dag_on, check_backward_on};
use tl_conformance::{Backend, CudaSim, RunConfig, registry, run_check};
use tl_ir::{GraphData, Id, Op, Recorder};
use tl_spec::Tensor;
use tl_tape_cuda::{CudaTape, Error, SimDevice};

struct MutantRecorder<'a>(&'a mut CudaTape<SimDevice>);

impl Recorder<f32> for MutantRecorder<'_> {
    type Error = Error;
    fn leaf(&mut self, v: Tensor<f32>, name: Option<&str>, rg: bool) -> Result<usize, Error> {
        self.0.upload_leaf(&v, name, rg)
    }
    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize, Error> {
        if *op != Op::Mul {
            return self.0.apply(op, args);
        }
        let t = &mut *self.0;
        let (a, b) = (args[0], args[1]);
        let da = t.apply(&Op::Detach, &[a])?;
        let ab = t.apply(&Op::Mul, &[da, b])?;
        let aa = t.apply(&Op::Mul, &[a, a])?;
        let dada = t.apply(&Op::Mul, &[da, da])?;
        let half = t.apply(&Op::Scale(0.5), &[aa])?;
        let half_d = t.apply(&Op::Scale(0.5), &[dada])?;
        let zero = t.apply(&Op::Sub, &[half, half_d])?;
        t.apply(&Op::Add, &[ab, zero])
    }
    fn set_nats(&mut self, nats: &[usize]) -> Result<(), Error> {
        self.0.set_nats(nats.to_vec());
        Ok(())
    }
}

struct MutantSim(CudaSim);

impl AsRef<CudaSim> for MutantSim {
    fn as_ref(&self) -> &CudaSim {
        &self.0
    }
}

impl Backend for MutantSim {
    type T = f32;
    type Program = SimProgram;
    fn name(&self) -> String {
        "cuda-sim-mutant-mul".into()
    }
    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<SimProgram, String> {
        let mut tape = CudaTape::new(SimDevice::new());
        let r = graph
            .replay(&mut MutantRecorder(&mut tape), leaves, nats)
            .map_err(|e| SimError::from_tape("replay", e))
            .map(|map| SimProgram {
                tape: RefCell::new(tape),
                map,
            });
        self.0.note(r)
    }
    fn values(&self, p: &SimProgram) -> Result<Vec<Tensor<f32>>, String> {
        self.0.values(p)
    }
    fn backward_dense(
        &self,
        p: &SimProgram,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, String> {
        self.0.backward_dense(p, out, seed)
    }
}

#[test]
fn a_broken_mul_backward_on_the_sim_fails_check_2() {
    let cfg = RunConfig::from_env_or(32);
    let mutant = MutantSim(CudaSim::new());
    let mul = registry::by_name("mul").unwrap();
    let fwd = run_check(
        "1 fwd mul mutant".into(),
        &cfg,
        tl_conformance::checks::op_graph_cases(&mul),
        |c| forward_case(&mutant, c, &mul.tol),
    );
    assert!(fwd.passed(), "the mutant's forward is right: {fwd}");

    let bwd = check_backward_on(&mutant, &mul, &cfg);
    assert!(!bwd.is_pending(), "{bwd}");
    let msg = bwd.failure.as_deref().expect("check 2 on sim catches it");
    assert!(msg.contains("gradient of %0"), "names the operand: {msg}");
    assert!(msg.contains("minimal failing input"), "{msg}");

    let dag = check_backward_dag_on(&mutant, &RunConfig::from_env_or(64));
    let msg = dag.failure.expect("DAG check 2 on sim catches it");
    assert!(msg.contains("mul("), "the shrunk DAG holds the mul: {msg}");
}
