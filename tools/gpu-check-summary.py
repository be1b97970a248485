#!/usr/bin/env python3
"""tools/gpu-check's summary: reads its log folder and prints gpu-check.md (the device, each step's
exit status, the tests' counts and failures, kiln's GPU benchmarks, and the peers' figures beside
kiln's for the same workloads). Usage: gpu-check-summary.py LOG_DIR OUT_DIR"""
import glob
import json
import os
import re
import sys

logs, out = sys.argv[1], sys.argv[2]


def read(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""


def device_lines():
    env = read(os.path.join(logs, "env.log")).splitlines()
    keep = [l for l in env if re.search(r"H100|H200|NVIDIA|torch |jax |release|CUDA Version", l)]
    return keep[:8]


def test_table():
    rows = {}
    for path in sorted(glob.glob(os.path.join(logs, "test_*.log"))):
        name = os.path.basename(path)[5:].rsplit(".", 2)[0]
        text = read(path)
        r = rows.setdefault(name, {"passed": 0, "failed": set(), "skipped": set(), "ran": 0})
        m = re.search(r"\[  PASSED  \] (\d+) test", text)
        r["passed"] += int(m.group(1)) if m else 0
        r["ran"] += 1 if re.search(r"^\[==========\] \d+ tests? from .* ran", text, re.M) else 0
        r["failed"] |= set(re.findall(r"^\[  FAILED  \] (\S+\.\S+)", text, re.M))
        r["skipped"] |= set(re.findall(r"^\[  SKIPPED \] (\S+\.\S+)", text, re.M))
    lines = ["| test binary | passed | failed | skipped | finished shards |", "| --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['passed']} | {', '.join(sorted(r['failed'])) or 0} | "
                     f"{', '.join(sorted(r['skipped'])) or 0} | {r['ran']} |")
    return lines


COUNTERS = ("per_call_ms", "of_copy", "vs_gemms", "vs_cublas", "gemm_ms", "us_per_call",
            "launches_per_call", "h2d_bytes_per_call", "step_ms", "h2d_bytes", "d2h_bytes", "vs_eager",
            "step_s", "best_ms")


def bench_rows():
    rows = {}
    for path in sorted(glob.glob(os.path.join(logs, "bench_*.json"))):
        try:
            data = json.load(open(path))
        except (OSError, ValueError):
            continue
        prefix = "fast: " if os.path.basename(path) == "bench_fast.json" else ""
        for b in data.get("benchmarks", []):
            if b.get("aggregate_name") not in (None, "median"):
                continue
            name = prefix + b.get("run_name", b["name"])
            rows[name] = b
    return rows


def bench_table(rows):
    to_ms = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    lines = ["| benchmark | time (ms) | GB/s | ratios and counters |", "| --- | --- | --- | --- |"]
    for name, b in rows.items():
        if b.get("error_occurred"):
            lines.append(f"| {name} | error: {b.get('error_message', '')[:200]} | | |")
            continue
        ms = b["real_time"] * to_ms[b.get("time_unit", "ns")]
        gbs = b.get("bytes/s", 0) / 1e9
        extra = ", ".join(f"{k}={b[k]:.4g}" for k in COUNTERS if k in b)
        if b.get("label"):  # e.g. the convolution chooser's pick
            extra = f"{b['label']}; {extra}" if extra else b["label"]
        lines.append(f"| {name} | {ms:.4g} | {gbs:.0f} | {extra} |")
    return lines


# kiln's row and counter for each peer workload (ms, or us where the key says so).
KILN = {
    "copy_64M": ("BM_CudaCopyFloor64M/real_time", "per_call_ms"),
    "gelu_64M": ("BM_CudaGelu64M/real_time", "per_call_ms"),
    "softmax_8192": ("BM_CudaSoftmax8192/real_time", "per_call_ms"),
    "layernorm_8192": ("BM_CudaLayerNorm8192/real_time", "per_call_ms"),
    "softmax_bwd_8192": ("BM_CudaSoftmaxBackward8192/real_time", "per_call_ms"),
    "layernorm_bwd_8192": ("BM_CudaLayerNormBackward8192/real_time", "per_call_ms"),
    "mm_4096": ("BM_CudaGemm/kiln/real_time", "per_call_ms"),
    "lstm_fwdbwd": ("BM_CudaLstmCell/traced/real_time", "per_call_ms"),
    "replay10_queued_us": ("BM_CudaReplay10Ops/queued", "us_per_call"),
    "replay10_synchronized_us": ("BM_CudaReplay10Ops/synchronized", "us_per_call"),
}


def peer_table(rows):
    try:
        peers = json.load(open(os.path.join(logs, "gpu-peers.json")))
    except (OSError, ValueError):
        return ["(no peer figures: see peers.log)"]
    names = list(peers)
    lines = ["| workload | kiln | " + " | ".join(names) + " | kiln vs best compiled peer |",
             "| --- | --- | " + " | ".join("---" for _ in names) + " | --- |"]
    for work, (row, counter) in KILN.items():
        scale = 1.0 if work.endswith("_us") else 1e3  # peers report seconds (ms rows) or us
        kiln = rows.get(row, {}).get(counter)
        cells, compiled = [], []
        for p in names:
            v = peers[p].get(work) if isinstance(peers[p], dict) else None
            if isinstance(v, (int, float)):
                v *= scale
                cells.append(f"{v:.4g}")
                if p != "torch_eager":
                    compiled.append(v)
            else:
                cells.append("—")
        ratio = f"{min(compiled) / kiln:.2f}x" if kiln and compiled else "—"
        lines.append(f"| {work} | {kiln:.4g} | " if kiln else f"| {work} | — | ")
        lines[-1] += " | ".join(cells) + f" | {ratio} |"
    errors = [f"- {p}: {v['error'][:300]}" for p, v in peers.items() if isinstance(v, dict) and "error" in v]
    return lines + ([""] + errors if errors else []) + [
        "", "(ms per call; _us rows in microseconds; the last column is the fastest of torch.compile, "
        "its CUDA-graph mode and jax.jit over kiln: above 1, kiln is faster)"]


def tails():
    lines = []
    for name in ("word_lm_cuda", "word_lm_cpu", "resnet_cuda", "ctest", "peers"):
        text = read(os.path.join(logs, name + ".log")).splitlines()
        if text:
            lines += [f"### {name}.log (last lines)", "```"] + text[-14:] + ["```"]
    return lines


rows = bench_rows()
doc = ["# tools/gpu-check", ""] + device_lines() + ["", "## Steps", ""]
doc += read(os.path.join(logs, "status.md")).splitlines()
doc += ["", "## Tests", ""] + test_table()
doc += ["", "## kiln's GPU benchmarks", ""] + bench_table(rows)
doc += ["", "## Peers on the same card", ""] + peer_table(rows)
doc += ["", "## Examples and the rest of the suite", ""] + tails()
print("\n".join(doc))
json.dump({"benchmarks": list(rows.values())}, open(os.path.join(out, "gpu-bench.json"), "w"), indent=1)
