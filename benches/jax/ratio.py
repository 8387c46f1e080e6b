#!/usr/bin/env python3
"""Our training steps against JAX-jit on the same models, in one run: prints the ratio table
ours / JAX (issue 13's figure; <= 1.0 means we are as fast or faster).

    python3 benches/jax/ratio.py              # one core (both sides pinned with taskset -c 1)
    python3 benches/jax/ratio.py --cores 2    # every core, each side with its default threads
    python3 benches/jax/ratio.py --rounds 5   # more alternations (default 3)
    python3 benches/jax/ratio.py --quick      # criterion --quick (a short, noisier run)
    python3 benches/jax/ratio.py --models mlp,lm   # a subset (default: all six)
    python3 benches/jax/ratio.py --no-memory  # the step times and rates only

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

Then the rates: each model's FLOP per training step (`step_flops` below, one formula for both
sides) over the median step time, in GFLOP/s and in % of this machine's f32 GEMM peak, measured
at the start of every round, the best round kept (ours: `cargo run --release -p tl-tape-cpu
--example gemm_peak`, a 2048³ product, best of 5; XLA's `jax.jit(a @ b)` beside it:
`steps.py --gemm`).

Then the memory (skip with --no-memory): each model and each side in a process of its own, at the
same cores. Ours: `cargo run --release -p tl-session --example step_memory -- <model> eager|linked`
(the live heap's peak during a steady-state step, counted by a global allocator, and what is
live between steps: parameters, optimizer state, the tape's pool). JAX: `steps.py --memory`
(XLA's buffer assignment of the compiled step, `memory_analysis()`: argument + output + temp
bytes, and the same with the arguments donated). Both: the process's RSS before the first step
and its high-water mark (VmHWM) after warm-up and the measured steps.
"""
import argparse, json, os, re, shutil, statistics, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = [("mlp", "mlp 784-256-256-10 b64"), ("cnn", "cnn 28x28 b64"),
          ("transformer", "transformer block n128 d64"),
          ("wide-mlp", "wide mlp 784-4096-4096-10 b256"), ("resnet", "resnet 3x32x32 c64 b32"),
          ("lm", "lm d256 n128 b16")]


MIB = 1024 * 1024


def step_flops(key):
    """FLOP of one training step of `key`: the matrix products, the convolutions (as products:
    batch·height·width rows, in-channels·9 deep, out-channels wide) and the attention's two
    products per head (causal ones counted in full); 2·m·k·n each in the forward pass, twice
    that in the backward (the input's and the weight's gradient), except where the product's
    input is the batch itself (the first layer of the mlps, the cnn and the ResNet: no input
    gradient). Element-wise ops, norms, pooling, the loss and the optimizer are not counted."""
    prods = []  # (m, k, n, input is the batch)
    def mlp(sizes, batch):
        prods.extend((batch, i, o, j == 0) for j, (i, o) in enumerate(zip(sizes, sizes[1:])))
    def attention(seqs, n, d, heads):
        dh = d // heads
        prods.extend([(n, dh, n, False), (n, n, dh, False)] * (seqs * heads))
    if key == "mlp":
        mlp([784, 256, 256, 10], 64)
    elif key == "wide-mlp":
        mlp([784, 4096, 4096, 10], 256)
    elif key == "cnn":
        prods += [(64 * 28 * 28, 1 * 9, 8, True), (64 * 14 * 14, 8 * 9, 16, False), (64, 784, 10, False)]
    elif key == "transformer":
        n, d = 128, 64
        prods += [(n, d, d, False)] * 4 + [(n, d, 4 * d, False), (n, 4 * d, d, False), (n, d, 10, False)]
        attention(1, n, d, 4)
    elif key == "resnet":
        rows = 32 * 32 * 32
        prods += [(rows, 3 * 9, 64, True)] + [(rows, 64 * 9, 64, False)] * 8 + [(32, 64, 10, False)]
    elif key == "lm":
        b, n, d, ff = 16, 128, 256, 1024
        for _ in range(4):
            prods += [(b * n, d, d, False)] * 4 + [(b * n, d, ff, False), (b * n, ff, d, False)]
            attention(b, n, d, 4)
        prods.append((b * n, d, 72, False))
    else:
        raise KeyError(key)
    return sum(2 * m * k * n * (2 if batch else 3) for m, k, n, batch in prods)


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


