"""--max-seconds bounds the whole run (issue 44): every wall time within --max-seconds plus
the start-up the report gives (imports; under `run`, the script up to its training
loader's creation: run.startup_s) plus 5 s (the report, the workers' shutdown, python's
exit).

Cases, each a fresh process timed from its start to its exit:

- `demo`: `bisect-pipeline demo` at each of --budgets;
- `heavy`: `--entry scripts/heavy_step.py:make` (a 1.5 s step) at each of --budgets;
- `slow`: `--entry` on a pipeline too slow to finish (every point slower than its share);
- public scripts (with --examples, a checkout of github.com/pytorch/examples or its bare
  git dir): `run --tune --patch p.diff` of mnist, vae and dcgan
  (scripts/bench_public_scripts.py's cases, on its generated data) at each of
  --tune-budgets: the bisection, the check, the search and the change's check all inside.

    python scripts/bench_max_seconds.py                                   # demo, heavy, slow at 30 and 60
    python scripts/bench_max_seconds.py --cases demo --budgets 15,30
    python scripts/bench_max_seconds.py --cases mnist,vae,dcgan --examples /tmp/examples --tune-budgets 60,120

Each run holds /tmp/cpu.lock (--lock) for its duration. A line per run: the budget, the
wall time, the start-up reported, the bound and whether the run kept it; the plan the
report gives ("of 120 s: ..."), the verdict, and for --patch the change's check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_public_scripts as pub  # noqa: E402

SLOW_ENTRY = """
from bisect_pipeline import testing

def make():
    # 20 ms per sample of augmentation, batch 16: 320 ms per batch at full and raw.
    model, loader = testing.benchmark("augment", 0)
    loader.dataset.transform.ms = 20.0
    return model, loader
"""
SLACK_S = 5.0
PUBLIC = ("mnist", "vae", "dcgan")


def one(cmd: list, cwd: str, budget: float, json_path: str, lock: str, env=None) -> dict:
    rc, _, stderr, wall = pub.run_process(cmd, cwd, env or dict(os.environ), budget + 300, lock)
    out = {"exit": rc, "wall_s": round(wall, 1)}
    if not os.path.exists(json_path):
        out["error"] = stderr[-600:]
        return out
    doc = json.load(open(json_path))
    run = doc.get("run") or {}
    startup = run.get("startup_s") or 0.0
    t = doc.get("tune") or {}
    out.update(elapsed_s=run.get("elapsed_s"), startup_s=startup, bound_s=round(budget + startup + SLACK_S, 1),
               budget=run.get("budget"), verdict=doc.get("bottleneck"),
               patch_check=(None if not t else (t.get("applied_outcome") or {}).get("status") or t.get("applied_reason")))
    out["within"] = wall <= out["bound_s"]
    return out


def show(name: str, budget: float, r: dict) -> None:
    if "error" in r:
        print(f"{name:>8s} {budget:>5g}  exit {r['exit']}, no report: {r['error']!r}", flush=True)
        return
    print(f"{name:>8s} {budget:>5g}  wall {r['wall_s']:6.1f}  start-up {r['startup_s']:5.1f}  bound {r['bound_s']:6.1f}  "
          f"{'within' if r['within'] else 'OVER'}  exit {r['exit']}  verdict {r['verdict']}  plan {r['budget']}"
          + (f"  change checked: {r['patch_check']}" if r.get("patch_check") is not None else ""), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="demo,heavy,slow")
    ap.add_argument("--budgets", default="30,60", help="--max-seconds of demo, heavy and slow")
    ap.add_argument("--tune-budgets", default="60,120", help="--max-seconds of the public scripts' run --tune --patch")
    ap.add_argument("--examples", default=None, help="a checkout (or bare git dir) of github.com/pytorch/examples")
    ap.add_argument("--out", default=None)
    ap.add_argument("--lock", default="/tmp/cpu.lock")
    args = ap.parse_args()
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="bench_max_seconds_"))
    os.makedirs(out, exist_ok=True)
    entry = os.path.join(out, "slow_entry.py")
    with open(entry, "w") as f:
        f.write(SLOW_ENTRY)
    results = []
    for name in args.cases.split(","):
        public = name in PUBLIC or name in pub.CASES
        budgets = args.tune_budgets if public else args.budgets
        for budget in (float(b) for b in budgets.split(",")):
            js = os.path.join(out, f"{name}-{budget:g}.json")
            if os.path.exists(js):
                os.remove(js)
            base = ["--json", js, "--max-seconds", f"{budget:g}", "--device", "cpu", "--quiet"]
            tool = [sys.executable, "-m", "bisect_pipeline"]
            cwd = out
            if name == "demo":
                cmd = tool + ["demo"] + base
            elif name == "heavy":
                cmd = tool + ["--entry", f"{os.path.join(HERE, 'heavy_step.py')}:make"] + base
            elif name == "slow":
                cmd = tool + ["--entry", f"{entry}:make"] + base
            elif public:
                if not args.examples:
                    print(f"{name}: needs --examples")
                    break
                case = pub.CASES[name]
                src = os.path.join(out, "src", case.repo)
                pub.copy_files(os.path.abspath(args.examples), case.files, src)
                data = os.path.join(out, "data")
                for kind in case.data:
                    pub.make_data(kind, data, os.path.join(out, "src"))
                cwd = os.path.join(out, "run", name)
                os.makedirs(os.path.join(cwd, "out"), exist_ok=True)
                os.makedirs(os.path.join(cwd, "results"), exist_ok=True)
                if not os.path.exists(os.path.join(out, "run", "data")):
                    os.symlink(data, os.path.join(out, "run", "data"))
                script_args = [a.format(data=data, out=os.path.join(cwd, "out"), src=src) for a in case.args]
                cmd = tool + ["run", "--tune", "--patch", os.path.join(cwd, "p.diff")] + base + \
                    [os.path.join(src, case.script)] + script_args
            else:
                print(f"unknown case {name}")
                break
            r = one(cmd, cwd, budget, js, args.lock)
            results.append({"case": name, "max_seconds": budget, **r})
            show(name, budget, r)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    kept = sum(1 for r in results if r.get("within"))
    print(f"{kept} of {len(results)} runs within --max-seconds + start-up + {SLACK_S:g} s ({out}/results.json)")


if __name__ == "__main__":
    main()
