# Keep the models in step with crates/tl-session/benches/common/models.rs (tl-nn's models).
"""Anchor: JAX-jit (XLA CPU) training steps of the project's step benchmarks
(crates/tl-session/benches/common/models.rs, built from tl_nn::models): mlp 784-256-256-10 b64,
cnn 28x28 b64, transformer block n128 d64; f32, cross-entropy, SGD 0.01. And the realistic sizes:
wide-mlp 784-4096-4096-10 b256 (SGD 0.01), resnet (models::ResNet: 3x32x32 b32, stem + 4 basic
blocks of 64 channels with batch norm in training mode, SGD 0.01 momentum 0.9), lm
(models::TransformerLm: vocab 72, context 128, width 256, 4 causal blocks, batch 16, AdamW 1e-3
with PyTorch's defaults). The same shapes and the same initial distributions as tl-nn's PyTorch
defaults: linear and conv weights and biases uniform in +-1/sqrt(fan_in); attention wq, wk, wv
Xavier-uniform, applied as x @ W; layer and batch norms 1 and 0; embeddings N(0, 1), the LM's
positions N(0, 0.02^2); inputs uniform in +-1 (other draws than ours). Prints the median step
time of each.

Run: python steps.py [mlp|cnn|transformer|wide-mlp|resnet|lm ...]   (pip install jax; pin to one core with taskset -c N
for a one-thread comparison). `python steps.py --memory MODEL ...` prints XLA's memory and FLOP
analysis of each compiled step and the process's RSS as JSON (`memory` below);
`python steps.py --gemm [N]` times jax.jit(a @ b) at N x N (default 2048)."""
import sys, time
import jax, jax.numpy as jnp

def fan_in(shape):
    n = 1
    for d in shape[1:]:
        n *= d
    return n

def w(key, shape):
    """nn.Linear / nn.Conv2d weight: uniform in +-1/sqrt(fan_in)."""
    return jax.random.uniform(key, shape, minval=-1, maxval=1) / jnp.sqrt(fan_in(shape))

def b(key, weight_shape):
    """Their bias: uniform in +-1/sqrt(fan_in) of the weight."""
    return jax.random.uniform(key, weight_shape[:1], minval=-1, maxval=1) / jnp.sqrt(fan_in(weight_shape))

def xavier(key, d):
    """nn.MultiheadAttention's in_proj: Xavier-uniform, +-sqrt(6/(d+d))."""
    return jax.random.uniform(key, (d, d), minval=-1, maxval=1) * jnp.sqrt(6.0 / (2 * d))

def ce(logits, y):
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(logp[jnp.arange(logits.shape[0]), y])

