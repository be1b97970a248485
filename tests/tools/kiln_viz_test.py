#!/usr/bin/env python3
"""tools/kiln-viz, tested for real: a workload dumps its graphs (KILN_DUMP), kiln-viz renders the
dump, headless Chromium loads the page, and the DOM it leaves must show every node and every
fusion group of the graph shown, no script error, and the page's success marker.

  kiln_viz_test.py lstm --workload BIN --viz tools/kiln-viz --work DIR
  kiln_viz_test.py wide --workload BIN --viz tools/kiln-viz --work DIR --nodes 10000 --max-seconds 20
  kiln_viz_test.py overview --workload BIN --viz tools/kiln-viz --work DIR

overview runs the word_lm example's traced step (about 2,000 nodes) with a profile: the first view
must show the groups as labelled boxes at a readable size (in the DOM and in a screenshot), the
side panel must list the slowest groups, a click on the first must expand and frame that group,
and each group's time must be its own launches' (they sum to the graph's kernel time in the trace).

Without Chromium the test fails (CI installs it through tools/setup) unless KILN_SKIP_BROWSER=1,
which skips the browser part (exit code 77, CTest's SKIP_RETURN_CODE). --screenshot PNG also
takes a screenshot of the page (docs/kiln-viz.png is made so).
"""

import argparse
import html as htmllib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

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


WINDOW = "1280,760"  # the overview's checks and the screenshots see a laptop's window


def screenshot(chromium, page, fragment, png):
    with tempfile.TemporaryDirectory(prefix="kiln-viz-chromium-") as profile:
        run(chromium_args(chromium, profile) + [
            "--hide-scrollbars", "--window-size=" + WINDOW,
            "--screenshot=" + os.path.abspath(png), "file://" + page + fragment])


