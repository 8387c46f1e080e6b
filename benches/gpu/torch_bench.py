#!/usr/bin/env python3
"""PyTorch eager on the same GPU, same shapes as crates/tl-session/benches/gpu.rs, and the table
of ratios (issue 7's GPU part).

    python3 torch_bench.py --ours logs/ours.jsonl [--quick] [--iters 20]

`--ours` is the JSON-lines output of our `gpu` bench binary. Each PyTorch figure is the median of
timed iterations after two warm-up runs, each ending in `.item()` (which synchronises), like
ours. Prints one table: name, ours, PyTorch, ratio, and for matmul and elementwise the rates and
the issues' targets: our f32 matmul >= 90% of PyTorch's (cuBLAS, TF32 off) GFLOP/s and our TF32 and
bf16 matmuls >= 70% of PyTorch's in the same mode (issue 39), our elementwise >= 70%
of PyTorch's device-to-device copy bandwidth (256 MB buffers).
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def median_ms(iters, f):
    f()
    f()
    t = []
    for _ in range(iters):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    return statistics.median(t)


def params(dev, *shapes):
    g = torch.Generator(device="cpu").manual_seed(0)
    return [(torch.rand(s, generator=g) * 0.2 - 0.1).to(dev).requires_grad_() for s in shapes]


def sgd(ps, lr=0.01):
    with torch.no_grad():
        for p in ps:
            p -= lr * p.grad
            p.grad = None


def mlp(dev, batch):
    ps = params(dev, (256, 784), (256,), (256, 256), (256,), (10, 256), (10,))
    x = torch.rand(batch, 784, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step():
        w0, b0, w1, b1, w2, b2 = ps
        h = F.relu(F.linear(x, w0, b0))
        h = F.relu(F.linear(h, w1, b1))
        loss = F.cross_entropy(F.linear(h, w2, b2), y)
        loss.backward()
        sgd(ps)
        return loss.item()

    return step


def cnn(dev, batch):
    ps = params(dev, (8, 1, 3, 3), (8,), (16, 8, 3, 3), (16,), (10, 784), (10,))
    x = torch.rand(batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step():
        c0, b0, c1, b1, w, b = ps
        h = F.max_pool2d(F.relu(F.conv2d(x, c0, b0, padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, c1, b1, padding=1)), 2)
        loss = F.cross_entropy(F.linear(h.flatten(1), w, b), y)
        loss.backward()
        sgd(ps)
        return loss.item()

    return step


def transformer(dev, n):
    d, heads = 64, 4
    ps = params(dev, (d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,),
                (256, d), (256,), (d, 256), (d,), (10, d), (10,))
    x = torch.rand(n, d, device=dev)
    y = torch.randint(0, 10, (n,), device=dev)

    def step():
        g1, be1, wqkv, bqkv, wo, bo, g2, be2, w1, b1, w2, b2, wc, bc = ps
        h = F.layer_norm(x, (d,), g1, be1)
        q, k, v = F.linear(h, wqkv, bqkv).view(n, 3, heads, d // heads).permute(1, 2, 0, 3)
        a = F.scaled_dot_product_attention(q, k, v)
        h = x + F.linear(a.permute(1, 0, 2).reshape(n, d), wo, bo)
        f = F.linear(F.gelu(F.linear(F.layer_norm(h, (d,), g2, be2), w1, b1)), w2, b2)
        loss = F.cross_entropy(F.linear(h + f, wc, bc), y)
        loss.backward()
        sgd(ps)
        return loss.item()

    return step


class WideMlp(torch.nn.Module):
    """784-4096-4096-10 relu (gpu.rs's wide-mlp)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(784, 4096), torch.nn.ReLU(),
                                       torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                       torch.nn.Linear(4096, 10))

    def forward(self, x):
        return self.net(x)


