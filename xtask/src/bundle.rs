//! `cargo xtask gpu-bundle`: everything the GPU machine needs, in `gpu-bundle/` (git-ignored).
//!
//! The GPU machine has the driver, Python and PyTorch but no Rust toolchain (DESIGN.md "Running
//! on a real GPU"), so we build here: the stub libcuda (to link), then `cargo test --release
//! --features cuda --no-run` for `-p tl-tape-cuda`, `-p tl-session --test tl_session` and
//! `-p tl-conformance --test conformance` (its `cuda_gpu` and `user_ops` modules run there),
//! `-p tl-nn --test nn` with the harness's `cuda` feature (its `custom_op` module runs there), and
//! `cargo bench --no-run` for tl-session's `gpu` bench; their JSON messages name the
//! executables. Tests go to `bin/`, the bench to `bench/`, stripped, with
//! `benches/gpu/torch_bench.py` and a `run.sh` that runs each test there (the binaries load the
//! driver's `libcuda.so.1`; the stub is not in the bundle and run.sh refuses to run if the
//! loader would pick it), keeps each log, prints a summary table (per binary pass/FAIL/SKIPPED,
//! and the per-family `GPU-SUMMARY` lines of the gpu tests: max error vs the simulation device,
//! pass/FAIL), then runs the bench and the PyTorch script, which prints ours beside PyTorch
//! eager with issue 7's GPU targets. `cli/tl` (tl-cli built with `--features cuda`) trains the
//! mlp, the cnn and the transformer on the CPU and then on the GPU, and run.sh prints each run's
//! last line. `examples/nccl_check` (tl-nn's example, `--features cuda`) loads NCCL from PyTorch's
//! wheels (`TL_NCCL_LIBRARY`, which run.sh sets before the tests, so tl-tape-cuda's `nccl::`
//! tests run on the real library too) and checks one rank's collectives and data-parallel steps
//! with the NCCL engine. Last, where the GPU machine has Nsight Compute (`ncu`), run.sh profiles
//! one run (`--once --only …`) of the bench rows with targets (the 4096² GEMMs, the bf16 1024²
//! products with and without the raised split-K threshold, the attention core at n = 4096 (f32
//! and, `flash-bf16`, under autocast; the f32 forward alone with FMA and with the tensor-core
//! products), the convolutions and both their cotangents, f32 and bf16; `TL_PROFILE_ROWS`
//! overrides) into
//! `logs/ncu.txt`: per kernel its duration, registers, occupancy and what limits it, and its
//! stalls.
//! `TL_RUN_PARTS` (comma-separated `tests`, `nccl`, `train`, `bench`, `ncu`; default all) runs
//! only the parts it names: a second run in a short GPU lease takes what a change touched. The
//! folder is also packed as `gpu-bundle.tar.xz` for the copy.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::{stub, util};

/// `cargo test --release` or `cargo bench` (optimised either way), `--features cuda --no-run
/// <pkg> --message-format=json` against the stub; the executables it reports.
fn build_exes(cmd: &str, pkgs: &[&[&str]]) -> Result<Vec<String>, String> {
    let mut json = String::new();
    for pkg in pkgs {
        json += &util::output(
            Command::new(util::cargo())
                .current_dir(util::root())
                .env("CUDA_LIBRARY_PATH", stub::root())
                .arg(cmd)
                .args(if cmd == "test" {
                    &["--release"][..]
                } else {
                    &[]
                })
                .args(["--features", "cuda", "--no-run"])
                .args(*pkg)
                .arg("--message-format=json"),
        )?;
    }
    let exes = executables(&json);
    if exes.is_empty() {
        return Err(format!("cargo {cmd} reported no executables"));
    }
    Ok(exes)
}

/// Copy `exes` into `dir` (created), stripped; their file names.
fn copy_stripped(exes: &[String], dir: &Path) -> Result<Vec<String>, String> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names = Vec::new();
    for exe in exes {
        let name = Path::new(exe)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("odd executable path {exe}"))?;
        let dst = dir.join(&name);
        fs::copy(exe, &dst).map_err(|e| format!("copy {exe}: {e}"))?;
        if let Err(e) = util::status(Command::new("strip").arg(&dst)) {
            eprintln!("gpu-bundle: not stripped ({e})");
        }
        names.push(name);
    }
    Ok(names)
}

