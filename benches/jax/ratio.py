#!/usr/bin/env python3
"""Our training steps against JAX-jit on the same models, in one run: prints the ratio table
ours / JAX (issue 13's figure; <= 1.0 means we are as fast or faster).

    python3 benches/jax/ratio.py            # one core (both sides pinned with taskset -c 1)
    python3 benches/jax/ratio.py --cores 2  # every core, each side with its default threads
    python3 benches/jax/ratio.py --quick    # criterion --quick (a short, noisier run)

Ours: `cargo bench -p tl-session --bench steps` (criterion medians read from
target/criterion). JAX: steps.py beside this file (the same models: mlp 784-256-256-10 b64, cnn
28x28 b64, transformer block n128 d64; f32, SGD 0.01), run by the Python in $JAX_PYTHON or
python3. Without JAX the script says so in one line and prints our figures alone. Never run in
CI: speed belongs in benchmarks.
"""
import argparse, json, os, re, shutil, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = [("mlp", "mlp 784-256-256-10 b64"), ("cnn", "cnn 28x28 b64"),
          ("transformer", "transformer block n128 d64")]


def pin(cmd, cores):
    if cores == 1 and shutil.which("taskset"):
        return ["taskset", "-c", "1" if os.cpu_count() > 1 else "0"] + cmd
    return cmd


def ours(cores, quick):
    env = dict(os.environ)
    if cores == 1:
        env["TL_NUM_THREADS"] = "1"
    cmd = ["cargo", "bench", "-q", "-p", "tl-session", "--bench", "steps", "--"]
    if quick:
        cmd.append("--quick")
    subprocess.run(pin(cmd, cores), cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    out = {}
    for key, name in MODELS:
        for kind in ("eager", "linked"):
            est = ROOT / "target" / "criterion" / "train step" / kind / name / "new" / "estimates.json"
            out[(key, kind)] = json.loads(est.read_text())["median"]["point_estimate"] / 1e6
    return out


def jax(cores):
    py = os.environ.get("JAX_PYTHON", sys.executable)
    if subprocess.run([py, "-c", "import jax"], capture_output=True).returncode != 0:
        print(f"JAX is not installed for {py} (pip install jax, or set JAX_PYTHON): ours only")
        return None
    env = dict(os.environ)
    if cores == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    res = subprocess.run(pin([py, str(Path(__file__).with_name("steps.py"))], cores),
                         env=env, capture_output=True, text=True, check=True)
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"jax-jit (\w+) step: median ([0-9.]+) ms", res.stdout)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, choices=[1, 2], default=1)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    o = ours(a.cores, a.quick)
    j = jax(a.cores)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    avx = "AVX-512" if "avx512f" in open("/proc/cpuinfo").read() else "AVX2"
    print(f"\n{cpu} ({avx}), {'one core (taskset)' if a.cores == 1 else 'all cores'}\n")
    print("| step (f32, SGD) | JAX-jit | eager | linked | eager/JAX | linked/JAX |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key, name in MODELS:
        e, l = o[(key, "eager")], o[(key, "linked")]
        jj = j.get(key) if j else None
        r = (lambda x: f"{x / jj:.2f}") if jj else (lambda x: "-")
        js = f"{jj:.3f} ms" if jj else "-"
        print(f"| {name} | {js} | {e:.3f} ms | {l:.3f} ms | {r(e)} | {r(l)} |")


if __name__ == "__main__":
    main()
