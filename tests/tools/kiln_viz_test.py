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


def render(chromium, page, fragment, max_seconds):
    """The DOM of the page (with a URL fragment setting its state) after headless Chromium ran it."""
    with tempfile.TemporaryDirectory(prefix="kiln-viz-chromium-") as profile:
        cmd = chromium_args(chromium, profile) + ["--dump-dom", "file://" + page + fragment]
        return run(cmd, timeout=max(120, 3 * max_seconds), echo=False).stdout


def check_status(dom, work):
    """The canvas's drawn elements, after checking that the page finished without an error."""
    if 'class="kiln-viz-error"' in dom or attr(dom, "data-status") == "error":
        fail("the page raised a script error: %s" % (attr(dom, "data-error") or dom[-2000:]))
    if attr(dom, "data-status") != "ok":
        fail("the page did not finish (status %r); DOM saved in %s/dom.html"
             % (attr(dom, "data-status"), work))
    # What was drawn: the canvas's elements (not the page's script, which spells them too).
    drawn = re.search(r'<g id="viewport"[^>]*>(.*?)</svg>', dom, re.S)
    if not drawn:
        fail("no canvas in the DOM")
    return drawn.group(1)


def count_nodes(drawn):
    return len(re.findall(r'<g class="node[" ]', drawn))


def count_groups(drawn):
    return len(re.findall(r'<g class="group[" ]', drawn))


def expect_counts(dom, drawn, nodes, groups, what):
    got_nodes, got_groups = count_nodes(drawn), count_groups(drawn)
    if got_nodes != nodes or attr(dom, "data-nodes") != str(nodes):
        fail("%s: %d node boxes in the DOM (marker: %s), expected %d"
             % (what, got_nodes, attr(dom, "data-nodes"), nodes))
    if got_groups != groups or attr(dom, "data-groups") != str(groups):
        fail("%s: %d group boxes in the DOM (marker: %s), expected %d"
             % (what, got_groups, attr(dom, "data-groups"), groups))


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
    start = time.monotonic()
    dom = render(chromium, page, "", args.max_seconds)
    seconds = time.monotonic() - start
    open(os.path.join(work, "dom.html"), "w", encoding="utf-8").write(dom)
    if args.screenshot:
        with tempfile.TemporaryDirectory(prefix="kiln-viz-chromium-") as profile:
            run(chromium_args(chromium, profile) + [
                "--hide-scrollbars", "--window-size=1280,760",
                "--screenshot=" + os.path.abspath(args.screenshot), "file://" + page])

    drawn = check_status(dom, work)
    shown = attr(dom, "data-file")
    doc = json.load(open(os.path.join(dump, shown), encoding="utf-8"))
    nodes, groups = doc["nodes"], doc["groups"]
    got_nodes, got_groups = count_nodes(drawn), count_groups(drawn)
    print("shown: %s (%d nodes, %d groups); DOM: %d node boxes, %d group boxes; status %s; "
          "chromium took %.1f s" % (shown, len(nodes), len(groups), got_nodes, got_groups,
                                    re.search(r'id="kiln-viz-status"[^>]*>', dom).group(0), seconds))
    expect_counts(dom, drawn, len(nodes), len(groups), "the page")
    if args.mode == "lstm":
        if not groups:
            fail("the LSTM cell's shown graph has no fusion group")
        if not re.search(r'<text class="time"[^>]*>[0-9.]+ (ms|\u00b5s)<', drawn):
            fail("no group box shows a kernel time from the trace")
        # The search box, set from the URL: every node whose op names sigmoid, highlighted.
        dom = render(chromium, page, "#search=sigmoid", args.max_seconds)
        drawn = check_status(dom, work)
        want = sum("sigmoid" in n["op"] for n in nodes)
        got = len(re.findall(r'<g class="node[^"]*\bmatch\b', drawn))
        print("search 'sigmoid': %d highlighted, %d expected" % (got, want))
        if want == 0 or got != want:
            fail("searching 'sigmoid' highlighted %d nodes, not %d" % (got, want))
        # Every group collapsed: one box per group, and only the nodes outside groups.
        dom = render(chromium, page, "#collapse=all", args.max_seconds)
        drawn = check_status(dom, work)
        outside = sum(n["group"] is None for n in nodes)
        collapsed = len(re.findall(r'<g class="group collapsed"', drawn))
        print("collapsed: %d node boxes (%d outside groups), %d collapsed group boxes"
              % (count_nodes(drawn), outside, collapsed))
        expect_counts(dom, drawn, outside, len(groups), "the collapsed page")
        if collapsed != len(groups):
            fail("%d of %d groups collapsed" % (collapsed, len(groups)))
    else:
        if len(nodes) < args.nodes:
            fail("the wide graph has %d nodes, fewer than %d" % (len(nodes), args.nodes))
        if seconds > args.max_seconds:
            fail("rendering took %.1f s, more than %.0f s" % (seconds, args.max_seconds))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
