#!/usr/bin/env python3
"""The GPU workloads of tools/bench/cuda_bench.cpp with kiln's peers: torch eager, torch.compile
(Inductor, and its CUDA-graph mode for the launch-bound replay) and jax.jit, on the same card in
the same minutes (tools/gpu-check runs this after kiln's benchmarks). Same definitions as kiln's:
float32, GELU (tanh form), softmax and layer_norm from primitives along dim 1, their gradients
from an upstream gradient, a 4096^3 matmul, an LSTM cell step (batch 64, hidden 1500) forward and
backward, ten elementwise ops on a one-element tensor.

Timing as kiln's: calls queued back to back, one synchronization per batch of 10 calls; the
median over batches of the time per call. TF32 is off for every peer (kiln's default): torch's
matmul precision 'highest', JAX's default_matmul_precision 'highest'.

Usage: gpu_peers.py [--peer torch_eager|torch_compile|torch_cudagraphs|jax] [--out FILE.json]
Without --peer each peer runs in a process of its own (JAX and torch keep their memory pools).
This is a benchmark, not a test; CI does not run it (it needs a GPU, torch and jax).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

N64M = 64 << 20
ROWS = 8192
B, H = 64, 1500
CALLS = 10
PEERS = ["torch_eager", "torch_compile", "torch_cudagraphs", "jax"]
GELU_C = 0.7978845608
# GPU_PEERS_SMOKE=1: tiny sizes on the CPU, to check the script on a machine without a GPU.
SMOKE = bool(os.environ.get("GPU_PEERS_SMOKE"))
if SMOKE:
    N64M, ROWS, B, H = 1 << 12, 64, 4, 16


def median_per_call(run, sync, budget_s=1.0, min_batches=5, max_batches=50):
    for _ in range(3):  # compile, autotune, warm the allocator
        run()
    sync()
    times, start = [], time.perf_counter()
    while len(times) < min_batches or (len(times) < max_batches and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            run()
        sync()
        times.append((time.perf_counter() - t0) / CALLS)
    return statistics.median(times)


def median_synchronized(run, sync, budget_s=1.0, reps=200):
    for _ in range(20):
        run()
        sync()
    times = []
    start = time.perf_counter()
    while len(times) < reps and time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------------------------------- torch
def torch_workloads(peer):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = "cpu" if SMOKE else "cuda"
    mode = {"torch_compile": "default", "torch_cudagraphs": "reduce-overhead"}.get(peer)
    C = (lambda f: torch.compile(f, mode=mode)) if mode else (lambda f: f)
    sync = (lambda: None) if SMOKE else torch.cuda.synchronize

    def gelu(x):
        return 0.5 * x * (1 + torch.tanh(GELU_C * (x + 0.044715 * x * x * x)))

    def softmax(x):
        e = torch.exp(x - torch.amax(x, 1, keepdim=True))
        return e / torch.sum(e, 1, keepdim=True)

    def layernorm(x, w, b):
        d = x - torch.mean(x, 1, keepdim=True)
        return d * torch.rsqrt(torch.mean(d * d, 1, keepdim=True) + 1e-5) * w + b

    def ten_ops(x):
        y = torch.tanh(x * 1.5 + 0.25) * 2.0 - 0.5
        y = -(torch.sigmoid(y) * x + x)
        return torch.exp(y)

    def lstm_loss(x, h, c, wx, wh, b):
        i, f, g, o = (x @ wx + h @ wh + b).chunk(4, 1)
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h2 = torch.sigmoid(o) * torch.tanh(c2)
        return h2.sum() + c2.sum()

    rn = lambda *s: torch.randn(*s, device=dev)
    out = {}
    if peer != "torch_cudagraphs":
        x64 = rn(N64M)
        y64 = torch.empty_like(x64)
        if peer == "torch_eager":
            out["copy_64M"] = median_per_call(lambda: y64.copy_(x64), sync)
        f = C(gelu)
        out["gelu_64M"] = median_per_call(lambda: f(x64), sync)
        del x64, y64
        x = rn(ROWS, ROWS)
        w, b = rn(ROWS), rn(ROWS)
        f = C(softmax)
        out["softmax_8192"] = median_per_call(lambda: f(x), sync)
        f = C(layernorm)
        out["layernorm_8192"] = median_per_call(lambda: f(x, w, b), sync)
        g = rn(ROWS, ROWS)
        xg = x.clone().requires_grad_()
        y = C(softmax)(xg)
        out["softmax_bwd_8192"] = median_per_call(
            lambda: torch.autograd.grad(y, [xg], g, retain_graph=True), sync)
        wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
        y = C(layernorm)(xg, wg, bg)
        out["layernorm_bwd_8192"] = median_per_call(
            lambda: torch.autograd.grad(y, [xg, wg, bg], g, retain_graph=True), sync)
        del x, g, xg, y
        a, m = rn(4096, 4096), rn(4096, 4096)
        f = C(lambda a, m: a @ m)
        out["mm_4096"] = median_per_call(lambda: f(a, m), sync)
        del a, m
        xs = [rn(B, H) for _ in range(3)]
        ws = [(rn(H, 4 * H) * 0.02).requires_grad_(), (rn(H, 4 * H) * 0.02).requires_grad_(),
              torch.zeros(4 * H, device=dev, requires_grad=True)]
        f = C(lstm_loss)
        out["lstm_fwdbwd"] = median_per_call(lambda: torch.autograd.grad(f(*xs, *ws), ws), sync)
    s = torch.full((1,), 0.5, device=dev)
    f = C(ten_ops)
    out["replay10_queued_us"] = median_per_call(lambda: f(s), sync) * 1e6
    out["replay10_synchronized_us"] = median_synchronized(lambda: f(s), sync) * 1e6
    return out


# --------------------------------------------------------------------------------------- jax
def jax_workloads():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_default_matmul_precision", "highest")
    key = jax.random.PRNGKey(0)
    rn = lambda *s: jax.random.normal(key, s, jnp.float32)
    last = {}

    def sync():
        if "y" in last:
            jax.block_until_ready(last["y"])

    def keep(f):
        def run():
            last["y"] = f()
        return run

    def gelu(x):
        return 0.5 * x * (1 + jnp.tanh(GELU_C * (x + 0.044715 * x * x * x)))

    def softmax(x):
        e = jnp.exp(x - jnp.max(x, 1, keepdims=True))
        return e / jnp.sum(e, 1, keepdims=True)

    def layernorm(x, w, b):
        d = x - jnp.mean(x, 1, keepdims=True)
        return d * jax.lax.rsqrt(jnp.mean(d * d, 1, keepdims=True) + 1e-5) * w + b

    def ten_ops(x):
        y = jnp.tanh(x * 1.5 + 0.25) * 2.0 - 0.5
        y = -(jax.nn.sigmoid(y) * x + x)
        return jnp.exp(y)

    def lstm_loss(wx, wh, b, x, h, c):
        i, f, g, o = jnp.split(x @ wx + h @ wh + b, 4, 1)
        c2 = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h2 = jax.nn.sigmoid(o) * jnp.tanh(c2)
        return h2.sum() + c2.sum()

    out = {}
    x64 = rn(N64M)
    f = jax.jit(gelu)
    out["gelu_64M"] = median_per_call(keep(lambda: f(x64)), sync)
    del x64
    x, w, b, g = rn(ROWS, ROWS), rn(ROWS), rn(ROWS), rn(ROWS, ROWS)
    f = jax.jit(softmax)
    out["softmax_8192"] = median_per_call(keep(lambda: f(x)), sync)
    f = jax.jit(layernorm)
    out["layernorm_8192"] = median_per_call(keep(lambda: f(x, w, b)), sync)
    # The gradient from an upstream gradient: jit(vjp) recomputes what the forward saved.
    f = jax.jit(lambda x, g: jax.vjp(softmax, x)[1](g))
    out["softmax_bwd_8192"] = median_per_call(keep(lambda: f(x, g)), sync)
    f = jax.jit(lambda x, w, b, g: jax.vjp(layernorm, x, w, b)[1](g))
    out["layernorm_bwd_8192"] = median_per_call(keep(lambda: f(x, w, b, g)), sync)
    del x, g
    a, m = rn(4096, 4096), rn(4096, 4096)
    f = jax.jit(lambda a, m: a @ m)
    out["mm_4096"] = median_per_call(keep(lambda: f(a, m)), sync)
    del a, m
    ws = [rn(H, 4 * H) * 0.02, rn(H, 4 * H) * 0.02, jnp.zeros(4 * H)]
    xs = [rn(B, H), rn(B, H), rn(B, H)]
    f = jax.jit(jax.grad(lstm_loss, argnums=(0, 1, 2)))
    out["lstm_fwdbwd"] = median_per_call(keep(lambda: f(*ws, *xs)), sync)
    s = jnp.full((1,), 0.5, jnp.float32)
    f = jax.jit(ten_ops)
    out["replay10_queued_us"] = median_per_call(keep(lambda: f(s)), sync) * 1e6
    out["replay10_synchronized_us"] = median_synchronized(keep(lambda: f(s)), sync) * 1e6
    return out


def run_peer(peer):
    return jax_workloads() if peer == "jax" else torch_workloads(peer)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", choices=PEERS)
    ap.add_argument("--out")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per peer process")
    args = ap.parse_args()
    if args.peer:
        result = run_peer(args.peer)
        print(json.dumps({args.peer: result}))
        return
    results = {}
    for peer in PEERS:
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, __file__, "--peer", peer], capture_output=True,
                               text=True, timeout=args.timeout)
            sys.stderr.write(p.stderr[-4000:])
            line = [l for l in p.stdout.splitlines() if l.startswith("{")]
            results.update(json.loads(line[-1]) if line else {peer: {"error": p.stderr[-500:]}})
        except subprocess.TimeoutExpired:
            results[peer] = {"error": f"timed out after {args.timeout} s"}
        print(f"{peer}: {time.perf_counter() - t0:.0f} s {results.get(peer)}", file=sys.stderr)
    text = json.dumps(results, indent=1)
    if args.out:
        open(args.out, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