/// The bundle packed for the copy (beside the folder, git-ignored).
const ARCHIVE: &str = "gpu-bundle.tar.xz";

/// Build the bundle.
pub fn build() -> Result<(), String> {
    stub::build()?;
    // Every test of the CUDA tape, and the session's tests, whose `cuda` module runs the eager
    // and linked sessions on the real device against the CPU session (one binary per crate:
    // docs/verification.md).
    let tests = build_exes(
        "test",
        &[
            &["-p", "tl-tape-cuda"],
            &["-p", "tl-session", "--test", "tl_session"],
            // The conformance suite's `cuda_gpu` module (run.sh runs only it): every registry
            // op, random DAGs and the grid cases on the GPU against the sim.
            &["-p", "tl-conformance", "--test", "conformance"],
            // tl-nn's tests with the harness's real-GPU row: run.sh runs `custom_op::`, the
            // worked example's user op and its own `.cu` kernels on the GPU against the sim.
            &[
                "-p",
                "tl-nn",
                "--test",
                "nn",
                "--features",
                "tl-conformance/cuda",
            ],
        ],
    )?;
    // Issue 7's GPU bench (steps, matmul, elementwise bandwidth), joined with PyTorch's figures
    // by benches/gpu/torch_bench.py on the GPU machine.
    let benches = build_exes("bench", &[&["-p", "tl-session", "--bench", "gpu"]])?;
    // The README's main job on the GPU: `tl train --backend cuda`.
    let cli = build_cli()?;
    // NCCL with one rank, and data-parallel steps with the NCCL engine (docs/guide.md
    // "Training on several processes").
    let nccl_check = build_nccl_check()?;
    let dir = util::root().join("gpu-bundle");
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let names = copy_stripped(&tests, &dir.join("bin"))?;
    let bench_names = copy_stripped(&benches, &dir.join("bench"))?;
    copy_stripped(&[cli], &dir.join("cli"))?;
    copy_stripped(&[nccl_check], &dir.join("examples"))?;
    let script = util::root().join("benches/gpu/torch_bench.py");
    fs::copy(&script, dir.join("torch_bench.py"))
        .map_err(|e| format!("copy {}: {e}", script.display()))?;
    let run = dir.join("run.sh");
    fs::write(&run, run_sh()).map_err(|e| format!("{}: {e}", run.display()))?;
    util::status(Command::new("chmod").arg("+x").arg(&run))?;
    let size = util::output(Command::new("du").args(["-sh"]).arg(&dir)).unwrap_or_default();
    // The folder is tens of MB (each test binary holds its crate's whole suite); xz brings it
    // to a fifth for the copy.
    util::status(Command::new("tar").current_dir(util::root()).args([
        "-cJf",
        ARCHIVE,
        "gpu-bundle",
    ]))?;
    let packed = util::output(
        Command::new("du")
            .args(["-sh", ARCHIVE])
            .current_dir(util::root()),
    )
    .unwrap_or_default();
    println!(
        "gpu-bundle: {} test binaries ({}), bench {}, in {} ({} as {ARCHIVE})\n\
         copy the folder (or unpack the archive: tar -xJf {ARCHIVE}) to the GPU machine and run \
         ./run.sh there",
        names.len(),
        names.join(", "),
        bench_names.join(", "),
        size.split_whitespace().next().unwrap_or("?"),
        packed.split_whitespace().next().unwrap_or("?"),
    );
    Ok(())
}

/// `cargo build --release --features cuda -p tl-cli` against the stub; the `tl` executable.
fn build_cli() -> Result<String, String> {
    build_release(&["-p", "tl-cli", "--bin", "tl"], "/tl")
}

