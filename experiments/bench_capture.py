"""How long capturing a model takes, how much memory it needs, and whether the graph's memory is right.

For each model, in a fresh Python process (so the peak RSS is that capture's
alone): build it and capture one training step (`optsched.capture`), timing
both together, and read the process's peak RSS. Then simulate the
keep-everything schedule of the graph and, for models captured with real
weights, run one plain eager step on the CPU and measure its peak allocated
bytes (`optsched.capture.memory.eager_peak`): the two should agree.

Models: the built-ins at their default (test) sizes; GPT-2 small (12 layers,
d 768, vocab 50257, sequence 128, batch 4), with real weights and under
FakeTensorMode; a 1.3-billion-parameter GPT-2 (24 layers, d 2048, 16 heads,
sequence 1024, batch 1) under FakeTensorMode only.

    .venv/bin/python experiments/bench_capture.py [--only gpt2-small,gpt2-1b]

Prints a markdown table and writes experiments/results/capture.csv (with the
machine, the load average when each capture started, and the command).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "experiments" / "results" / "capture.csv"
COMMAND = " ".join(["python", "experiments/bench_capture.py", *sys.argv[1:]])
GPT2_SMALL = {"layers": 12, "d": 768, "heads": 12, "vocab": 50257, "seq": 128, "batch": 4}
GPT2_1B = {"layers": 24, "d": 2048, "heads": 16, "vocab": 50257, "seq": 1024, "batch": 1}

# name -> (built-in factory, its keyword arguments, capture under FakeTensorMode)
CASES = {
    "mlp": ("mlp", {}, False),
    "cnn": ("cnn", {}, False),
    "transformer": ("transformer", {}, False),
    "gpt2": ("gpt2", {}, False),
    "bert": ("bert", {}, False),
    "gpt2-small": ("gpt2", GPT2_SMALL, False),
    "gpt2-small-fake": ("gpt2", GPT2_SMALL, True),
    "gpt2-1b-fake": ("gpt2", GPT2_1B, True),
}
COLUMNS = ["model", "factory", "config", "fake", "parameters", "nodes", "edges", "capture_s", "peak_rss_bytes",
           "rss_after_import_bytes", "sim_peak_bytes", "eager_peak_bytes", "sim_over_eager", "load_avg", "machine",
           "torch", "command"]


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu_model()}, {os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}"


def max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def child(name: str) -> dict:
    """One capture in this (fresh) process; the eager step comes after the RSS reading."""
    import torch

    from optsched.capture import capture, capture_factory
    from optsched.capture.memory import eager_peak
    from optsched.capture.models import BUILTIN
    from optsched.cluster import single_accelerator
    from optsched.simulate import simulate
    from optsched.solvers import solve

    factory, kw, fake = CASES[name]
    rss_import = max_rss()
    load = os.getloadavg()[0]
    torch.manual_seed(0)
    start = time.perf_counter()
    if fake:
        g = capture_factory(lambda: BUILTIN[factory](**kw), fake=True, name=name)
    else:
        ex = BUILTIN[factory](**kw)
        g = capture(ex["model"], ex["inputs"], ex["loss_fn"], targets=ex["targets"], name=name)
    seconds = time.perf_counter() - start
    rss = max_rss()
    cl = single_accelerator(2**50)
    r = simulate(g, cl, solve(g, cl, "keep-everything"))
    assert r.valid, r.violation
    sim = r.peak["gpu0"]
    eager = None if fake else eager_peak(ex["model"], ex["inputs"], ex["targets"], ex["loss_fn"])
    return {"model": name, "factory": factory, "config": json.dumps(kw, separators=(",", ":")), "fake": fake,
            "parameters": g.meta["capture"]["parameters"], "nodes": len(g.nodes), "edges": g.num_edges,
            "capture_s": round(seconds, 2), "peak_rss_bytes": rss, "rss_after_import_bytes": rss_import,
            "sim_peak_bytes": sim, "eager_peak_bytes": eager,
            "sim_over_eager": None if eager is None else round(sim / eager, 4), "load_avg": round(load, 2),
            "torch": torch.__version__}


def fmt_bytes(b) -> str:
    if b in (None, ""):
        return "-"
    return f"{b / 1e9:.2f} GB" if b >= 1e9 else f"{b / 1e6:.1f} MB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated subset of: " + ", ".join(CASES))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    names = args.only.split(",") if args.only else list(CASES)
    unknown = set(names) - set(CASES)
    if unknown:
        ap.error(f"unknown model {', '.join(sorted(unknown))}")
    host = machine()
    rows = []
    for name in names:
        p = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{name}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
            return 1
        row = json.loads(p.stdout.strip().splitlines()[-1])
        row.update(machine=host, command=COMMAND)
        rows.append(row)
        print(f"{name}: {row['capture_s']} s, {fmt_bytes(row['peak_rss_bytes'])} RSS", file=sys.stderr)

    out = Path(args.out)
    tmp = out.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, out)

    print("| model | parameters | fake | nodes | capture | peak RSS (after imports) | keep-everything peak "
          "(simulated) | eager peak (measured) | simulated / eager |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['sim_over_eager']:.3f}" if r["sim_over_eager"] is not None else "-"
        print(f"| {r['model']} | {r['parameters']:,} | {'yes' if r['fake'] else 'no'} | {r['nodes']:,} "
              f"| {r['capture_s']:.1f} s | {fmt_bytes(r['peak_rss_bytes'])} ({fmt_bytes(r['rss_after_import_bytes'])}) "
              f"| {fmt_bytes(r['sim_peak_bytes'])} "
              f"| {fmt_bytes(r['eager_peak_bytes'])} | {ratio} |")
    print(f"\nmachine: {host}; torch {rows[0]['torch']}; load average {min(r['load_avg'] for r in rows)}"
          f"-{max(r['load_avg'] for r in rows)} at the captures\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
