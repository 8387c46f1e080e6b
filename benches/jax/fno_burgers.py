#!/usr/bin/env python3
"""The JAX twin of `tl train --preset fno-paper` (the FNO paper's Burgers benchmark,
docs/benchmarks.md): the same model, loss, optimizer and schedule on the same data, read from
the cache file `tl` wrote; and the per-epoch wall time of both, in one run, on one core and on
all cores (ours / JAX: <= 1.0 means we are as fast or faster).

    python3 benches/jax/fno_burgers.py --compare            # both, one core then all cores
    python3 benches/jax/fno_burgers.py --compare --grid 512 --epochs 4
    python3 benches/jax/fno_burgers.py --epochs 20          # the JAX twin alone
    python3 benches/jax/fno_burgers.py --epochs 500 --eval-every 50   # the paper's schedule
    python3 benches/jax/fno_burgers.py --eval-checkpoint ck.safetensors  # ours, sample by sample

The data: make it first with `target/release/tl train --preset fno-paper --epochs 0` (the cache
directory is $TL_CACHE_DIR, else $XDG_CACHE_HOME/tl, else ~/.cache/tl, or --data-cache DIR for
both). The file's name and metadata are checked here as `tl` checks them (every parameter of the
data set); a missing or mismatched file is one `error:` line and exit status 1.

The model (crates/tl-nn/src/models.rs `Fno1d` with `PaperRun::fno_config`): input (u0, j/s)
lifted to width 64 by a linear map, 4 Fourier layers `gelu(spectral(h) + pointwise(h))` (no gelu
after the last; exact GELU), each spectral layer the first 16 real-FFT bins times a complex
(64, 64) matrix per bin, projection 64 -> 128 -> gelu -> 1, times the output scale
(`--output-scale`, 0.01 as `tl`'s preset). Initialisation as tl-nn's (PyTorch's
defaults: linear weights and biases uniform in +-1/sqrt(fan_in), spectral weights uniform in
[0, 1/64^2)), other draws. Loss: the batch mean of ||pred - y|| / ||y||. Adam (0.9, 0.999, 1e-8),
lr 1e-3 halved every 100 epochs, L2 weight decay 1e-4/20 added to the gradient (the paper's 1e-4
on the batch's summed loss), batch 20, f32. The first epoch (which compiles) is not timed; ours
has nothing to compile and every epoch counts.

Needs JAX (pip install jax), run by the Python in $JAX_PYTHON or this one. Never run in CI:
speed belongs in benchmarks.
"""
import argparse, json, os, re, shutil, statistics, struct, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The data set of crates/tl-cli/src/fno_paper.rs `PAPER` (its `key()`, floats as Rust's `{:?}`).
KEY = {
    "format": "tl-burgers-cache/1",
    "equation": "burgers on (0,1), periodic",
    "solver": "ifrk4, 2/3 dealiased",
    "seed": str(0xF02021),
    "source_grid": "8192",
    "n_train": "1000",
    "n_test": "200",
    "nu": "0.1",
    "t_end": "1.0",
    "dt": "0.005",
    "grf_sigma": "25.0",
    "grf_tau": "5.0",
    "grf_gamma": "2.0",
}
WIDTH, MODES, LAYERS, PROJ, BATCH, LR = 64, 16, 4, 128, 20, 1e-3
WEIGHT_DECAY = 1e-4 / BATCH


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def fnv1a(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def cache_dir(arg):
    if arg:
        return Path(arg)
    for var, sub in (("TL_CACHE_DIR", ()), ("XDG_CACHE_HOME", ("tl",)), ("HOME", (".cache", "tl"))):
        if os.environ.get(var):
            return Path(os.environ[var], *sub)
    return Path(".tl-cache")


def cache_path(directory):
    text = "".join(f"{k}={KEY[k]};" for k in sorted(KEY))
    return directory / f"burgers-fno-paper-{fnv1a(text.encode()):016x}.safetensors"


def read_cache(path):
    """u0 and uT, (1200, 8192) float32, after checking the header against KEY."""
    import numpy as np
    if not path.is_file():
        die(f"no data cache at {path}; make it with `target/release/tl train --preset fno-paper "
            f"--epochs 0` (same --data-cache)")
    raw = path.read_bytes()
    try:
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
    except Exception as e:  # noqa: BLE001 - any decoding failure is a damaged file
        die(f"data cache {path}: not a valid safetensors file ({e}); delete it to make it again")
    meta = header.pop("__metadata__", {})
    for k, v in KEY.items():
        if meta.get(k) != v:
            die(f"data cache {path}: metadata {k} is {meta.get(k)!r}, expected {v!r}")
    pairs, grid = int(KEY["n_train"]) + int(KEY["n_test"]), int(KEY["source_grid"])
    out = {}
    for name in ("u0", "uT"):
        t = header.get(name)
        if not t or t["dtype"] != "F32" or t["shape"] != [pairs, grid]:
            die(f"data cache {path}: tensor {name} is {t}, expected F32 [{pairs}, {grid}]")
        a, b = t["data_offsets"]
        if 8 + n + b > len(raw):
            die(f"data cache {path}: truncated; delete it to make it again")
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(pairs, grid)
    return out["u0"], out["uT"]


def splits(u0, ut, s, n_train):
    import numpy as np
    step = u0.shape[1] // s
    x = np.stack([u0[:, ::step], np.broadcast_to(np.arange(s, dtype=np.float32) / s, (len(u0), s))], -1)
    y = ut[:, ::step, None]
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def forward(p, x, scale):
    """The twin's FNO on a batch x (B, s, 2) with parameters p (the twin's layout), its output
    multiplied by `scale` (`--output-scale`)."""
    import jax, jax.numpy as jnp
    gelu = lambda v: jax.nn.gelu(v, approximate=False)
    h = x @ p["lift"][0] + p["lift"][1]
    s = h.shape[1]
    for l in range(LAYERS):
        hf = jnp.fft.rfft(h, axis=1)[:, :MODES, :]
        w = p[f"re{l}"] + 1j * p[f"im{l}"]
        of = jnp.einsum("bmi,mio->bmo", hf, w)
        of = jnp.pad(of, ((0, 0), (0, s // 2 + 1 - MODES), (0, 0)))
        h = jnp.fft.irfft(of, n=s, axis=1) + h @ p[f"w{l}"][0] + p[f"w{l}"][1]
        if l < LAYERS - 1:
            h = gelu(h)
    h = gelu(h @ p["proj0"][0] + p["proj0"][1])
    return scale * (h @ p["proj2"][0] + p["proj2"][1])


def read_checkpoint(path):
    """The model of a `tl train --preset fno-paper --save PATH` checkpoint, in the twin's layout
    (tl-nn's `Linear` keeps (out, in) weights; the twin multiplies by (in, out)), and its output
    scale (metadata `output_scale`; 1 in checkpoints written before it was recorded)."""
    import numpy as np
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    def get(name):
        t = head.get(name)
        if t is None or t["dtype"] != "F32":
            die(f"checkpoint {path}: no F32 tensor {name}: is it a --preset fno-paper checkpoint?")
        a, b = t["data_offsets"]
        return np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(t["shape"])
    lin = lambda k: (get(f"{k}.weight").T, get(f"{k}.bias"))
    p = {"lift": lin("lift"), "proj0": lin("proj.0"), "proj2": lin("proj.2")}
    for l in range(LAYERS):
        p[f"re{l}"], p[f"im{l}"] = get(f"spectral.{l}.weight_re"), get(f"spectral.{l}.weight_im")
        p[f"w{l}"] = lin(f"pointwise.{l}")
    return p, float(head.get("__metadata__", {}).get("output_scale", 1.0))


def eval_checkpoint(a):
    """The test error of a checkpoint of ours, sample by sample, beside the target's size."""
    import numpy as np
    u0, ut = read_cache(cache_path(cache_dir(a.data_cache)))
    _, (xte, yte) = splits(u0, ut, a.grid, int(KEY["n_train"]))
    params, scale = read_checkpoint(a.eval_checkpoint)
    pred = np.asarray(forward(params, xte, scale))
    err = np.sqrt(((pred - yte) ** 2).sum((1, 2)) / (yte ** 2).sum((1, 2)))
    size = np.sqrt((yte ** 2).mean((1, 2)))
    order = np.argsort(size)
    q = lambda v: " ".join(f"{x:.2e}" for x in np.quantile(v, [0, 0.1, 0.5, 0.9, 1]))
    print(f"checkpoint {a.eval_checkpoint} (output scale {scale}), s = {a.grid}, {len(err)} test pairs")
    print(f"test relative L2 (mean): {err.mean():.3e}")
    print(f"relative L2 quantiles (0, 10, 50, 90, 100%): {q(err)}")
    print(f"rms of u(1) quantiles:                      {q(size)}")
    print(f"absolute rms error quantiles:                {q(err * size)}")
    # Where the error lies: the grid mean (u(1) has mean 0: the equation keeps u0's, 0) and the
    # first Fourier mode (nearly all of u(1) at nu = 0.1).
    e = np.abs(np.fft.rfft((pred - yte)[..., 0], axis=1)) ** 2
    share = lambda part: 100 * float(np.mean(part / e.sum(1)))
    print(f"share of the squared error: grid mean {share(e[:, 0]):.0f}%, first mode "
          f"{share(e[:, 1]):.0f}%, the rest {share(e[:, 2:].sum(1)):.0f}%; the prediction's grid "
          f"mean: {q(pred[..., 0].mean(1))}")
    for frac in (0.05, 0.1, 0.2):
        k = int(len(err) * frac)
        small = order[:k]
        print(f"the {k} pairs with the smallest u(1): {100 * err[small].sum() / err.sum():.0f}% of the "
              f"summed error; the mean without them {err[order[k:]].mean():.3e}")


def twin(a):
    """Train the JAX twin; print the per-epoch times and the test error."""
    import numpy as np
    import jax, jax.numpy as jnp

    u0, ut = read_cache(cache_path(cache_dir(a.data_cache)))
    (xtr, ytr), (xte, yte) = splits(u0, ut, a.grid, int(KEY["n_train"]))
    key = jax.random.split(jax.random.PRNGKey(a.seed), 4 + 3 * LAYERS)

    def linear(k, i, o):
        k1, k2 = jax.random.split(k)
        bound = 1.0 / np.sqrt(i)
        return (jax.random.uniform(k1, (i, o), minval=-bound, maxval=bound),
                jax.random.uniform(k2, (o,), minval=-bound, maxval=bound))

    p = {"lift": linear(key[0], 2, WIDTH), "proj0": linear(key[1], WIDTH, PROJ),
         "proj2": linear(key[2], PROJ, 1)}
    for l in range(LAYERS):
        hi = 1.0 / (WIDTH * WIDTH)
        p[f"re{l}"] = jax.random.uniform(key[3 + 3 * l], (MODES, WIDTH, WIDTH), maxval=hi)
        p[f"im{l}"] = jax.random.uniform(key[4 + 3 * l], (MODES, WIDTH, WIDTH), maxval=hi)
        p[f"w{l}"] = linear(key[5 + 3 * l], WIDTH, WIDTH)

    def rel_l2(p, x, y):
        d = forward(p, x, a.output_scale) - y
        return jnp.mean(jnp.sqrt(jnp.sum(d * d, (1, 2)) / jnp.sum(y * y, (1, 2))))

    @jax.jit
    def step(p, m, v, t, lr, x, y):
        loss, g = jax.value_and_grad(rel_l2)(p, x, y)
        g = jax.tree_util.tree_map(lambda g, w: g + WEIGHT_DECAY * w, g, p)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        p = jax.tree_util.tree_map(
            lambda w, m, v: w - lr * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), p, m, v)
        return p, m, v, loss

    evaluate = jax.jit(rel_l2)
    m = jax.tree_util.tree_map(jnp.zeros_like, p)
    v = jax.tree_util.tree_map(jnp.zeros_like, p)
    rng = np.random.default_rng(a.seed)
    t, times = 0, []
    for epoch in range(1, a.epochs + 1):
        lr = LR * 0.5 ** ((epoch - 1) // 100)
        order = rng.permutation(len(xtr))
        start, total = time.perf_counter(), 0.0
        for i in range(0, len(order), BATCH):
            idx = order[i:i + BATCH]
            t += 1
            p, m, v, loss = step(p, m, v, t, lr, xtr[idx], ytr[idx])
            total += float(loss) * len(idx)
        secs = time.perf_counter() - start
        if epoch > 1:
            times.append(secs)
        print(f"epoch {epoch:>3}/{a.epochs}  loss {total / len(xtr):.4f}  {secs:.2f} s", flush=True)
        if a.eval_every and epoch % a.eval_every == 0 and epoch < a.epochs:
            print(f"epoch {epoch}: test relative L2 {float(evaluate(p, xte, yte)):.3e}", flush=True)
    test = float(evaluate(p, xte, yte))
    print(f"jax fno-paper s={a.grid}: test relative L2 {test:.3e} ({100 * test:.2f}%)")
    if times:
        print(f"jax wall time per epoch: {statistics.median(times):.3f} s (median of epochs 2..{a.epochs})")


def pin(cmd, cores):
    if cores == 1 and shutil.which("taskset"):
        return ["taskset", "-c", "1" if os.cpu_count() > 1 else "0"] + cmd
    return cmd


def compare(a):
    """Ours and the twin, alternated, on one core and on all cores."""
    py = os.environ.get("JAX_PYTHON", sys.executable)
    if subprocess.run([py, "-c", "import jax"], capture_output=True).returncode != 0:
        die(f"JAX is not installed for {py} (pip install jax, or set JAX_PYTHON)")
    tl = ROOT / "target" / "release" / "tl"
    if not tl.exists():
        die(f"{tl} is missing: cargo build --release -p tl-cli")
    read_cache(cache_path(cache_dir(a.data_cache)))  # fail early, before any timing
    cache = ["--data-cache", str(cache_dir(a.data_cache))]
    rows = []
    for cores in (1, os.cpu_count() or 1):
        env = dict(os.environ)
        if cores == 1:
            env["TL_NUM_THREADS"] = "1"
            env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        scale = ["--output-scale", repr(a.output_scale)]
        ours_cmd = [str(tl), "train", "--preset", "fno-paper", "--grid", str(a.grid),
                    "--epochs", str(a.epochs - 1), "--super-grid", "0"] + cache + scale
        jax_cmd = [py, __file__, "--grid", str(a.grid), "--epochs", str(a.epochs)] + cache + scale
        r1 = subprocess.run(pin(ours_cmd, cores), env=env, capture_output=True, text=True)
        r2 = subprocess.run(pin(jax_cmd, cores), env=env, capture_output=True, text=True)
        if r1.returncode or r2.returncode:
            die(f"a run failed:\n{r1.stderr[-2000:]}\n{r2.stderr[-2000:]}")
        o = float(re.search(r"wall time per epoch: ([0-9.]+) s", r1.stdout).group(1))
        j = float(re.search(r"jax wall time per epoch: ([0-9.]+) s", r2.stdout).group(1))
        rows.append((cores, o, j))
        print(f"{cores} core(s): ours {o:.3f} s, JAX {j:.3f} s", file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"\n{cpu}; --preset fno-paper, s = {a.grid}, 1000 pairs, batch 20; "
          f"{a.epochs - 1} timed epoch(s) each\n")
    print("| cores | ours (s/epoch) | JAX-jit (s/epoch) | ours / JAX |")
    print("| ---: | ---: | ---: | ---: |")
    for cores, o, j in rows:
        print(f"| {cores} | {o:.3f} | {j:.3f} | {o / j:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3, help="the twin's epochs (the first untimed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-cache", default=None)
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--eval-checkpoint", metavar="PATH",
                    help="evaluate a `tl train --preset fno-paper --save PATH` checkpoint "
                         "sample by sample on the test pairs (no training)")
    ap.add_argument("--output-scale", type=float, default=0.01, metavar="C",
                    help="the model's output is multiplied by C, as tl's --output-scale "
                         "(1: the paper's model as published)")
    ap.add_argument("--eval-every", type=int, default=0, metavar="N",
                    help="also print the test error every N epochs (0: only at the end)")
    a = ap.parse_args()
    if a.grid < 2 * MODES or a.grid & (a.grid - 1) or a.grid > int(KEY["source_grid"]):
        die(f"--grid {a.grid}: must be a power of two between {2 * MODES} and {KEY['source_grid']}")
    if a.epochs < 2:
        die(f"--epochs {a.epochs}: at least 2 (the first compiles and is not timed)")
    if a.eval_checkpoint:
        eval_checkpoint(a)
    else:
        compare(a) if a.compare else twin(a)


if __name__ == "__main__":
    main()