def mlp_of(sizes, batch, seed):
    """A relu MLP through `sizes`, cross-entropy on a fixed batch; SGD."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 2 * len(sizes) + 1)
    shapes = [(o, i) for i, o in zip(sizes, sizes[1:])]
    p = [t for k, sh in enumerate(shapes) for t in (w(ks[2 * k], sh), b(ks[2 * k + 1], sh))]
    x = jax.random.uniform(ks[-1], (batch, sizes[0]), minval=-1, maxval=1)
    y = (jnp.arange(batch) * 7 + 3) % 10
    def loss(p):
        h = x
        for k in range(0, len(p) - 2, 2):
            h = jax.nn.relu(h @ p[k].T + p[k + 1])
        return ce(h @ p[-2].T + p[-1], y)
    return p, loss, "sgd"

def mlp():
    return mlp_of([784, 256, 256, 10], 64, 0)

def cnn():
    ks = jax.random.split(jax.random.PRNGKey(1), 7)
    shapes = [(8, 1, 3, 3), (16, 8, 3, 3), (10, 784)]
    p = [t for k, sh in enumerate(shapes) for t in (w(ks[2 * k], sh), b(ks[2 * k + 1], sh))]
    x = jax.random.uniform(ks[6], (64, 1, 28, 28), minval=-1, maxval=1)
    y = (jnp.arange(64) * 7 + 3) % 10
    def conv(h, k, b):
        o = jax.lax.conv_general_dilated(h, k, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return o + b[None, :, None, None]
    def pool(h):
        return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    def loss(p):
        h = pool(jax.nn.relu(conv(x, p[0], p[1])))
        h = pool(jax.nn.relu(conv(h, p[2], p[3])))
        return ce(h.reshape(64, 784) @ p[4].T + p[5], y)
    return p, loss

def transformer():
    n, d, heads = 128, 64, 4
    ks = jax.random.split(jax.random.PRNGKey(2), 11)
    p = [jnp.ones(d), jnp.zeros(d), xavier(ks[0], d), xavier(ks[1], d), xavier(ks[2], d), w(ks[3], (d, d)),
         jnp.ones(d), jnp.zeros(d), w(ks[4], (4 * d, d)), b(ks[5], (4 * d, d)), w(ks[6], (d, 4 * d)), b(ks[7], (d, 4 * d)),
         w(ks[8], (10, d)), b(ks[9], (10, d))]
    x = jax.random.uniform(ks[10], (n, d), minval=-1, maxval=1)
    y = (jnp.arange(n) * 7 + 3) % 10
    def ln(h, g, b):
        m = h.mean(-1, keepdims=True)
        v = ((h - m) ** 2).mean(-1, keepdims=True)
        return (h - m) / jnp.sqrt(v + 1e-5) * g + b
    def mha(h, wq, wk, wv, wo):
        q, k, v = (h @ wq, h @ wk, h @ wv)
        split = lambda t: t.reshape(n, heads, d // heads).transpose(1, 0, 2)
        q, k, v = split(q), split(k), split(v)
        a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / jnp.sqrt(d // heads), axis=-1) @ v
        return a.transpose(1, 0, 2).reshape(n, d) @ wo
    def loss(p):
        x1 = x + mha(ln(x, p[0], p[1]), p[2], p[3], p[4], p[5])
        h = jax.nn.gelu(ln(x1, p[6], p[7]) @ p[8].T + p[9], approximate=True)
        x2 = x1 + h @ p[10].T + p[11]
        return ce(x2 @ p[12].T + p[13], y)
    return p, loss

def ln(h, g, b):
    m = h.mean(-1, keepdims=True)
    v = ((h - m) ** 2).mean(-1, keepdims=True)
    return (h - m) / jnp.sqrt(v + 1e-5) * g + b

def wide_mlp():
    return mlp_of([784, 4096, 4096, 10], 256, 3)

def resnet():
    c, blocks, batch = 64, 4, 32
    ks = iter(jax.random.split(jax.random.PRNGKey(4), 64))
    def conv_p(cin):
        sh = (c, cin, 3, 3)
        return [w(next(ks), sh), b(next(ks), sh)]
    bn_p = lambda: [jnp.ones(c), jnp.zeros(c)]
    p = conv_p(3) + bn_p()
    for _ in range(blocks):
        p += conv_p(c) + bn_p() + conv_p(c) + bn_p()
    p += [w(next(ks), (10, c)), b(next(ks), (10, c))]
    x = jax.random.uniform(next(ks), (batch, 3, 32, 32), minval=-1, maxval=1)
    y = (jnp.arange(batch) * 7 + 3) % 10
    def conv(h, k, bias):
        o = jax.lax.conv_general_dilated(h, k, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return o + bias[None, :, None, None]
    def bn(h, g, beta):
        # Training mode: the batch's statistics (biased variance), as nn.BatchNorm2d.
        m = h.mean((0, 2, 3), keepdims=True)
        v = ((h - m) ** 2).mean((0, 2, 3), keepdims=True)
        return (h - m) / jnp.sqrt(v + 1e-5) * g[None, :, None, None] + beta[None, :, None, None]
    def loss(p):
        h = jax.nn.relu(bn(conv(x, p[0], p[1]), p[2], p[3]))
        for k in range(blocks):
            q = p[4 + 8 * k: 12 + 8 * k]
            t = jax.nn.relu(bn(conv(h, q[0], q[1]), q[2], q[3]))
            h = jax.nn.relu(h + bn(conv(t, q[4], q[5]), q[6], q[7]))
        return ce(h.mean((2, 3)) @ p[-2].T + p[-1], y)
    return p, loss, "momentum"

def lm():
    vocab, n, d, heads, ff, blocks, batch = 72, 128, 256, 4, 1024, 4, 16
    ks = iter(jax.random.split(jax.random.PRNGKey(5), 64))
    p = [jax.random.normal(next(ks), (vocab, d)), 0.02 * jax.random.normal(next(ks), (n, d))]
    for _ in range(blocks):
        p += [jnp.ones(d), jnp.zeros(d)] + [xavier(next(ks), d) for _ in range(3)] + [w(next(ks), (d, d))]
        p += [jnp.ones(d), jnp.zeros(d), w(next(ks), (ff, d)), b(next(ks), (ff, d)), w(next(ks), (d, ff)), b(next(ks), (d, ff))]
    p += [jnp.ones(d), jnp.zeros(d), w(next(ks), (vocab, d)), b(next(ks), (vocab, d))]
    tok = (jnp.arange(batch * n) * 31 + 7) % vocab
    y = (jnp.arange(1, batch * n + 1) * 31 + 7) % vocab
    causal = jnp.tril(jnp.ones((n, n), dtype=bool))
    def mha(h, wq, wk, wv, wo):
        split = lambda t: t.reshape(batch, n, heads, d // heads).transpose(0, 2, 1, 3)
        q, k, v = split(h @ wq), split(h @ wk), split(h @ wv)
        s = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d // heads), -jnp.inf)
        a = jax.nn.softmax(s, axis=-1) @ v
        return a.transpose(0, 2, 1, 3).reshape(batch, n, d) @ wo
    def loss(p):
        h = p[0][tok].reshape(batch, n, d) + p[1]
        for k in range(blocks):
            q = p[2 + 12 * k: 14 + 12 * k]
            h = h + mha(ln(h, q[0], q[1]), q[2], q[3], q[4], q[5])
            f = jax.nn.gelu(ln(h, q[6], q[7]) @ q[8].T + q[9], approximate=True)
            h = h + f @ q[10].T + q[11]
        logits = ln(h, p[-4], p[-3]) @ p[-2].T + p[-1]
        return ce(logits.reshape(batch * n, vocab), y)
    return p, loss, "adamw"

def optimizer(kind, p):
    """(state, update) of SGD 0.01, SGD 0.01 with momentum 0.9, or AdamW 1e-3 (betas 0.9,
    0.999, eps 1e-8, weight decay 0.01: PyTorch's defaults), as the Rust side trains."""
    if kind == "sgd":
        return (), lambda p, g, s: ([a - 0.01 * b for a, b in zip(p, g)], s)
    if kind == "momentum":
        def upd(p, g, s):
            buf = [0.9 * m + gi for m, gi in zip(s, g)]
            return [a - 0.01 * m for a, m in zip(p, buf)], buf
        return [jnp.zeros_like(a) for a in p], upd
    def adamw(p, g, s):
        m, v, t = s
        t = t + 1
        m = [0.9 * mi + 0.1 * gi for mi, gi in zip(m, g)]
        v = [0.999 * vi + 0.001 * gi * gi for vi, gi in zip(v, g)]
        c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        p = [a * (1 - 1e-3 * 0.01) - 1e-3 * (mi / c1) / (jnp.sqrt(vi / c2) + 1e-8)
             for a, mi, vi in zip(p, m, v)]
        return p, (m, v, t)
    return ([jnp.zeros_like(a) for a in p], [jnp.zeros_like(a) for a in p], jnp.float32(0)), adamw

def bench(name, make, seconds=3.0):
    made = make()
    p, loss, kind = made if len(made) == 3 else (*made, "sgd")
    state, update = optimizer(kind, p)
    @jax.jit
    def step(p, s):
        return update(p, jax.grad(loss)(p), s)
    t = time.perf_counter()
    for _ in range(3):
        p, state = step(p, state)
    jax.block_until_ready(p)
    # Warm-up: 20 steps, or fewer for the slow models; then timed steps for about `seconds`.
    per = (time.perf_counter() - t) / 3
    warm = max(2, min(20, int(1.0 / max(per, 1e-6))))
    iters = max(10, min(200, int(seconds / max(per, 1e-6))))
    for _ in range(warm):
        p, state = step(p, state)
    jax.block_until_ready(p)
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        p, state = step(p, state)
        jax.block_until_ready(p)
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(f"jax-jit {name} step: median {ts[len(ts)//2]*1e3:.3f} ms (min {ts[0]*1e3:.3f})")

def rss():
    """(VmRSS, VmHWM) of this process in bytes, or (None, None) off Linux."""
    try:
        status = open("/proc/self/status").read()
    except OSError:
        return None, None
    field = lambda k: next((int(l.split()[1]) * 1024 for l in status.splitlines()
                            if l.startswith(k)), None)
    return field("VmRSS:"), field("VmHWM:")

def memory(name, make, warm=5, steps=3):
    """One line of JSON: XLA's buffer assignment of the compiled step (memory_analysis(), bytes:
    arguments = parameters and optimizer state, outputs = their new values, temporaries, aliased;
    also with the arguments donated), XLA's FLOP count of the step (cost_analysis()), and the
    process's RSS before the first step (after JAX's import and the parameters' creation) and
    its high-water mark after compiling, `warm` warm-up steps and `steps` more."""
    import json
    made = make()
    p, loss, kind = made if len(made) == 3 else (*made, "sgd")
    state, update = optimizer(kind, p)
    jax.block_until_ready((p, state))
    rss_before, hwm_before = rss()
    def step(p, s):
        return update(p, jax.grad(loss)(p), s)
    compiled = jax.jit(step).lower(p, state).compile()
    donated = jax.jit(step, donate_argnums=(0, 1)).lower(p, state).compile()
    ma, md = compiled.memory_analysis(), donated.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    for _ in range(warm + steps):
        p, state = compiled(p, state)
    jax.block_until_ready((p, state))
    rss_end, hwm = rss()
    print(json.dumps({
        "model": name, "argument": ma.argument_size_in_bytes, "output": ma.output_size_in_bytes,
        "temp": ma.temp_size_in_bytes, "alias": ma.alias_size_in_bytes,
        "donated_temp": md.temp_size_in_bytes, "donated_alias": md.alias_size_in_bytes,
        "donated_output": md.output_size_in_bytes,
        "peak": getattr(ma, "peak_memory_in_bytes", None),
        "donated_peak": getattr(md, "peak_memory_in_bytes", None),
        "xla_flops": cost.get("flops") if cost else None,
        "rss_before_first_step": rss_before, "rss_hwm_before_first_step": hwm_before,
        "rss_end": rss_end, "rss_hwm": hwm}))

def gemm(n, runs=5):
    """XLA's f32 GEMM rate: jax.jit(a @ b) on (n, n) operands, the best of `runs` after a
    warm-up, GFLOP/s (2·n³ FLOP a product)."""
    ka, kb = jax.random.split(jax.random.PRNGKey(9))
    a = jax.random.uniform(ka, (n, n), minval=-1, maxval=1)
    b_ = jax.random.uniform(kb, (n, n), minval=-1, maxval=1)
    f = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(f(a, b_))
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        jax.block_until_ready(f(a, b_))
        best = min(best, time.perf_counter() - t)
    print(f"jax_gemm n={n} best_ms={best * 1e3:.3f} gflops={2 * n ** 3 / best / 1e9:.1f}")

models = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "wide-mlp": wide_mlp,
          "resnet": resnet, "lm": lm}
if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--memory"]:
        for name in args[1:]:
            memory(name, models[name])
    elif args[:1] == ["--gemm"]:
        gemm(int(args[1]) if len(args) > 1 else 2048)
    else:
        for name in (args or models):
            bench(name, models[name])
