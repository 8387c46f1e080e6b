//! The sessions' state after every kind of write (Nat writes, host parameter writes, optimizer
//! steps, new inputs, resets): eager and linked reads equal a fresh recomputation
//! (`tl_conformance::checks::session_state`).

use tl_conformance::checks::session_state::{
    STATE_CASES, StateCase, StateOp, check_session_state, state_case_cpu, state_case_sim,
};
use tl_conformance::{RunConfig, assert_all_passed};
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