/// tl-nn's `nccl_check` example (`--features cuda`) against the stub libcuda: NCCL with one
/// rank on the GPU (run.sh points `TL_NCCL_LIBRARY` at PyTorch's libnccl.so.2).
fn build_nccl_check() -> Result<String, String> {
    build_release(
        &["-p", "tl-nn", "--example", "nccl_check"],
        "/examples/nccl_check",
    )
}

/// `cargo build --release --features cuda <what>` against the stub; the executable whose path
/// ends in `suffix`.
fn build_release(what: &[&str], suffix: &str) -> Result<String, String> {
    let json = util::output(
        Command::new(util::cargo())
            .current_dir(util::root())
            .env("CUDA_LIBRARY_PATH", stub::root())
            .args(["build", "--release", "--features", "cuda"])
            .args(what)
            .arg("--message-format=json"),
    )?;
    json.lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .find_map(|l| util::executable(l).filter(|e| e.ends_with(suffix)))
        .ok_or_else(|| {
            format!(
                "cargo build {} reported no executable ending in {suffix}",
                what.join(" ")
            )
        })
}

/// The `"executable":"…"` paths of cargo's JSON messages (test artifacts only).
fn executables(json: &str) -> Vec<String> {
    json.lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && util::test_profile(l))
        .filter_map(util::executable)
        .collect()
}

/// The script run on the GPU machine.
fn run_sh() -> &'static str {
    r#"#!/usr/bin/env bash
# Generated by `cargo xtask gpu-bundle`. Runs every test binary of tl-tape-cuda, the session's
# tests, the conformance suite's GPU module and user-op harness, and tl-nn's worked user op
# (built with --features cuda) against the real driver and prints a summary table; trains the
# mlp, the cnn and the transformer with `tl` on the CPU and on the GPU; then the GPU bench (ours)
# beside PyTorch eager (torch_bench.py) with the issue 7 and 42 targets.
set -uo pipefail
cd "$(dirname "$0")"
mkdir -p logs
rows=()
# Which parts run (TL_RUN_PARTS, comma-separated; default all): tests (the test binaries),
# nccl (examples/nccl_check), train (`tl train` on the CPU and the GPU), bench (ours and
# torch_bench.py), ncu (the kernel profile). A second run in a short lease can take only what a
# change touched, e.g. TL_RUN_PARTS=bench,ncu.
parts=",${TL_RUN_PARTS:-tests,nccl,train,bench,ncu},"
for p in $(tr ',' ' ' <<<"${TL_RUN_PARTS:-}"); do
    case "$p" in tests|nccl|train|bench|ncu) ;; *) echo "TL_RUN_PARTS: unknown part '$p' (tests, nccl, train, bench, ncu)"; exit 2 ;; esac
done
want() { [[ "$parts" == *",$1,"* ]]; }
echo "parts: ${parts:1:-1}"
# NCCL from PyTorch's wheels (nvidia-nccl-cu*), unless TL_NCCL_LIBRARY names one already: the
# tests' nccl:: modules and examples/nccl_check load it.
if [ -z "${TL_NCCL_LIBRARY:-}" ]; then
    # A namespace package in the cu13 wheels (no __file__): its __path__ names the folder.
    nccl_dir=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null)
    [ -n "$nccl_dir" ] && export TL_NCCL_LIBRARY="$nccl_dir/lib/libnccl.so.2"
