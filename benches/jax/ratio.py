#!/usr/bin/env python3
"""Our training steps against JAX-jit on the same models, in one run: prints the ratio table
ours / JAX (issue 13's figure; <= 1.0 means we are as fast or faster).

    python3 benches/jax/ratio.py              # one core (both sides pinned with taskset -c 1)
    python3 benches/jax/ratio.py --cores 2    # every core, each side with its default threads
    python3 benches/jax/ratio.py --rounds 5   # more alternations (default 3)
    python3 benches/jax/ratio.py --quick      # criterion --quick (a short, noisier run)
    python3 benches/jax/ratio.py --models mlp,lm   # a subset (default: all six)

Ours: `cargo bench -p tl-session --bench steps` (criterion medians read from
target/criterion). JAX: steps.py beside this file (the same models: mlp 784-256-256-10 b64, cnn
28x28 b64, transformer block n128 d64 with SGD 0.01; wide mlp 784-4096-4096-10 b256 with SGD,
resnet 3x32x32 b32 with momentum SGD, lm width 256 context 128 b16 with AdamW; f32), run by the
Python in $JAX_PYTHON or
python3. Without JAX the script says so in one line and prints our figures alone. Never run in
CI: speed belongs in benchmarks.

The two sides alternate, model by model, for several rounds, and the table gives the median of
the per-round ratios with their range. A shared VM's cores change speed by tens of percent over
seconds (docs/performance.md, "The VM's cores"); a ratio of two runs minutes apart measures that
as much as the code.
"""
import argparse, json, os, re, shutil, statistics, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = [("mlp", "mlp 784-256-256-10 b64"), ("cnn", "cnn 28x28 b64"),
          ("transformer", "transformer block n128 d64"),
          ("wide-mlp", "wide mlp 784-4096-4096-10 b256"), ("resnet", "resnet 3x32x32 c64 b32"),
          ("lm", "lm d256 n128 b16")]


def pin(cmd, cores):
    if cores == 1 and shutil.which("taskset"):
        return ["taskset", "-c", "1" if os.cpu_count() > 1 else "0"] + cmd
    return cmd


def ours(cores, quick, key, name):
    """Our eager and linked medians (ms) for one model."""
    env = dict(os.environ)
    if cores == 1:
        env["TL_NUM_THREADS"] = "1"
    cmd = ["cargo", "bench", "-q", "-p", "tl-session", "--bench", "steps", "--", name]
    if quick:
        cmd.append("--quick")
    res = subprocess.run(pin(cmd, cores), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        sys.exit(f"cargo bench failed:\n{res.stderr}")
    out = {}
    for kind in ("eager", "linked"):
        est = ROOT / "target" / "criterion" / "train step" / kind / name / "new" / "estimates.json"
        out[kind] = json.loads(est.read_text())["median"]["point_estimate"] / 1e6
    return out


def jax_python():
    """The Python that has JAX, or None (after saying so in one line)."""
    py = os.environ.get("JAX_PYTHON", sys.executable)
    if subprocess.run([py, "-c", "import jax"], capture_output=True).returncode != 0:
        print(f"JAX is not installed for {py} (pip install jax, or set JAX_PYTHON): ours only")
        return None
    return py


def jax(py, cores, key):
    """JAX-jit's median step (ms) for one model."""
    env = dict(os.environ)
    if cores == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    res = subprocess.run(pin([py, str(Path(__file__).with_name("steps.py")), key], cores),
                         env=env, capture_output=True, text=True, check=True)
    m = re.search(rf"jax-jit {key} step: median ([0-9.]+) ms", res.stdout)
    if m is None:
        sys.exit(f"steps.py printed no median for {key}:\n{res.stdout}{res.stderr}")
    return float(m.group(1))


def span(xs, fmt):
    return fmt(statistics.median(xs)) + (f" ({fmt(min(xs))}–{fmt(max(xs))})" if len(xs) > 1 else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, choices=[1, 2], default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=",".join(k for k, _ in MODELS),
                    help="comma-separated subset of " + ", ".join(k for k, _ in MODELS))
    a = ap.parse_args()
    keys = a.models.split(",")
    unknown = [k for k in keys if k not in dict(MODELS)]
    if unknown:
        sys.exit(f"--models: unknown {unknown}; choose from {[k for k, _ in MODELS]}")
    chosen = [(k, n) for k, n in MODELS if k in keys]
    py = jax_python()
    rows = {key: {"jax": [], "eager": [], "linked": [], "re": [], "rl": []} for key, _ in chosen}
    for r in range(max(a.rounds, 1)):
        for key, name in chosen:
            o = ours(a.cores, a.quick, key, name)
            row = rows[key]
            row["eager"].append(o["eager"])
            row["linked"].append(o["linked"])
            if py:
                j = jax(py, a.cores, key)
                row["jax"].append(j)
                row["re"].append(o["eager"] / j)
                row["rl"].append(o["linked"] / j)
            print(f"round {r + 1}: {key}: eager {o['eager']:.3f} ms, linked {o['linked']:.3f} ms"
                  + (f", JAX {row['jax'][-1]:.3f} ms" if py else ""), file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    avx = "AVX-512" if "avx512f" in open("/proc/cpuinfo").read() else "AVX2"
    where = "one core (taskset)" if a.cores == 1 else "all cores"
    print(f"\n{cpu} ({avx}), {where}; medians of {max(a.rounds, 1)} alternated rounds (range)\n")
    print("| step (f32) | JAX-jit | eager | linked | eager/JAX | linked/JAX |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    ms = lambda x: f"{x:.3f}"
    ratio = lambda x: f"{x:.2f}"
    for key, name in chosen:
        row = rows[key]
        js = span(row["jax"], ms) if py else "-"
        re_ = span(row["re"], ratio) if py else "-"
        rl = span(row["rl"], ratio) if py else "-"
        print(f"| {name} | {js} | {span(row['eager'], ms)} | {span(row['linked'], ms)} | {re_} | {rl} |")


if __name__ == "__main__":
    main()
