//! Under a process memory limit below the allocation cap, an output the system allocator refuses
//! is an error naming the op, not an abort ("memory allocation of … bytes failed"): every
//! input-sized buffer of the CPU tape, pooled or not, is reserved with `try_reserve_exact`
//! (`tl_spec::alloc::try_with_capacity`). An abort cannot be caught in-process, so the requests
//! run in a child process (this test binary filtered to [`requests_under_a_memory_limit`]) under
//! `ulimit -v`.

use tl_ir::Op;
use tl_spec::{Shape, Tensor};
use tl_tape_cpu::Tape;

/// Set in the child, so that the inner test runs there only.
const CHILD_VAR: &str = "TL_TAPE_CPU_OOM_CHILD";

/// The child's address-space limit, in KiB (`ulimit -v`): 2 GiB.
const LIMIT_KIB: u64 = 2 << 20;

/// Elements of each request: 2^30 f64 values, 8 GiB, four times the child's whole address space
/// and far below the allocation cap the child sets.
const N: usize = 1 << 30;

/// The ops whose output is large from small operands, each must fail with its name.
#[test]
#[ignore = "run by allocations_refused_by_the_system_are_errors_not_aborts in a child process"]
fn requests_under_a_memory_limit() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return; // only meaningful under the child's limit
    }
    tl_spec::alloc::set_max_alloc_bytes(Some(1 << 40));
    let mut t = Tape::<f64>::new();
    let one = t.leaf(Tensor::ones([1]), Some("one"), true);
    let col = t.leaf(Tensor::ones([1 << 15, 1]), Some("col"), true);
    let row = t.leaf(Tensor::ones([1, 1 << 15]), Some("row"), true);
    let w = t.leaf(Tensor::ones([1 << 15, 1]), Some("w"), true);
    let b = t.leaf(Tensor::ones([1 << 15]), Some("b"), true);
    let shape = Shape::new(&[N]);
    let cases: Vec<(Op, Vec<usize>)> = vec![
        (
            Op::RandUniform {
                shape: shape.clone(),
                seed: 1,
                counter: 0,
            },
            vec![],
        ),
        (
            Op::BernoulliMask {
                shape: shape.clone(),
                keep: 0.5,
                seed: 1,
                counter: 0,
            },
            vec![],
        ),
        (Op::BroadcastTo(shape), vec![one]),
        (Op::Matmul, vec![col, row]),
        (Op::Linear, vec![w, b, col]),
    ];
    for (op, args) in cases {
        let len = t.len();
        let msg = match t.apply(&op, &args) {
            Ok(_) => panic!("{op}: an 8 GiB output under a 2 GiB limit succeeded"),
            Err(e) => e.to_string(),
        };
        assert!(
            msg.contains(op.name()) && msg.contains("cannot allocate"),
            "{op}: {msg}"
        );
        assert_eq!(t.len(), len, "{op}: the tape is unchanged");
        println!("refused: {msg}");
    }
    println!("oom child: all refused");
}

/// The child exits successfully having refused every request: before the fix it aborted with
/// "memory allocation of … bytes failed" on the first one.
#[test]
fn allocations_refused_by_the_system_are_errors_not_aborts() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return; // never recurse
    }
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let name = format!("{module}::requests_under_a_memory_limit");
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(r#"ulimit -v {LIMIT_KIB} && exec "$0" "$@""#))
        .arg(exe)
        .args([
            name.as_str(),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .output()
        .expect("spawn the test binary under sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("oom child: all refused"),
        "the child exited with {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        !stderr.contains("memory allocation of"),
        "an allocation aborted:\n{stderr}"
    );
}
