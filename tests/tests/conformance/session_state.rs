//! The sessions' state after every kind of write (Nat writes, host parameter writes, optimizer
//! steps, new inputs, resets): eager and linked reads equal a fresh recomputation
//! (`tl_conformance::checks::session_state`); and the linked session's two caches as handles
//! are dropped between reads.

use tl_conformance::checks::session_state::{
    STATE_CASES, StateCase, StateOp, check_session_state, state_case_cpu, state_case_sim,
};
use tl_conformance::{RunConfig, assert_all_passed};
use tl_session::{Backend, LinkedSession, Ops, TensorRef, Train};
use tl_spec::Tensor;

#[test]
fn random_write_sequences_read_like_a_fresh_recomputation() {
    let cfg = RunConfig::from_env_or(STATE_CASES);
    let reports = check_session_state(&cfg);
    assert_eq!(reports.len(), 2);
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn a_nat_write_between_two_reads_changes_the_linked_read() {
    // W = [[1, 2], [3, 4]], x = ones: g = W[ids]. After the first read the ids change from
    // [0] to [1]; the linked session's g must follow (its cache is dropped by the write), the
    // eager one keeps the value its op computed. Every write kind once, in one sequence.
    let case = StateCase {
        w: Tensor::new([2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap(),
        x: Tensor::new([1, 2], vec![1.0, 1.0]).unwrap(),
        ids: vec![0],
        labels: vec![1],
        row: 0,
        ops: vec![
            StateOp::Read,
            StateOp::WriteIds(vec![1]),
            StateOp::WriteLabels(vec![0]),
            StateOp::WriteRow(0),
            StateOp::NewInput(Tensor::new([1, 2], vec![0.5, -0.5]).unwrap()),
            StateOp::SetParam(Tensor::new([2, 2], vec![0.0, 1.0, -1.0, 0.5]).unwrap()),
            StateOp::Step(0.5),
            StateOp::WriteIds(vec![0]),
            StateOp::Reset,
        ],
    };
    state_case_cpu(&case).unwrap_or_else(|e| panic!("{e}"));
    state_case_sim(&case).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_host_write_mid_pass_keeps_the_recorded_value_on_the_linked_device_backend() {
    let case = StateCase {
        w: Tensor::new([1, 1], vec![0.0]).unwrap(),
        x: Tensor::new([1, 1], vec![0.0]).unwrap(),
        ids: vec![0],
        labels: vec![0],
        row: 0,
        ops: vec![StateOp::SetParam(Tensor::new([1, 1], vec![0.75]).unwrap())],
    };
    state_case_cpu(&case).unwrap_or_else(|e| panic!("{e}"));
    state_case_sim(&case).unwrap_or_else(|e| panic!("{e}"));
}

/// The linked session's two ways to read a value, its pure evaluation (`Ops::value`, which
/// keeps a cache) and its compiled pass (`Train::read`, which keeps the pass's tape), each let
/// go of what no handle reaches, from one queue of dropped handles. Ops recorded, handles
/// dropped and values read in a seeded order, on the CPU and the sim: every read equals a
/// fresh evaluation of the whole graph, bit for bit, however the two readers interleave.
#[test]
fn linked_reads_of_both_kinds_free_what_no_handle_reaches_and_read_as_a_fresh_evaluation() {
    for backend in [Backend::Cpu, Backend::CudaSim] {
        for seed in 0..8u64 {
            let mut s = LinkedSession::<f32>::new();
            s.set_backend(backend).unwrap();
            s.set_grad_enabled(false);
            let x0 = Tensor::from_fn([4, 8], |i| (i as f32 * 0.37).sin());
            let mut live: Vec<TensorRef> = vec![s.input(x0.clone(), false).unwrap()];
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut draw = |n: usize| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % n as u64) as usize
            };
            let mut reads = 0;
            for _ in 0..160 {
                let a = draw(live.len());
                match draw(6) {
                    0 => {
                        let t = s.tanh(&live[a]).unwrap();
                        live.push(t);
                    }
                    1 => {
                        let b = draw(live.len());
                        let t = s.add(&live[a], &live[b]).unwrap();
                        live.push(t);
                    }
                    2 | 3 if live.len() > 1 => {
                        // Never the input: a leaf keeps its value anyway.
                        live.remove(1 + draw(live.len() - 1));
                    }
                    k => {
                        // The pure read against the IR's evaluation of the whole graph, the
                        // compiled one against a fresh compile of it (the same kernels).
                        let r = &live[a];
                        let (got, want) = match k % 2 {
                            0 => {
                                let all = s.graph().eval(std::slice::from_ref(&x0), &[]).unwrap();
                                (s.value(r).unwrap(), all[r.id()].clone())
                            }
                            _ => {
                                let fresh = s.compile(backend).unwrap().value(r.id()).unwrap();
                                (s.read(r).unwrap(), fresh)
                            }
                        };
                        let bits = |t: &Tensor<f32>| -> Vec<u32> {
                            t.data().iter().map(|v| v.to_bits()).collect()
                        };
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{backend:?}, seed {seed}: node {} ({})",
                            r.id(),
                            ["value", "read"][k % 2]
                        );
                        reads += 1;
                    }
                }
            }
            assert!(reads > 20, "{backend:?}, seed {seed}: only {reads} reads");
        }
    }
}