class Block(torch.nn.Module):
    """tl_nn::models::BasicBlock: relu(x + bn2(conv2(relu(bn1(conv1 x)))))."""

    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)
        self.conv2, self.bn2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(h)))


class ResNet(torch.nn.Module):
    """tl_nn::models::ResNet at gpu.rs's size: stem 3->64, 4 blocks, mean, linear 64->10."""

    def __init__(self, c=64, blocks=4):
        super().__init__()
        self.stem, self.bn = torch.nn.Conv2d(3, c, 3, padding=1), torch.nn.BatchNorm2d(c)
        self.blocks = torch.nn.Sequential(*[Block(c) for _ in range(blocks)])
        self.head = torch.nn.Linear(c, 10)

    def forward(self, x):
        h = self.blocks(F.relu(self.bn(self.stem(x))))
        return self.head(h.mean((2, 3)))


class LmBlock(torch.nn.Module):
    """tl_nn::models::TransformerBlock (causal, attention without biases, tanh-GELU)."""

    def __init__(self, d, heads, ff):
        super().__init__()
        self.d, self.heads = d, heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        self.fc1, self.fc2 = torch.nn.Linear(d, ff), torch.nn.Linear(ff, d)

    def forward(self, x):
        b, n, d = x.shape
        h = self.ln1(x)

        def split(t):
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(self.wq(h)), split(self.wk(h)),
                                           split(self.wv(h)), is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Lm(torch.nn.Module):
    """tl_nn::models::TransformerLm at gpu.rs's size: vocab 72, context 128, width 256, 4 blocks."""

    def __init__(self, vocab=72, ctx=128, d=256, heads=4, ff=1024, blocks=4):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(ctx, d) * 0.02)
        self.blocks = torch.nn.Sequential(*[LmBlock(d, heads, ff) for _ in range(blocks)])
        self.ln_f, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.ln_f(self.blocks(self.tok(tokens) + self.pos)))


def realistic(dev, quick):
    """(name, module, input, labels, optimizer) of the realistic-size models (issue 39)."""
    torch.manual_seed(0)
    out = []
    b = 4 if quick else 256
    m = WideMlp().to(dev)
    out.append(("wide-mlp", m, torch.rand(b, 784, device=dev) * 2 - 1,
                torch.randint(0, 10, (b,), device=dev), torch.optim.SGD(m.parameters(), 0.01)))
    b, side = (2, 8) if quick else (32, 32)
    m = ResNet().to(dev)
    out.append(("resnet", m, torch.rand(b, 3, side, side, device=dev) * 2 - 1,
                torch.randint(0, 10, (b,), device=dev),
                torch.optim.SGD(m.parameters(), 0.01, momentum=0.9)))
    b = 1 if quick else 16
    m = Lm().to(dev)
    out.append(("lm", m, torch.randint(0, 72, (b, 128), device=dev),
                torch.randint(0, 72, (b * 128,), device=dev),
                torch.optim.AdamW(m.parameters(), 1e-3)))
    return out


