#!/usr/bin/env python3
"""tools/kiln-viz, tested for real: a workload dumps its graphs (KILN_DUMP), kiln-viz renders the
dump, headless Chromium loads the page, and the DOM it leaves must show every node and every
fusion group of the graph shown, no script error, and the page's success marker.

  kiln_viz_test.py lstm --workload BIN --viz tools/kiln-viz --work DIR
  kiln_viz_test.py wide --workload BIN --viz tools/kiln-viz --work DIR --nodes 10000 --max-seconds 20

Without Chromium the test fails (CI installs it through tools/setup) unless KILN_SKIP_BROWSER=1,
which skips the browser part (exit code 77, CTest's SKIP_RETURN_CODE). --screenshot PNG also
takes a screenshot of the page (docs/kiln-viz.png is made so).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, env=None, timeout=600, echo=True):
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if echo:
        sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        fail("%s exited with %d" % (cmd[0], p.returncode))
    return p


def find_chromium():
    for name in (os.environ.get("KILN_CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def chromium_args(chromium, profile_dir):
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            # Containers give /dev/shm 64 MB, too little for a 10,000-node page.
            "--disable-dev-shm-usage", "--user-data-dir=" + profile_dir]


def attr(dom, name):
    m = re.search(r'id="kiln-viz-status"[^>]*?\s' + re.escape(name) + r'="([^"]*)"', dom)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["lstm", "wide"])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--viz", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--screenshot")
    args = ap.parse_args()

    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    dump = os.path.join(work, "dump")
    trace = os.path.join(work, "trace.json")
    page = os.path.join(work, "page.html")

    # 1. The dump.
    env = dict(os.environ, KILN_DUMP=dump)
    env.pop("KILN_PROFILE", None)
    if args.mode == "lstm":
        env["KILN_PROFILE"] = trace
        run([args.workload, "lstm"], env=env)
        kernels = [e for e in json.load(open(trace)) if e.get("cat") == "kernel"]
        if not kernels or not all(e["args"].get("kernel", "").startswith("kiln_") for e in kernels):
            fail("the trace's kernel events do not all name their kernel (args.kernel)")
    else:
        run([args.workload, "wide", str(args.nodes)], env=env)
    files = sorted(f for f in os.listdir(dump) if f.endswith(".json"))
    if not files:
        fail("the workload dumped no graph into " + dump)
    print("%d graph files dumped; kernels: %s" % (
        len(files), ", ".join(sorted(os.listdir(os.path.join(dump, "kernels")))) or "none"))

    # 2. The page.
    viz = [sys.executable, args.viz, dump, "-o", page]
    if args.mode == "lstm":
        viz += ["--trace", trace]
    run(viz)
    html = open(page, encoding="utf-8").read()
    fetches = re.findall(r'(?:src|href)\s*=\s*["\']?\s*(?:https?:)?//|@import|url\(|<link\b', html)
    if fetches:
        fail("the page is not self-contained: it would fetch %r" % fetches[:5])

    # 3. The browser.
    chromium = find_chromium()
    if not chromium:
        msg = ("Chromium is not installed, so the page cannot be rendered. tools/setup installs it "
               "(apt-get install --no-install-recommends chromium); set KILN_SKIP_BROWSER=1 to skip "
               "this part locally.")
        if os.environ.get("KILN_SKIP_BROWSER") == "1":
            print("SKIPPED: " + msg)
            return SKIP
        fail(msg)
    with tempfile.TemporaryDirectory(prefix="kiln-viz-chromium-") as profile:
        cmd = chromium_args(chromium, profile) + ["--dump-dom", "file://" + page]
        start = time.monotonic()
        p = run(cmd, timeout=max(120, 3 * args.max_seconds), echo=False)
        seconds = time.monotonic() - start
        dom = p.stdout
        if args.screenshot:
            with tempfile.TemporaryDirectory(prefix="kiln-viz-chromium-") as profile2:
                run(chromium_args(chromium, profile2) + [
                    "--hide-scrollbars", "--window-size=1280,760",
                    "--screenshot=" + os.path.abspath(args.screenshot), "file://" + page])
    open(os.path.join(work, "dom.html"), "w", encoding="utf-8").write(dom)

    if 'class="kiln-viz-error"' in dom or attr(dom, "data-status") == "error":
        fail("the page raised a script error: %s" % (attr(dom, "data-error") or dom[-2000:]))
    if attr(dom, "data-status") != "ok":
        fail("the page did not finish (status %r); DOM saved in %s/dom.html"
             % (attr(dom, "data-status"), work))
    shown = attr(dom, "data-file")
    doc = json.load(open(os.path.join(dump, shown), encoding="utf-8"))
    want_nodes, want_groups = len(doc["nodes"]), len(doc["groups"])
    # What was drawn: the canvas's elements (not the page's script, which spells them too).
    drawn = re.search(r'<g id="viewport"[^>]*>(.*?)</svg>', dom, re.S)
    if not drawn:
        fail("no canvas in the DOM; saved in %s/dom.html" % work)
    drawn = drawn.group(1)
    got_nodes = len(re.findall(r'<g class="node[" ]', drawn))
    got_groups = len(re.findall(r'<g class="group[" ]', drawn))
    print("shown: %s (%d nodes, %d groups); DOM: %d node boxes, %d group boxes; status %s; "
          "chromium took %.1f s" % (shown, want_nodes, want_groups, got_nodes, got_groups,
                                    re.search(r'id="kiln-viz-status"[^>]*>', dom).group(0), seconds))
    if got_nodes != want_nodes or attr(dom, "data-nodes") != str(want_nodes):
        fail("%d node boxes in the DOM, the graph has %d" % (got_nodes, want_nodes))
    if got_groups != want_groups or attr(dom, "data-groups") != str(want_groups):
        fail("%d group boxes in the DOM, the graph has %d" % (got_groups, want_groups))
    if args.mode == "lstm":
        if want_groups < 1:
            fail("the LSTM cell's shown graph has no fusion group")
        if not re.search(r'<text class="time"[^>]*>[0-9.]+ (ms|\u00b5s)<', drawn):
            fail("no group box shows a kernel time from the trace")
    else:
        if want_nodes < args.nodes:
            fail("the wide graph has %d nodes, fewer than %d" % (want_nodes, args.nodes))
        if seconds > args.max_seconds:
            fail("rendering took %.1f s, more than %.0f s" % (seconds, args.max_seconds))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
