# Copied from the shared performance anchor (bench/jax/steps.py) so benches/jax/ratio.py runs from a
# checkout alone; keep the models in step with crates/tl-session/benches/common/models.rs.
"""Anchor: JAX-jit (XLA CPU) training steps with the shapes of the project's step benchmarks
(crates/tl-session/benches/common/models.rs): mlp 784-256-256-10 b64, cnn 28x28 b64,
transformer block n128 d64; f32, cross-entropy, SGD 0.01. Prints the median step time of each.

Run: python steps.py [mlp|cnn|transformer ...]   (pip install jax; pin to one core with taskset -c N
for a one-thread comparison)."""
import sys, time
import jax, jax.numpy as jnp

def w(key, shape):
    fan_in = 1
    for d in shape[1:]:
        fan_in *= d
    return jax.random.uniform(key, shape, minval=-1, maxval=1) / jnp.sqrt(fan_in)

def ce(logits, y):
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(logp[jnp.arange(logits.shape[0]), y])

def mlp():
    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    p = [w(ks[0], (256, 784)), jnp.zeros(256), w(ks[1], (256, 256)), jnp.zeros(256), w(ks[2], (10, 256)), jnp.zeros(10)]
    x = jax.random.uniform(ks[3], (64, 784), minval=-1, maxval=1)
    y = (jnp.arange(64) * 7 + 3) % 10
    def loss(p):
        h = jax.nn.relu(x @ p[0].T + p[1])
        h = jax.nn.relu(h @ p[2].T + p[3])
        return ce(h @ p[4].T + p[5], y)
    return p, loss

def cnn():
    ks = jax.random.split(jax.random.PRNGKey(1), 6)
    p = [w(ks[0], (8, 1, 3, 3)), jnp.zeros(8), w(ks[1], (16, 8, 3, 3)), jnp.zeros(16), w(ks[2], (10, 784)), jnp.zeros(10)]
    x = jax.random.uniform(ks[3], (64, 1, 28, 28), minval=-1, maxval=1)
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
    ks = jax.random.split(jax.random.PRNGKey(2), 12)
    p = [jnp.ones(d), jnp.zeros(d), w(ks[0], (d, d)), w(ks[1], (d, d)), w(ks[2], (d, d)), w(ks[3], (d, d)),
         jnp.ones(d), jnp.zeros(d), w(ks[4], (4 * d, d)), jnp.zeros(4 * d), w(ks[5], (d, 4 * d)), jnp.zeros(d),
         w(ks[6], (10, d)), jnp.zeros(10)]
    x = jax.random.uniform(ks[7], (n, d), minval=-1, maxval=1)
    y = (jnp.arange(n) * 7 + 3) % 10
    def ln(h, g, b):
        m = h.mean(-1, keepdims=True)
        v = ((h - m) ** 2).mean(-1, keepdims=True)
        return (h - m) / jnp.sqrt(v + 1e-5) * g + b
    def mha(h, wq, wk, wv, wo):
        q, k, v = (h @ wq.T, h @ wk.T, h @ wv.T)
        split = lambda t: t.reshape(n, heads, d // heads).transpose(1, 0, 2)
        q, k, v = split(q), split(k), split(v)
        a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / jnp.sqrt(d // heads), axis=-1) @ v
        return a.transpose(1, 0, 2).reshape(n, d) @ wo.T
    def loss(p):
        x1 = x + mha(ln(x, p[0], p[1]), p[2], p[3], p[4], p[5])
        h = jax.nn.gelu(ln(x1, p[6], p[7]) @ p[8].T + p[9], approximate=True)
        x2 = x1 + h @ p[10].T + p[11]
        return ce(x2 @ p[12].T + p[13], y)
    return p, loss

def bench(name, make, iters=200):
    p, loss = make()
    @jax.jit
    def step(p):
        g = jax.grad(loss)(p)
        return [a - 0.01 * b for a, b in zip(p, g)]
    for _ in range(20):
        p = step(p)
    jax.block_until_ready(p)
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        p = step(p)
        jax.block_until_ready(p)
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(f"jax-jit {name} step: median {ts[len(ts)//2]*1e3:.3f} ms (min {ts[0]*1e3:.3f})")

models = {"mlp": mlp, "cnn": cnn, "transformer": transformer}
for name in (sys.argv[1:] or models):
    bench(name, models[name])
