//! The harness has teeth: a backend whose `mul` backward is deliberately wrong (a mutated copy of
//! the rule inside this test, recorded as a user op; the real code is untouched) must make
//! check 2 fail, with the shrunk case in the message, while check 1 still passes.

use tl_conformance::checks::{check_backward, check_backward_dag, check_forward};
use tl_conformance::{Backend, RunConfig, TapeProgram, registry};
use tl_ir::{GraphData, Id, Op, Recorder, UserOp};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cpu::{Error, Tape};

/// `mul` with a planted bug: its VJP returns `g·a` for the first operand instead of `g·b`.
struct MutantMul;

impl UserOp for MutantMul {
    fn name(&self) -> &'static str {
        "mul (mutant)"
    }
    fn arity(&self) -> usize {
        2
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        Op::Mul
            .infer_shape(s)
            .map_err(|e| tl_spec::Error::shape("mul (mutant)", e.to_string()))
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map("mul", x[1], |a, b| a * b)
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let wrong = g.zip_map("mul", x[0], |g, a| g * a)?; // should be g * b
        let right = g.zip_map("mul", x[0], |g, a| g * a)?;
        Ok(vec![Some(wrong), Some(right)])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        let a = dx[0].zip_map("mul", x[1], |d, b| d * b)?;
        let b = x[0].zip_map("mul", dx[1], |a, d| a * d)?;
        a.add(&b)
    }
}

/// Records every op on a CPU tape, except `mul`, recorded as the user op [`MutantMul`].
struct MutantRecorder<'a>(&'a mut Tape<f64>);

impl Recorder<f64> for MutantRecorder<'_> {
    type Error = Error;

    fn leaf(&mut self, value: Tensor<f64>, name: Option<&str>, rg: bool) -> Result<usize, Error> {
        Ok(self.0.leaf(value, name, rg))
    }

    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize, Error> {
        if *op != Op::Mul {
            return self.0.apply(op, args);
        }
        self.0.apply(&Op::user(MutantMul), args)
    }

    fn set_nats(&mut self, nats: &[usize]) -> Result<(), Error> {
        self.0.set_nats(nats.to_vec());
        Ok(())
    }
}

struct MutantBackend;

impl Backend for MutantBackend {
    type T = f64;
    type Program = TapeProgram<f64>;

    fn name(&self) -> String {
        "cpu-f64-mutant-mul".into()
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f64>],
        nats: &[usize],
    ) -> Result<Self::Program, String> {
        let mut tape = Tape::new();
        let map = graph
            .replay(&mut MutantRecorder(&mut tape), leaves, nats)
            .map_err(|e| e.to_string())?;
        Ok(TapeProgram { tape, map })
    }

    fn values(&self, p: &Self::Program) -> Result<Vec<Tensor<f64>>, String> {
        p.values()
    }

    fn backward_dense(
        &self,
        p: &Self::Program,
        out: Id,
        seed: &Tensor<f64>,
    ) -> Result<Vec<Tensor<f64>>, String> {
        p.backward_dense(out, seed)
    }
}

#[test]
fn a_broken_mul_backward_fails_check_2_with_a_shrunk_case() {
    let cfg = RunConfig::from_env();
    let mul = registry::by_name("mul").expect("mul has an entry");
    let fwd = check_forward(&MutantBackend, &mul, &cfg);
    assert!(fwd.passed(), "the mutant's forward is right: {fwd}");

    let bwd = check_backward(&MutantBackend, &mul, &cfg);
    let msg = bwd
        .failure
        .as_deref()
        .expect("check 2 must catch the broken rule");
    assert!(msg.contains("gradient of %0"), "names the operand: {msg}");
    assert!(msg.contains("mul("), "prints the graph: {msg}");
    assert!(
        msg.contains("minimal failing input"),
        "prints the shrunk input: {msg}"
    );
    assert_eq!(bwd.cell(), "FAIL");
    eprintln!("{msg}");
}

#[test]
fn a_broken_mul_backward_fails_check_2_on_random_dags() {
    let cfg = RunConfig {
        cases: RunConfig::from_env().cases.max(64),
        ..RunConfig::from_env()
    };
    let report = check_backward_dag(&MutantBackend, &cfg);
    assert!(
        !report.passed(),
        "DAG check 2 must catch the broken mul: {report}"
    );
    let msg = report.failure.unwrap();
    eprintln!("{msg}");
    assert!(
        msg.contains("mul("),
        "the shrunk DAG contains the mul: {msg}"
    );
}