def read_png(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA, non-interlaced PNG, as
    Chromium writes its screenshots."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("%s is not a PNG" % path)
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in (2, 6) or interlace:
        fail("%s: unsupported PNG (depth %d, color type %d, interlace %d)"
             % (path, depth, color, interlace))
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


def render(chromium, page, fragment, max_seconds, window=None):
    """The DOM of the page (with a URL fragment setting its state) after headless Chromium ran it,
    in a window of `window` ("1280,760") or Chromium's default size."""
    with tempfile.TemporaryDirectory(prefix="kiln-viz-chromium-") as profile:
        size = ["--window-size=" + window] if window else []
        cmd = chromium_args(chromium, profile) + size + ["--dump-dom", "file://" + page + fragment]
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


def page_data(page):
    """The data kiln-viz put in the page (its kiln-data script)."""
    text = open(page, encoding="utf-8").read()
    m = re.search(r'<script id="kiln-data" type="application/json">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def trace_kernels(trace):
    """The trace's kernel launches as (graph, group, kernel, microseconds)."""
    out = []
    for e in json.load(open(trace)):
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            a = e["args"]
            out.append((a.get("graph"), a.get("group"), a.get("kernel"), float(e["dur"])))
    return out


def check_group_times(data, shown, launches):
    """Each group of the shown graph is timed by its own launches: its calls and time are those of
    the trace's events naming it, and the groups' times sum to the graph's kernel time. The graph
    must have a kernel that several groups share (else timing by kernel name would pass too)."""
    graph = shown["graph"]
    mine = [l for l in launches if l[0] == graph]
    if not mine:
        fail("the trace has no kernel launch of graph %s" % graph)
    total = sum(l[3] for l in mine)
    owners = {}
    for g in shown["groups"]:
        for k in g["kernels"]:
            owners.setdefault(k, []).append(g["id"])
    shared = [k for k, gs in owners.items() if len(gs) > 1]
    if not shared:
        fail("no kernel of graph %s is shared by two groups: the test shows nothing" % graph)
    by_kernel = {}
    for l in mine:
        by_kernel[l[2]] = by_kernel.get(l[2], 0.0) + l[3]
    naive = sum(by_kernel.get(k, 0.0) for g in shown["groups"] for k in g["kernels"])
    page_total = 0.0
    for g in shown["groups"]:
        own = [l for l in mine if l[1] == g["id"]]
        if not own:
            continue
        us = sum(l[3] for l in own)
        if g.get("calls") != len(own) or abs(g.get("us", -1) - us) > 1e-6 * max(1.0, us) + 1e-3:
            fail("group %d shows %r us in %r calls; its launches took %.3f us in %d"
                 % (g["id"], g.get("us"), g.get("calls"), us, len(own)))
        if g.get("shared"):
            fail("group %d is marked as showing a shared kernel's total" % g["id"])
        page_total += g["us"]
    print("group times: %.1f us in the page, %.1f us of graph %s in the trace (timed by kernel "
          "name: %.1f us); %d kernels shared by several groups"
          % (page_total, total, graph, naive, len(shared)))
    if abs(page_total - total) > 1e-6 * total + 1e-3 * len(mine):
        fail("the groups' times sum to %.3f us, the graph's launches to %.3f us" % (page_total, total))
    if naive <= total * 1.0001:
        fail("timing by kernel name would not over-count here: the test shows nothing")


def check_overview_screenshot(png):
    """The first view's screenshot shows collapsed group boxes (their fill) at least 36 pixels
    tall, with label text (their dark brown) drawn."""
    width, height, rows = read_png(png)
    fill = (255, 233, 184)
    def near(p, q, tol):
        return abs(p[0] - q[0]) <= tol and abs(p[1] - q[1]) <= tol and abs(p[2] - q[2]) <= tol
    fill_px, text_px, tallest = 0, 0, 0
    run = [0] * width
    for y in range(height):
        row = rows[y]
        for x in range(width):
            p = row[x]
            if near(p, fill, 4):
                fill_px += 1
                run[x] += 1
                if run[x] > tallest:
                    tallest = run[x]
            else:
                run[x] = 0
                if near(p, (138, 90, 0), 40) or near(p, (106, 80, 32), 30):
                    text_px += 1
    print("screenshot %dx%d: %d px of collapsed group fill, boxes' fill up to %d px tall, %d px "
          "of label text" % (width, height, fill_px, tallest, text_px))
    if fill_px < 4 * 100 * 36 or tallest < 36:
        fail("the first view does not show readable group boxes (%d px of their fill, %d px tall)"
             % (fill_px, tallest))
    if text_px < 500:
        fail("the first view's group boxes have no labels drawn (%d px of label text)" % text_px)


def overview(chromium, page, data, trace, work, max_seconds):
    # The first view: collapsed, labelled group boxes at a readable size.
    dom = render(chromium, page, "", max_seconds, WINDOW)
    open(os.path.join(work, "dom.html"), "w", encoding="utf-8").write(dom)
    drawn = check_status(dom, work)
    shown = data["graphs"][[g["file"] for g in data["graphs"]].index(attr(dom, "data-file"))]
    groups = shown["groups"]
    print("shown: graph %s \"%s\", %d nodes, %d groups; zoom %s, %s groups in view, the smallest "
          "%s px tall" % (shown["graph"], shown.get("name", ""), shown["n"], len(groups), attr(dom, "data-zoom"),
                          attr(dom, "data-groups-in-view"), attr(dom, "data-min-group-px")))
    if not shown.get("name", "").startswith("trace ") or "forward+backward" not in shown["name"]:
        fail("the graph shown first is not named as the traced step: %r" % shown.get("name"))
    summary = re.search(r'<div id="summary">(.*?)</div>', dom, re.S).group(1)
    if htmllib.escape(shown["name"], quote=False) not in summary:
        fail("the summary does not name the graph: %r" % summary)
    if shown["n"] < 1000 or len(groups) < 30:
        fail("the traced word_lm step has %d nodes and %d groups, expected some 2,000 and 90"
             % (shown["n"], len(groups)))
    collapsed = len(re.findall(r'<g class="group collapsed', drawn))
    labels = re.findall(r'<text class="label"[^>]*>\u25b8 #(\d+) [^<]+</text>', drawn)
    if collapsed != len(groups) or sorted(map(int, labels)) != sorted(g["id"] for g in groups):
        fail("the first view has %d of %d groups collapsed, %d labelled"
             % (collapsed, len(groups), len(labels)))
    if attr(dom, "data-text-shown") != "1" or float(attr(dom, "data-min-group-px")) < 40 or \
            int(attr(dom, "data-groups-in-view")) < 4:
        fail("the first view is not readable: zoom %s, text shown %s, %s groups in view, the "
             "smallest %s px tall" % (attr(dom, "data-zoom"), attr(dom, "data-text-shown"),
                                      attr(dom, "data-groups-in-view"), attr(dom, "data-min-group-px")))
    png = os.path.join(work, "overview.png")
    screenshot(chromium, page, "", png)
    check_overview_screenshot(png)

    # The slowest groups, listed; a click on the first expands and frames it.
    slow = re.findall(r'<a href="#" data-group="(\d+)"', re.search(
        r'<table class="slow">(.*?)</table>', dom, re.S).group(1))
    timed = sorted((g for g in groups if "us" in g), key=lambda g: -g["us"])
    if not slow or int(slow[0]) != timed[0]["id"] or len(slow) != min(40, len(timed)):
        fail("the slow-groups list %s does not start with the slowest group %d"
             % (slow[:5], timed[0]["id"]))
    dom = render(chromium, page, "#click=%23ranking%20a", max_seconds, WINDOW)
    drawn = check_status(dom, work)
    first = timed[0]
    box = [float(v) for v in (attr(dom, "data-focus-box") or "-1,-1,0,0").split(",")]
    width, height = [float(v) for v in attr(dom, "data-canvas").split("x")]
    print("clicked the first slow group: focus %s, box %s in a %dx%d canvas, %s of %d nodes drawn"
          % (attr(dom, "data-focus-group"), box, width, height, attr(dom, "data-focus-members"),
             len(first["members"])))
    if attr(dom, "data-focus-group") != str(first["id"]):
        fail("the click focused group %s, not %d" % (attr(dom, "data-focus-group"), first["id"]))
    if attr(dom, "data-focus-members") != str(len(first["members"])):
        fail("the focused group is not expanded to its nodes")
    # Framed: the whole box where it fits, else its top left corner near the canvas's.
    for at, size, room in ((box[0], box[2], width), (box[1], box[3], height)):
        if not (0 <= at and (at + size <= room if size <= room - 40 else at <= 21)):
            fail("the focused group's box %s is not framed in the %dx%d canvas" % (box, width, height))
    if box[2] < 100:
        fail("the focused group's box %s is too small to read" % box)
    if not re.search(r'<g class="group focus" data-g="%d"' % groups.index(first), drawn):
        fail("the focused group is not marked")
    check_group_times(data, shown, trace_kernels(trace))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["lstm", "wide", "overview"])
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
    profiled = args.mode in ("lstm", "overview")

    # 1. The dump.
    env = dict(os.environ, KILN_DUMP=dump)
    env.pop("KILN_PROFILE", None)
    if profiled:
        env["KILN_PROFILE"] = trace
        run([args.workload, "lstm" if args.mode == "lstm" else "word_lm"], env=env)
        kernels = [e for e in json.load(open(trace)) if e.get("cat") == "kernel"]
        if not kernels or not all(e["args"].get("kernel", "").startswith("kiln_") for e in kernels):
            fail("the trace's kernel events do not all name their kernel (args.kernel)")
        if not all(isinstance(e["args"].get("group"), int) and isinstance(e["args"].get("graph"), int)
                   for e in kernels):
            fail("the trace's kernel events do not all name their graph and group")
    else:
        run([args.workload, "wide", str(args.nodes)], env=env)
    files = sorted(f for f in os.listdir(dump) if f.endswith(".json"))
    if not files:
        fail("the workload dumped no graph into " + dump)
    print("%d graph files dumped; kernels: %d" % (len(files), len(os.listdir(os.path.join(dump, "kernels")))))

    # 2. The page.
    viz = [sys.executable, args.viz, dump, "-o", page]
    if profiled:
        viz += ["--trace", trace]
    if args.mode == "lstm":
        # The LSTM cell's graph (the one with sigmoids) first, whichever graph took the most time:
        # kernel times order the graphs differently in a sanitizer build.
        fused = [json.load(open(os.path.join(dump, f), encoding="utf-8"))
                 for f in files if f.endswith("_fuse.json")]
        cell = max(fused, key=lambda d: sum("sigmoid" in n["op"] for n in d["nodes"]))
        viz += ["--graph", str(cell["graph"])]
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
    if args.mode == "overview":
        overview(chromium, page, page_data(page), trace, work, args.max_seconds)
        print("PASS")
        return 0
    # Every group expanded and every node shown, so that every node is drawn (a large graph opens
    # on an overview of collapsed groups without its inputs, constants and views).
    start = time.monotonic()
    dom = render(chromium, page, "#collapse=none&plumbing=show", args.max_seconds)
    seconds = time.monotonic() - start
    open(os.path.join(work, "dom.html"), "w", encoding="utf-8").write(dom)
    if args.screenshot:
        screenshot(chromium, page, "", args.screenshot)
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
        dom = render(chromium, page, "#collapse=none&plumbing=show&search=sigmoid", args.max_seconds)
        drawn = check_status(dom, work)
        want = sum("sigmoid" in n["op"] for n in nodes)
        got = len(re.findall(r'<g class="node[^"]*\bmatch\b', drawn))
        print("search 'sigmoid': %d highlighted, %d expected" % (got, want))
        if want == 0 or got != want:
            fail("searching 'sigmoid' highlighted %d nodes, not %d" % (got, want))
        # Every group collapsed: one box per group, and only the nodes outside groups.
        dom = render(chromium, page, "#collapse=all&plumbing=show", args.max_seconds)
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
