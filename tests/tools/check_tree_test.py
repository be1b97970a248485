#!/usr/bin/env python3
"""tools/check-tree on tiny fake trees: an upward include fails (naming file:line and both
layers), downward ones pass, a function over --max-lines fails, and a file without a first-line
comment fails in strict mode and only is listed in report mode.

  check_tree_test.py --script tools/check-tree --venv DIR   (DIR: where lizard's venv is kept)
"""

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

ARGS = None


def write_tree(root, files):
    for rel, text in files.items():
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def check_tree(root, *args):
    env = dict(os.environ, KILN_CHECK_TREE_VENV=ARGS.venv)
    env.pop("KILN_CHECK_TREE_IN_VENV", None)
    return subprocess.run([sys.executable, ARGS.script, "--root", str(root), *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# A tree whose includes all point down (or sideways), with the public API in lib's layer.
CLEAN = {
    "include/kiln/tensor.h": "// The tensor.\n#pragma once\n",
    "lib/tensor.cpp": '// Tensors.\n#include "kiln/tensor.h"\n#include <vector>\n',
    "jit/ir.h": '// The IR.\n#pragma once\n#include "lib/tensor.h"\n',
    "jit/passes/dce.cpp": '// Dead code.\n#include "jit/ir.h"\n#include "kiln/tensor.h"\n',
    "fuser/fuse.cpp": '// Fusion.\n#include "jit/ir.h"\n#include "local.h"\n',
    "fuser/local.h": "// Beside fuse.cpp.\n#pragma once\n",
    "exec/run.cpp": '// Running.\n#include "fuser/fuse.h"\n#include "jit/ir.h"\n',
}


class Includes(unittest.TestCase):
    def test_downward_includes_pass(self):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, CLEAN)
            r = check_tree(root, "--only", "includes")
            self.assertEqual(r.returncode, 0, r.stdout)
            self.assertIn("0 upward include(s)", r.stdout)

    def test_upward_include_fails_with_file_line_and_layers(self):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, dict(CLEAN, **{
                "jit/passes/transfers.cpp":
                    '// Transfers.\n#include "jit/ir.h"\n#include "fuser/fuse.h"\n'}))
            r = check_tree(root, "--only", "includes")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn('jit/passes/transfers.cpp:3: error: includes "fuser/fuse.h": jit/ '
                          "(layer 1) may not include from fuser/ (layer 2)", r.stdout)
            self.assertIn("1 upward include(s)", r.stdout)

    def test_public_header_including_the_jit_fails(self):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, dict(CLEAN, **{
                "include/kiln/jit.h": '// The JIT API.\n#pragma once\n#include "jit/ir.h"\n'}))
            r = check_tree(root, "--only", "includes")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("include/kiln/jit.h:3: error", r.stdout)

    def test_lib_including_the_executor_fails(self):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, dict(CLEAN, **{
                "lib/lazy.cpp": '// Lazy.\n#include "exec/lazy_eval.h"\n'}))
            r = check_tree(root, "--only", "includes")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("lib/ (layer 0) may not include from exec/ (layer 3)", r.stdout)


def long_function(lines):
    body = "".join(f"  x += {i};\n" for i in range(lines - 3))
    return f"// Long.\nint long_one(int x) {{\n{body}  return x;\n}}\n"


class Functions(unittest.TestCase):
    def test_function_over_the_limit_fails_and_is_listed(self):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, dict(CLEAN, **{"fuser/codegen/llvm/gen.cpp": long_function(130)}))
            r = check_tree(root, "--only", "functions", "--max-lines", "120")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("130  fuser/codegen/llvm/gen.cpp:2  long_one  error: too long", r.stdout)
            r = check_tree(root, "--only", "functions", "--max-lines", "130")
            self.assertEqual(r.returncode, 0, r.stdout)


class Headers(unittest.TestCase):
    def test_file_without_a_first_line_comment(self):
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, dict(CLEAN, **{"exec/bare.cpp": '#include "jit/ir.h"\n'}))
            r = check_tree(root, "--only", "headers")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("exec/bare.cpp:1: error", r.stdout)
            r = check_tree(root, "--only", "headers", "--headers", "report")
            self.assertEqual(r.returncode, 0, r.stdout)
            self.assertIn("exec/bare.cpp:1: note", r.stdout)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", required=True)
    parser.add_argument("--venv", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