def build_examples():
    """Build our two measuring examples once (the release profile, as the benches)."""
    cmd = ["cargo", "build", "--release", "-q", "-p", "tl-tape-cpu", "-p", "tl-session",
           "--example", "gemm_peak", "--example", "step_memory"]
    res = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        sys.exit(f"cargo build of the examples failed:\n{res.stderr}")


def example(name):
    return str(ROOT / "target" / "release" / "examples" / name)


def run_pinned(cmd, cores, env, what):
    """Run `cmd` pinned to `cores` with `env`; its stdout, or exit naming `what`."""
    res = subprocess.run(pin(cmd, cores), cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{what} failed:\n{res.stdout}{res.stderr}")
    return res.stdout


def our_env(cores):
    env = dict(os.environ)
    if cores == 1:
        env["TL_NUM_THREADS"] = "1"
    return env


def jax_env(cores):
    env = dict(os.environ)
    if cores == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    return env


def gemm_peaks(py):
    """GFLOP/s of a 2048³ f32 product at one core and at every core: {"ours": {1: r, 2: r},
    "jax": {...}} (no "jax" without JAX)."""
    out = {"ours": {}, "jax": {}}
    for cores in (1, 2):
        o = run_pinned([example("gemm_peak")], cores, our_env(cores), "gemm_peak")
        out["ours"][cores] = float(re.search(r"gflops=([0-9.]+)", o).group(1))
        if py:
            o = run_pinned([py, str(Path(__file__).with_name("steps.py")), "--gemm", "2048"],
                           cores, jax_env(cores), "steps.py --gemm")
            out["jax"][cores] = float(re.search(r"gflops=([0-9.]+)", o).group(1))
    return out


def memory(py, cores, quick, key):
    """{"eager": ..., "linked": ..., "jax": ...}: the JSON each side's memory run prints."""
    steps = ["--warm", "3", "--steps", "1"] if quick else []
    out = {}
    for kind in ("eager", "linked"):
        o = run_pinned([example("step_memory"), key, kind] + steps, cores, our_env(cores),
                       f"step_memory {key} {kind}")
        out[kind] = json.loads(o.strip().splitlines()[-1])
    if py:
        o = run_pinned([py, str(Path(__file__).with_name("steps.py")), "--memory", key], cores,
                       jax_env(cores), f"steps.py --memory {key}")
        out["jax"] = json.loads(o.strip().splitlines()[-1])
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
    res = subprocess.run(pin([py, str(Path(__file__).with_name("steps.py")), key], cores),
                         env=jax_env(cores), capture_output=True, text=True, check=True)
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
    ap.add_argument("--no-memory", action="store_true", help="skip the memory table")
    ap.add_argument("--models", default=",".join(k for k, _ in MODELS),
                    help="comma-separated subset of " + ", ".join(k for k, _ in MODELS))
    a = ap.parse_args()
    keys = a.models.split(",")
    unknown = [k for k in keys if k not in dict(MODELS)]
    if unknown:
        sys.exit(f"--models: unknown {unknown}; choose from {[k for k, _ in MODELS]}")
    chosen = [(k, n) for k, n in MODELS if k in keys]
    py = jax_python()
    build_examples()
    peaks = {"ours": {}, "jax": {}}
    rows = {key: {"jax": [], "eager": [], "linked": [], "re": [], "rl": []} for key, _ in chosen}
    for r in range(max(a.rounds, 1)):
        # The peak is the best rate seen: measured every round, as the cores' speed moves.
        for side, rates_ in gemm_peaks(py).items():
            for cores, rate in rates_.items():
                peaks[side][cores] = max(rate, peaks[side].get(cores, 0.0))
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
    mem = {} if a.no_memory else {key: memory(py, a.cores, a.quick, key) for key, _ in chosen}
    rates(chosen, rows, peaks, mem, a.cores, py)
    if mem:
        memory_tables(chosen, mem, a.cores)


def rates(chosen, rows, peaks, mem, cores, py):
    """The rate table: GFLOP per step, GFLOP/s of each side, % of our GEMM peak."""
    peak = peaks["ours"][cores]
    jp = peaks["jax"]
    print(f"\nf32 GEMM 2048³, best of 5 in each round, the best round, GFLOP/s: ours {peaks['ours'][1]:.1f} one core, "
          f"{peaks['ours'][2]:.1f} all cores"
          + (f"; XLA jax.jit(a @ b) {jp[1]:.1f} one core, {jp[2]:.1f} all cores" if jp else "")
          + f". % below: of ours at {'one core' if cores == 1 else 'all cores'} ({peak:.1f}).\n")
    xla = any("jax" in m for m in mem.values())
    print("| step (f32) | GFLOP per step" + (" (XLA's count)" if xla else "")
          + " | JAX-jit GFLOP/s (% peak) | eager GFLOP/s (% peak) | linked GFLOP/s (% peak) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for key, name in chosen:
        f = step_flops(key)
        rate = lambda ms_: f"{f / (ms_ * 1e-3) / 1e9:.1f} ({100 * f / (ms_ * 1e-3) / 1e9 / peak:.0f}%)"
        row = rows[key]
        count = f"{f / 1e9:.3f}"
        if xla and mem.get(key, {}).get("jax", {}).get("xla_flops"):
            count += f" ({mem[key]['jax']['xla_flops'] / 1e9:.3f})"
        js = rate(statistics.median(row["jax"])) if py else "-"
        print(f"| {name} | {count} | {js} | {rate(statistics.median(row['eager']))} | "
              f"{rate(statistics.median(row['linked']))} |")


def memory_tables(chosen, mem, cores):
    """Peak memory per step, ours against XLA's, and where ours is held."""
    mib = lambda b: "-" if b is None else f"{b / MIB:.2f}"
    where = "one core" if cores == 1 else "all cores"
    print(f"\nMemory per training step, MiB ({where}; each model and side in its own process). "
          "Ours: the live heap's peak during a steady-state step (everything: parameters, "
          "optimizer state, batch, the step's buffers). JAX: XLA's buffers for one execution of "
          "the compiled step, argument + output + temp (donated: the arguments donated, "
          "output aliased). RSS: before the first step -> high-water mark.\n")
    have_jax = any("jax" in m for m in mem.values())
    print("| step (f32) | eager peak | linked peak | JAX args + out + temp (donated) | eager / JAX | "
          "linked / JAX | RSS eager | RSS linked | RSS JAX |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, name in chosen:
        m = mem[key]
        e, l, j = m["eager"], m["linked"], m.get("jax")
        rss = lambda r: f"{mib(r['rss_before_first_step'])} -> {mib(r['rss_hwm'])}"
        if j:
            total = j["argument"] + j["output"] + j["temp"] - j["alias"]
            donated = j["argument"] + j["donated_output"] + j["donated_temp"] - j["donated_alias"]
            js, rj = f"{mib(total)} ({mib(donated)})", rss(j)
            re_, rl = f"{e['step_peak'] / total:.2f}", f"{l['step_peak'] / total:.2f}"
        else:
            js = re_ = rl = rj = "-"
        print(f"| {name} | {mib(e['step_peak'])} | {mib(l['step_peak'])} | {js} | {re_} | {rl} | "
              f"{rss(e)} | {rss(l)} | {rj} |")
    print("\nWhere ours is held (MiB; eager / linked where they differ): between steps, "
          "parameters + optimizer state + the tape's pool (the last step's buffers, reused by "
          "the next) + the rest (the batch, the GEMM's packing buffers, the session); the "
          "step's growth over that; what the process keeps once the session is dropped."
          + (" JAX: XLA's parts." if have_jax else "") + "\n")
    print("| step (f32) | params | optimizer state | pool | rest | live between steps | step growth | "
          "after drop |" + (" XLA args / out / temp | XLA temp donated |" if have_jax else ""))
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if have_jax else ""))
    for key, name in chosen:
        e, l, j = mem[key]["eager"], mem[key]["linked"], mem[key].get("jax")
        pool = lambda r: r["pool_held"] or 0
        rest = lambda r: r["live_before_step"] - r["params"] - r["optimizer_state"] - pool(r)
        both = lambda f: mib(f(e)) if mib(f(e)) == mib(f(l)) else f"{mib(f(e))} / {mib(f(l))}"
        line = (f"| {name} | {mib(e['params'])} | {both(lambda r: r['optimizer_state'])} | "
                f"{both(pool)} | {both(rest)} | {both(lambda r: r['live_before_step'])} | "
                f"{both(lambda r: r['step_growth'])} | {both(lambda r: r['live_after_drop'])} |")
        if have_jax:
            line += (f" {mib(j['argument'])} / {mib(j['output'])} / {mib(j['temp'])} | "
                     f"{mib(j['donated_temp'])} |" if j else " - | - |")
        print(line)


if __name__ == "__main__":
    main()
