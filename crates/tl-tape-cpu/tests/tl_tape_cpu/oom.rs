//! Under a process memory limit below the allocation cap, an output the system allocator refuses
//! is an error naming the op, not an abort ("memory allocation of … bytes failed"): every
//! input-sized buffer of the CPU tape, pooled or not, and every output of the reference
//! semantics built through `Tensor::try_map`/`zip_map`/`try_cast` (tl-spec's ops, the IR's
//! `eval`) is reserved with `try_reserve_exact` (`tl_spec::alloc::try_with_capacity`). An abort
//! cannot be caught in-process, so the requests run in a child process (this test binary filtered
//! to [`requests_under_a_memory_limit`]) under `ulimit -v`.

use tl_ir::{GraphBuilder, Op};
use tl_spec::ops::{activation, attention, concat, elementwise, random, softmax};
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
    reference_outputs_are_refused();
    println!("oom child: all refused");
}

/// Elements of the operand of [`reference_outputs_are_refused`]: 2^28 + 2^27 f32 values, 1.5
/// GiB, which fits under the child's 2 GiB; an output of the same size does not.
const REF_N: usize = (1 << 28) + (1 << 27);

/// The reference's outputs are refused with the op's name: element-wise ones (a unary op's
/// `try_map`, an activation's, a cast, a VJP's `zip_map`, an IR node's value), rows (softmax,
/// dropout, concat) and attention's n² weights (from an input of n = 20 000 elements). The
/// operand's zeros come from `vec!` (pages the child never touches).
fn reference_outputs_are_refused() {
    let big = Tensor::<f32>::new([REF_N], vec![0.0; REF_N]).expect("1.5 GiB of zeros");
    let one = Tensor::<f32>::ones([1]);
    let (x, w) = (
        Tensor::<f32>::zeros([20_000, 1]),
        Tensor::<f32>::ones([1, 1]),
    );
    let attention = attention::mha::multi_head_attention([&w, &w, &w, &w], &x, 1, None);
    let cases: [(&str, tl_spec::Result<Tensor<f32>>); 9] = [
        ("exp", elementwise::exp(&big)),
        ("gelu", activation::gelu(&big)),
        ("scale", elementwise::scale(&big, 2.0)),
        ("cast", big.try_cast::<f32>("cast")),
        ("tanh", elementwise::tanh_vjp(&big, &big)),
        ("softmax", softmax::softmax(&big)),
        ("dropout", random::dropout(&big, 0.5, 1, 0)),
        ("concat0", concat::concat(&big, &one)),
        ("multiHeadAttention", attention),
    ];
    for (op, got) in cases {
        let msg = got.map(|_| ()).expect_err(op).to_string();
        assert!(
            msg.contains(op) && msg.contains("cannot allocate"),
            "{op}: {msg}"
        );
        println!("refused: {msg}");
    }
    let mut g = GraphBuilder::new();
    let x = g.leaf([REF_N], Some("x")).expect("leaf");
    g.apply(Op::Sigmoid, &[x]).expect("sigmoid node");
    let msg = g
        .finish()
        .eval(&[big], &[])
        .map(|_| ())
        .expect_err("eval")
        .to_string();
    assert!(
        msg.contains("sigmoid") && msg.contains("cannot allocate"),
        "eval: {msg}"
    );
    println!("refused: {msg}");
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