def module_step(model, x, y, opt, compiled):
    fwd = torch.compile(model) if compiled else model

    def step():
        logits = fwd(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def torch_rows(dev, quick, iters):
    batch = 4 if quick else 64
    rows = {}
    for name, make in [("mlp", lambda: mlp(dev, batch)), ("cnn", lambda: cnn(dev, batch)),
                       ("transformer", lambda: transformer(dev, 16 if quick else 128))]:
        step = make()
        rows[f"step/eager/{name}"] = (median_ms(iters, step), None)
    # The realistic sizes: eager and eager under bf16 autocast (AMP), for scale;
    # torch.compile's rows come last (compile_rows), within a time budget.
    models = realistic(dev, quick)
    for name, model, x, y, opt in models:
        try:
            rows[f"step/eager/{name}"] = (
                median_ms(iters, module_step(model, x, y, opt, False)), None)
            amp = module_step(model, x, y, opt, False)

            def amp_step(amp=amp):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return amp()
            rows[f"step/amp-bf16/{name}"] = (median_ms(iters, amp_step), None)
        except Exception as e:  # noqa: BLE001 (one model's failure must not hide the others)
            print(f"torch eager {name}: {type(e).__name__}: {e}".splitlines()[0])
    rows.update(matmul_rows(dev, quick, iters))
    rows.update(gemm_core_rows(dev, quick, iters))
    length = (1 << 20) if quick else (1 << 26)
    x = torch.rand(length, device=dev)
    out = torch.empty_like(x)
    mb = length * 4 >> 20
    with torch.no_grad():
        for name, op, buffers in [("scale", lambda: x * 0.5, 2), ("add", lambda: x + x, 3),
                                  ("copy", lambda: out.copy_(x), 2)]:
            chain = lambda k: ([op() for _ in range(k)], x.sum().item())  # noqa: E731
            ms = (median_ms(iters, lambda: chain(8)) - median_ms(iters, lambda: chain(0))) / 8
            ms = max(ms, 1e-6)
            rows[f"{name}/{mb}MB"] = (ms, ("gbps", buffers * 4 * length / (ms * 1e-3) / 1e9))
    rows.update(attention_rows(dev, quick, iters))
    rows.update(conv_rows(dev, quick, iters))
    return rows, models


BACK_TO_BACK = 16


def product_rows(dev, sizes, iters, name, count):
    """Rows name(mode, n) of `count` products of n x n matrices back to back, then a read of
    the last one's sum (which waits for all of them): ms and GFLOP/s per product, in true f32
    (TF32 off), with TF32 allowed (f32 in and out, cuBLAS on tensor cores: our
    `Precision::Tf32`) and in bf16 (the operands converted once beforehand: cuBLAS's bf16 GEMM,
    f32 accumulation)."""
    rows = {}
    for n in sizes:
        a = torch.rand(n, n, device=dev) * 0.01
        b = torch.rand(n, n, device=dev) * 0.01
        for mode, tf32, x, y in [("f32", False, a, b), ("tf32", True, a, b),
                                 ("bf16", False, a.bfloat16(), b.bfloat16())]:
            torch.backends.cuda.matmul.allow_tf32 = tf32

            def run(x=x, y=y):
                outs = [x @ y for _ in range(count)]
                return outs[-1].float().sum().item()
            with torch.no_grad():
                ms = median_ms(iters, run) / count
            rows[name(mode, n)] = (ms, ("gflops", 2 * n**3 / (ms * 1e-3) / 1e9))
        torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def gemm_core_rows(dev, quick, iters):
    """As gpu.rs's gemm-core rows: the products alone, 16 back to back."""
    return product_rows(dev, [64] if quick else [1024, 2048], iters,
                        lambda mode, n: f"gemm-core/{mode}/{n}", BACK_TO_BACK)


def matmul_rows(dev, quick, iters):
    """As gpu.rs's matmul rows: sum(a @ b), one product a row."""
    prefix = {"f32": "matmul", "tf32": "matmul-tf32", "bf16": "matmul-bf16"}
    return product_rows(dev, [64] if quick else [2048, 4096], iters,
                        lambda mode, n: f"{prefix[mode]}/{n}", 1)


def compile_rows(models, iters, budget_s):
    """torch.compile's step of each realistic model (its compilation in the warm-up calls),
    while `budget_s` seconds last: a model not started by then is named as skipped."""
    rows, start = {}, time.perf_counter()
    for name, model, x, y, opt in models:
        if time.perf_counter() - start > budget_s:
            print(f"torch.compile {name}: skipped (the {budget_s:.0f} s budget is spent)")
            continue
        try:
            rows[f"step/compile/{name}"] = (
                median_ms(iters, module_step(model, x, y, opt, True)), None)
        except Exception as e:  # noqa: BLE001 (no Triton or no compiler: say so, go on)
            print(f"torch.compile {name}: {type(e).__name__}: {e}".splitlines()[0])
    return rows


HEADS, HEAD = 8, 64


def attention_lengths(quick):
    return [64] if quick else [1024, 2048, 4096, 8192]


def attention_rows(dev, quick, iters):
    """As gpu.rs's attention rows. `attention/sdpa/n{n}`: one causal self-attention (dModel 512,
    8 heads of 64, no biases) forward and backward, the projections around
    F.scaled_dot_product_attention, the sum of the output, backward, and a read of one gradient.
    `attention-core/sdpa/n{n}`: SDPA alone, forward and backward on causal (1, 8, n, 64) f32
    Q, K, V (PyTorch picks its memory-efficient kernel: its flash kernel takes only 16-bit
    types), timed to a read of sum(dV); `attention-core/sdpa-bf16/n{n}` the same in bf16 (its
    flash kernel); `attention-core/sdpa-gqa/n{n}` the f32 core with K and V of 2 heads
    (`enable_gqa=True`, PyTorch 2.5 on; skipped before); `attention-fwd/sdpa/n{n}` the f32
    core's forward alone, timed to a read of sum(O). Core rows carry TFLOP/s as FlashAttention
    counts them (causal: 7·n²·d·H forward and backward, 2·n²·d·H forward)."""
    dm = HEADS * HEAD
    rows = {}
    for n in attention_lengths(quick):
        wq, wk, wv, wo = params(dev, (dm, dm), (dm, dm), (dm, dm), (dm, dm))
        x = torch.rand(n, dm, device=dev)

        def step():
            def split(t):
                return t.view(n, HEADS, HEAD).transpose(0, 1)
            q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = a.transpose(0, 1).reshape(n, dm) @ wo
            y.sum().backward()
            g = wq.grad.sum().item()
            for p in (wq, wk, wv, wo):
                p.grad = None
            return g

        rows[f"attention/sdpa/n{n}"] = (median_ms(iters, step), None)
        flops = 7.0 * n * n * HEAD * HEADS
        for name, dtype, kv_heads in [("sdpa", torch.float32, HEADS),
                                      ("sdpa-bf16", torch.bfloat16, HEADS),
                                      ("sdpa-gqa", torch.float32, 2)]:
            gqa = {"enable_gqa": True} if kv_heads < HEADS else {}
            q = torch.rand(1, HEADS, n, HEAD, device=dev, dtype=dtype).requires_grad_()
            k, v = (torch.rand(1, kv_heads, n, HEAD, device=dev, dtype=dtype).requires_grad_()
                    for _ in range(2))
            go = torch.rand(1, HEADS, n, HEAD, device=dev, dtype=dtype)
            if gqa:
                try:
                    F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
                except TypeError:  # PyTorch before 2.5: no enable_gqa
                    continue

            def core(q=q, k=k, v=v, go=go, gqa=gqa):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
                o.backward(go)
                g = v.grad.float().sum().item()
                for t in (q, k, v):
                    t.grad = None
                return g

            ms = median_ms(iters, core)
            rows[f"attention-core/{name}/n{n}"] = (ms, ("tflops", flops / (ms * 1e-3) / 1e12))
            if name == "sdpa":
                def forward(q=q, k=k, v=v):
                    with torch.no_grad():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().item()

                ms = median_ms(iters, forward)
                fwd = 2.0 * n * n * HEAD * HEADS
                rows[f"attention-fwd/sdpa/n{n}"] = (ms, ("tflops", fwd / (ms * 1e-3) / 1e12))
    return rows


def conv_rows(dev, quick, iters):
    """As gpu.rs's conv rows: the ResNet's conv forward (3x3, padding 1, no bias) on batch 32 of
    32x32 images (quick: batch 2 of 8x8), the stem (3 -> 64 channels) and a block's conv
    (64 -> 64), `F.conv2d` in true f32 (cuDNN with TF32 off, `cudnn.benchmark` on), timed to a
    read of the output's sum. `conv/cudnn/{shape}` beside our `conv/implicit/` and
    `conv/im2col/` rows; `conv-dw/cudnn/{shape}` the weight gradient from a cotangent of the
    output (`torch.nn.grad.conv2d_weight`, cuDNN's), beside our `conv-dw/` rows, and
    `conv-dx/cudnn/{shape}` the input gradient (`torch.nn.grad.conv2d_input`) beside our
    `conv-dx/` rows, each timed to a read of its sum; `conv/cudnn-bf16/{shape}` the forward on
    bf16 copies of the operands (cuDNN's tensor-core kernels) beside our `conv/*-bf16/` rows,
    and `conv-dw/cudnn-bf16/`, `conv-dx/cudnn-bf16/` both gradients so beside our
    `conv-dw/*-bf16/` and `conv-dx/*-bf16/` rows; GFLOP/s counts 2·N·A·L·C·K."""
    batch, side = (2, 8) if quick else (32, 32)
    rows = {}
    was_tf32, was_bench = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = False, True
    for c, out in [(3, 64), (64, 64)]:
        x = torch.rand(batch, c, side, side, device=dev)
        w = torch.rand(out, c, 3, 3, device=dev) * 0.1
        with torch.no_grad():
            ms = median_ms(iters, lambda x=x, w=w: F.conv2d(x, w, padding=1).sum().item())
        flops = 2.0 * batch * out * side * side * c * 9
        rows[f"conv/cudnn/n{batch}-c{c}-a{out}-{side}x{side}"] = (
            ms, ("gflops", flops / (ms * 1e-3) / 1e9))
        gy = torch.rand(batch, out, side, side, device=dev) * 0.1
        with torch.no_grad():
            ms = median_ms(iters, lambda x=x, w=w, gy=gy: torch.nn.grad.conv2d_weight(
                x, w.shape, gy, padding=1).sum().item())
        rows[f"conv-dw/cudnn/n{batch}-c{c}-a{out}-{side}x{side}"] = (
            ms, ("gflops", flops / (ms * 1e-3) / 1e9))
        with torch.no_grad():
            ms = median_ms(iters, lambda x=x, w=w, gy=gy: torch.nn.grad.conv2d_input(
                x.shape, w, gy, padding=1).sum().item())
        rows[f"conv-dx/cudnn/n{batch}-c{c}-a{out}-{side}x{side}"] = (
            ms, ("gflops", flops / (ms * 1e-3) / 1e9))
        xh, wh = x.to(torch.bfloat16), w.to(torch.bfloat16)
        with torch.no_grad():
            ms = median_ms(iters, lambda xh=xh, wh=wh: F.conv2d(
                xh, wh, padding=1).float().sum().item())
        rows[f"conv/cudnn-bf16/n{batch}-c{c}-a{out}-{side}x{side}"] = (
            ms, ("gflops", flops / (ms * 1e-3) / 1e9))
        gh = gy.to(torch.bfloat16)
        with torch.no_grad():
            ms = median_ms(iters, lambda xh=xh, wh=wh, gh=gh: torch.nn.grad.conv2d_weight(
                xh, wh.shape, gh, padding=1).float().sum().item())
        rows[f"conv-dw/cudnn-bf16/n{batch}-c{c}-a{out}-{side}x{side}"] = (
            ms, ("gflops", flops / (ms * 1e-3) / 1e9))
        with torch.no_grad():
            ms = median_ms(iters, lambda xh=xh, wh=wh, gh=gh: torch.nn.grad.conv2d_input(
                xh.shape, wh, gh, padding=1).float().sum().item())
        rows[f"conv-dx/cudnn-bf16/n{batch}-c{c}-a{out}-{side}x{side}"] = (
            ms, ("gflops", flops / (ms * 1e-3) / 1e9))
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = was_tf32, was_bench
    return rows


def sdpa_twin(name):
    """PyTorch's row for one of our flash rows: `/flash/`, `/flash-wide/`, `/flash-one-pass/`
    and `/flash-two-pass/` (the backward forced onto one path) all time against `/sdpa/`;
    `/flash-gqa/` against `/sdpa-gqa/`, `/flash-bf16/` (autocast) against `/sdpa-bf16/`;
    `/flash-tc/` (the core on the tensor cores) against `/sdpa/`, `/flash-tc-bf16/` against
    `/sdpa-bf16/`."""
    for ours in ("/flash-wide/", "/flash-one-pass/", "/flash-two-pass/", "/flash-tc/", "/flash/"):
        name = name.replace(ours, "/sdpa/")
    for ours in ("/flash-bf16/", "/flash-tc-bf16/"):
        name = name.replace(ours, "/sdpa-bf16/")
    return name.replace("/flash-gqa/", "/sdpa-gqa/")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--compile-budget-s", type=float, default=120.0,
                    help="seconds for the torch.compile rows (0: none)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_bench: no CUDA device for PyTorch: skipping")
        return 0
    ours = {}
    with open(args.ours) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                ours[r["name"]] = r
    dev = torch.device("cuda")
    # Our f32 rows are true f32: PyTorch's too. Its default lets cuDNN's convolutions run on
    # TF32 tensor cores (cudnn.allow_tf32 = True), which would time the cnn, the ResNet and
    # the convolution rows against a 10-bit-mantissa product. The matmul rows set cuBLAS's flag
    # themselves; the AMP rows are bf16 either way.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    theirs, models = torch_rows(dev, args.quick, args.iters)
    if args.compile_budget_s > 0:
        theirs.update(compile_rows(models, args.iters, args.compile_budget_s))
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'name':28} {'ours ms':>10} {'torch ms':>10} {'ours/torch':>10}  rates")
    for name, r in ours.items():
        # Our bf16 steps time against PyTorch's AMP step (eager under bf16 autocast).
        amp_twin = "step/amp-bf16/" + name.split("/")[-1] if name.startswith("step-bf16/") else ""
        t = (theirs.get(name) or theirs.get(amp_twin)
             or theirs.get(name.replace("-split256", ""))
             or theirs.get(name.replace("linked", "eager"))
             or theirs.get(sdpa_twin(name).replace("/composed/", "/sdpa/"))
             or theirs.get(name.replace("/implicit/", "/cudnn/").replace("/im2col/", "/cudnn/"))
             or theirs.get(name.replace("/implicit-bf16/", "/cudnn-bf16/")
                           .replace("/im2col-bf16/", "/cudnn-bf16/")))
        if t is None:
            print(f"{name:28} {r['ms']:10.3f} {'-':>10}")
            continue
        rate = ""
        if t[1]:
            unit, tv = t[1]
            rate = f"{unit}: ours {r.get(unit, 0):.1f}, torch {tv:.1f}"
        print(f"{name:28} {r['ms']:10.3f} {t[0]:10.3f} {r['ms'] / t[0]:10.2f}  {rate}")
    # PyTorch's rows with no twin of ours: torch.compile and AMP steps (against our eager
    # step), the bf16 flash kernel (for scale).
    for name, t in theirs.items():
        if "/compile/" in name or "/amp-bf16/" in name:
            o = ours.get("step/eager/" + name.split("/")[-1])
            ratio = f"{o['ms'] / t[0]:10.2f}" if o else f"{'-':>10}"
            print(f"{name:28} {o['ms'] if o else float('nan'):10.3f} {t[0]:10.3f} {ratio}  "
                  "(ours: eager f32)")
    # Issue 39: realistic-size steps <= 1.0x PyTorch eager in f32, <= 1.2x AMP in bf16.
    for k in ours:
        model = k.split("/")[-1]
        if model not in ("wide-mlp", "resnet", "lm"):
            continue
        if k.startswith("step/"):
            want, t = 1.0, theirs.get(f"step/eager/{model}")
        elif k.startswith("step-bf16/"):
            want, t = 1.2, theirs.get(f"step/amp-bf16/{model}")
        else:
            continue
        if t:
            ratio = ours[k]["ms"] / t[0]
            print(f"target {k} <= {want:.1f}x torch: {ratio:.2f}x "
                  f"{'PASS' if ratio <= want else 'FAIL'}")
        if "/sdpa-bf16/" in name:
            print(f"{name:28} {'-':>10} {t[0]:10.3f} {'-':>10}  {t[1][0]}: torch {t[1][1]:.1f}")
    # Issue 42's target: the fused core >= 0.7x PyTorch's attention speed (time ratio <= 1/0.7).
    for k in ours:
        if k.startswith("attention-core/flash") and "-d128" not in k:
            t = theirs.get(sdpa_twin(k))
            if t:
                speed = t[0] / ours[k]["ms"]
                kind = "bf16" if "-bf16/" in k else "f32"
                print(f"target {k} >= 0.7x torch {kind} SDPA speed: {speed:.2f}x "
                      f"{'PASS' if speed >= 0.7 else 'FAIL'}")
    # The forward alone (no target: where the time goes).
    for k in ours:
        if k.startswith("attention-fwd/flash"):
            t = theirs.get(sdpa_twin(k))
            if t:
                print(f"{k}: {t[0] / ours[k]['ms']:.2f}x torch f32 SDPA forward speed")
    # Issue 39: our f32 convolution >= 50% of cuDNN's speed (the implicit-GEMM kernel).
    for k in ours:
        if k.startswith("conv/implicit/"):
            t = theirs.get(k.replace("/implicit/", "/cudnn/"))
            if t:
                frac = t[0] / ours[k]["ms"]
                print(f"target {k} >= 50% of cuDNN f32: {frac:.0%} "
                      f"{'PASS' if frac >= 0.5 else 'FAIL'}")
    # The cotangents and the bf16 forward beside cuDNN's (no target: where the step's time goes).
    for k in ours:
        for kind in ("conv-dx/", "conv-dw/", "conv/implicit-bf16/"):
            if k.startswith(kind) and "/implicit" in k:
                t = theirs.get(k.replace("/implicit-bf16/", "/cudnn-bf16/")
                               .replace("/implicit/", "/cudnn/"))
                if t:
                    print(f"{k}: {t[0] / ours[k]['ms']:.0%} of cuDNN's speed")
    # Each tensor-core conv kernel beside our own f32 kernel (which the autocast conv could
    # take on rounded copies instead).
    for k in ours:
        if "/implicit-bf16/" in k:
            f32 = ours.get(k.replace("/implicit-bf16/", "/implicit/"))
            if f32:
                print(f"{k}: {f32['ms'] / ours[k]['ms']:.2f}x our f32 kernel's speed")
    # The targets.
    cp = [k for k in theirs if k.startswith("copy/")]
    # Issue 39: f32 >= 90% of cuBLAS, tensor cores >= 70% of cuBLAS in the same mode (the
    # session's matmul rows, and the device's products alone).
    for k in ours:
        twin = k.replace("-split256", "")
        if k.startswith(("matmul", "gemm-core/")) and twin in theirs:
            want = 0.9 if k.startswith(("matmul/", "gemm-core/f32/")) else 0.7
            frac = ours[k]["gflops"] / theirs[twin][1][1]
            print(f"target {k} >= {want:.0%} of torch: {frac:.0%} "
                  f"{'PASS' if frac >= want else 'FAIL'}")
    for k in ours:
        if (k.startswith("scale/") or k.startswith("add/")) and cp:
            frac = ours[k]["gbps"] / theirs[cp[0]][1][1]
            print(f"target {k} >= 70% of torch copy bandwidth: {frac:.0%} "
                  f"{'PASS' if frac >= 0.7 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
