# Keep the models in step with crates/tl-session/benches/common/models.rs (tl-nn's models).
"""Anchor: JAX-jit (XLA CPU) training steps of the project's step benchmarks
(crates/tl-session/benches/common/models.rs, built from tl_nn::models): mlp 784-256-256-10 b64,
cnn 28x28 b64, transformer block n128 d64; f32, cross-entropy, SGD 0.01. The same shapes and the
same initial distributions as tl-nn's PyTorch defaults: linear and conv weights and biases
uniform in +-1/sqrt(fan_in); attention wq, wk, wv Xavier-uniform, applied as x @ W; layer norms
1 and 0; inputs uniform in +-1 (other draws than ours). Prints the median step time of each.

Run: python steps.py [mlp|cnn|transformer ...]   (pip install jax; pin to one core with taskset -c N
for a one-thread comparison)."""
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

def mlp():
    ks = jax.random.split(jax.random.PRNGKey(0), 7)
    shapes = [(256, 784), (256, 256), (10, 256)]
    p = [t for k, sh in enumerate(shapes) for t in (w(ks[2 * k], sh), b(ks[2 * k + 1], sh))]
    x = jax.random.uniform(ks[6], (64, 784), minval=-1, maxval=1)
    y = (jnp.arange(64) * 7 + 3) % 10
    def loss(p):
        h = jax.nn.relu(x @ p[0].T + p[1])
        h = jax.nn.relu(h @ p[2].T + p[3])
        return ce(h @ p[4].T + p[5], y)
    return p, loss

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
