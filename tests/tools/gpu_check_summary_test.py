#!/usr/bin/env python3
"""tools/gpu-check-summary.py on a fake log folder (as tools/gpu-check leaves it on a GPU machine):
the device lines, step statuses, test counts with failures and skips, benchmark rows with their
counters, labels and errors, and the peers' table with kiln's ratio; gpu-bench.json written. A
GPU session runs the summary once, so it is tested here, where it costs no device time.

  gpu_check_summary_test.py SCRIPT
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = None


def write(root, name, text):
    Path(root, name).write_text(text)


def fake_logs(root):
    write(root, "env.log", "NVIDIA H100 80GB HBM3, 580.159.04\nCUDA Version: 13.0\nnoise\n")
    write(root, "status.md", "| step | exit | seconds |\n| --- | --- | --- |\n| tests | 1 | 42 |\n")
    write(root, "test_kiln_cuda_test.0.log",
          "[==========] 3 tests from 1 test suite ran.\n[  PASSED  ] 1 test.\n"
          "[  FAILED  ] Cuda.Broken\n[  SKIPPED ] Cuda.NeedsTwo\n")
    bench = {"benchmarks": [
        {"name": "BM_CudaCopyFloor64M/real_time", "run_name": "BM_CudaCopyFloor64M/real_time",
         "real_time": 0.181, "time_unit": "ms", "per_call_ms": 0.181, "bytes/s": 2.97e12},
        {"name": "BM_CudaSoftmax8192/real_time", "run_name": "BM_CudaSoftmax8192/real_time",
         "real_time": 315.0, "time_unit": "us", "per_call_ms": 0.315, "of_copy": 0.57},
        {"name": "BM_CudaConv/a/forward", "run_name": "BM_CudaConv/a/forward", "real_time": 1.5,
         "time_unit": "ms", "vs_gemms": 1.12, "label": "chose im2col_l2"},
        {"name": "BM_CudaGemm/kiln", "run_name": "BM_CudaGemm/kiln", "real_time": 0,
         "error_occurred": True, "error_message": "no usable CUDA device"},
        {"name": "BM_CudaSoftmax8192/real_time_mean", "run_name": "BM_CudaSoftmax8192/real_time",
         "aggregate_name": "mean", "real_time": 999.0, "time_unit": "ms", "per_call_ms": 999.0},
    ]}
    write(root, "bench_main.json", json.dumps(bench))
    write(root, "gpu-peers.json", json.dumps({
        "torch_eager": {"softmax_8192": 0.00084},
        "torch_compile": {"softmax_8192": 0.000186},
        "jax": {"error": "jax failed to start"}}))


class Summary(unittest.TestCase):
    def test_reads_every_part_of_the_logs(self):
        with tempfile.TemporaryDirectory() as logs, tempfile.TemporaryDirectory() as out:
            fake_logs(logs)
            run = subprocess.run([sys.executable, SCRIPT, logs, out], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            self.assertEqual(run.returncode, 0, run.stdout)
            doc = run.stdout
            self.assertIn("NVIDIA H100 80GB HBM3", doc)
            self.assertIn("| tests | 1 | 42 |", doc)
            self.assertIn("| kiln_cuda_test | 1 | Cuda.Broken | Cuda.NeedsTwo | 1 |", doc)
            self.assertIn("| BM_CudaSoftmax8192/real_time | 0.315 |", doc)  # us to ms; mean left out
            self.assertIn("of_copy=0.57", doc)
            self.assertIn("chose im2col_l2; vs_gemms=1.12", doc)
            self.assertIn("| BM_CudaGemm/kiln | error: no usable CUDA device", doc)
            # kiln 0.315 ms against torch.compile's 0.186: the compiled peer is 0.59x kiln's time.
            self.assertIn("| softmax_8192 | 0.315 | 0.84 | 0.186 | — | 0.59x |", doc)
            self.assertIn("- jax: jax failed to start", doc)
            written = json.loads(Path(out, "gpu-bench.json").read_text())
            self.assertEqual(len(written["benchmarks"]), 4)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main()