fi
echo "TL_NCCL_LIBRARY=${TL_NCCL_LIBRARY:-<not found: the NCCL tests skip, nccl_check fails>}"
want tests && for b in bin/*; do
    name=$(basename "$b")
    if ldd "$b" 2>/dev/null | grep libcuda | grep -q cuda-stub; then
        echo "refusing to run: $name would load the stub libcuda (fix LD_LIBRARY_PATH)"; exit 2
    fi
    # The conformance binary holds the whole CPU suite too: only its GPU module and the user-op
    # harness (whose rows include the GPU) run here; of tl-nn's tests, the worked user op.
    filter=""
    case "$name" in
        conformance-*) filter="cuda_gpu:: user_ops::" ;;
        nn-*) filter="custom_op::" ;;
    esac
    echo "==> $name $filter"
    start=$SECONDS
    timeout "${TL_BIN_TIMEOUT:-300}" "$b" --test-threads=1 --nocapture $filter > "logs/$name.log" 2>&1
    rc=$?
    tail -n 5 "logs/$name.log"
    if grep -q "no CUDA device: skipping" "logs/$name.log"; then status=SKIPPED
    elif [ $rc -eq 124 ]; then status=TIMEOUT
    elif [ $rc -eq 0 ]; then status=pass
    else status=FAIL; fi
    rows+=("$(printf '%-32s %-8s (exit %d, %d s)' "$name" "$status" "$rc" $((SECONDS - start)))")
done
if want nccl; then
    echo "== NCCL, one rank: examples/nccl_check (PASS/FAIL per check)"
    timeout "${TL_BIN_TIMEOUT:-300}" examples/nccl_check > logs/nccl_check.log 2>&1
    rc=$?
    cat logs/nccl_check.log
    if [ $rc -eq 0 ]; then status=pass; else status=FAIL; fi
    rows+=("$(printf '%-32s %-8s (exit %d)' nccl_check "$status" "$rc")")
fi
echo
echo "== GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo unknown)"
if [ ${#rows[@]} -gt 0 ]; then
    echo "== summary: test binaries"
    printf '%s\n' "${rows[@]}"
fi
if want tests; then
    echo "== summary: op families (max relative error: the gpu tests against the simulation device;"
    echo "   conformance-*: checks 1 and 2 against the f64 IR, the grid cases against the sim, repeat-bits: differing elements)"
    printf '%-28s %-12s %s\n' family max_err result
    grep -ho 'GPU-SUMMARY .*' logs/*.log | awk '{ printf "%-28s %-12s %s\n", $2, $3, $4 }'
fi
want train && echo "== the README's main job on this GPU: tl train, CPU then --backend cuda (test accuracy)"
want train && for m in mlp cnn transformer; do
    for b in cpu cuda; do
        out=$(timeout "${TL_TRAIN_TIMEOUT:-300}" cli/tl train --model "$m" --backend "$b" 2>&1)
        printf '%s\n' "$out" > "logs/train-$m-$b.log"
        line="$(printf '%s\n' "$out" | grep -E '^done:|^error' | tail -n 1); $(printf '%s\n' "$out" | grep 'wall time' | tail -n 1)"
        printf '%-11s %-5s %s\n' "$m" "$b" "$line"
    done
done
if want bench; then
    echo "== benchmark: ours vs PyTorch eager on this GPU (issue 7)"
    for b in bench/*; do
        timeout "${TL_BENCH_TIMEOUT:-180}" "$b" --backend cuda > logs/ours.jsonl 2> logs/bench.err
        echo "bench exit $? ($(basename "$b")); stderr: $(tail -n 1 logs/bench.err)"
    done
    python3 torch_bench.py --ours logs/ours.jsonl --compile-budget-s "${TL_TORCH_COMPILE_BUDGET:-120}" 2>&1 | tee logs/bench.txt
fi
# The kernels behind the rows with targets, under Nsight Compute when this machine has it: one
# run of each row (--once), every launch of our GEMM, flash and convolution kernels, with the
# sections that say why a kernel is slow (occupancy and its limiter, issue rate, stalls).
want ncu && echo "== kernel profile (ncu): logs/ncu.txt"
want ncu && ncu_bin=$(command -v ncu || ls -d /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if ! want ncu; then
    :
elif [ -n "$ncu_bin" ]; then
    for b in bench/*; do
        timeout "${TL_PROFILE_TIMEOUT:-300}" "$ncu_bin" -k 'regex:^tl_(gemm|flash|conv)' \
            --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
            "$b" --backend cuda --once \
            --only "${TL_PROFILE_ROWS:-matmul/4096,matmul-tf32/4096,matmul-bf16/4096,gemm-core/bf16/1024,attention-core/flash/n4096,attention-core/flash-one-pass/n4096,attention-core/flash-two-pass/n4096,attention-core/flash-wide/n4096,attention-core/flash-d128/n4096,attention-core/flash-narrow-d128/n4096,attention-core/flash-bf16/n4096,attention-fwd/flash/n4096,attention-fwd/flash-tc/n4096,conv/,conv-dw/,conv-dx/}" \
            > logs/ncu.txt 2>&1
        echo "ncu exit $? ($(basename "$b"))"
    done
    grep -E '^  [a-z_0-9]+|Duration|Registers Per Thread|Theoretical Occupancy|Achieved Occupancy|Block Limit|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|ERR' logs/ncu.txt | head -n 200
else
    echo "ncu not found (PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-compute): no kernel profile"
fi
if [ ${#rows[@]} -gt 0 ] && printf '%s\n' "${rows[@]}" | grep -q -E 'FAIL|SKIPPED|TIMEOUT'; then exit 1; fi
"#
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated script parses (`bash -n`): a quoting slip in the raw string would only
    /// show on the GPU machine, where device time is short.
    #[test]
    fn run_sh_is_valid_bash() {
        let out = Command::new("bash")
            .args(["-n", "-c", run_sh()])
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "run.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A bundle of stand-ins (a test binary, `tl`, the bench, nccl_check and torch_bench.py
    /// that each print their name) in a fresh folder; run.sh's output and exit status there
    /// under `TL_RUN_PARTS=parts`.
    fn run_parts(parts: &str) -> (String, i32) {
        let dir = std::env::temp_dir().join(format!("tl-bundle-parts-{}", std::process::id()));
        let dir = dir.join(parts.replace(',', "_"));
        let _ = fs::remove_dir_all(&dir);
        let fake = |path: &str, body: &str| {
            let f = dir.join(path);
            fs::create_dir_all(f.parent().unwrap()).unwrap();
            fs::write(&f, format!("#!/bin/sh\n{body}\n")).unwrap();
            util::status(Command::new("chmod").arg("+x").arg(&f)).unwrap();
        };
        fake("bin/t-1", "echo 'ran the test binary'");
        fake("cli/tl", "echo 'done: trained'");
        fake("bench/gpu-1", "echo '{}'");
        fake("examples/nccl_check", "echo 'PASS nccl'");
        fs::write(dir.join("torch_bench.py"), "print('ran torch_bench')\n").unwrap();
        fs::write(dir.join("run.sh"), run_sh()).unwrap();
        let out = Command::new("bash")
            .arg(dir.join("run.sh"))
            .env("TL_RUN_PARTS", parts)
            .output()
            .expect("bash runs");
        let _ = fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (text, out.status.code().unwrap_or(-1))
    }

    /// `TL_RUN_PARTS` runs the parts it names and no other; an unknown part is refused.
    #[test]
    fn run_sh_runs_the_parts_named() {
        let marks = [
            ("tests", "ran the test binary"),
            ("nccl", "PASS nccl"),
            ("train", "done: trained"),
            ("bench", "ran torch_bench"),
            ("ncu", "== kernel profile (ncu)"),
        ];
        for parts in ["tests", "train,bench", "nccl,ncu", ""] {
            let (text, code) = run_parts(parts);
            assert_eq!(code, 0, "TL_RUN_PARTS={parts}:\n{text}");
            for (part, mark) in marks {
                let named = parts.is_empty() || parts.split(',').any(|p| p == part);
                assert_eq!(
                    text.contains(mark),
                    named,
                    "TL_RUN_PARTS={parts}, part {part}:\n{text}"
                );
            }
        }
        let (text, code) = run_parts("tests,bogus");
        assert_eq!(code, 2, "{text}");
        assert!(text.contains("unknown part 'bogus'"), "{text}");
        assert!(!text.contains("ran the test binary"), "{text}");
    }

    #[test]
    fn only_test_artifacts_with_executables_are_kept() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/gpu-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","profile":{"test":false},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"test":true},"profile":{"test":false},"executable":"/t/bin"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(executables(json), ["/t/gpu-1"]);
    }
}
