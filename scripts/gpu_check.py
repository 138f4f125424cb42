"""The CUDA path, checked on a GPU: planted cases whose findings are known.

    python scripts/gpu_check.py                 # every case, ~2-3 min on one GPU
    python scripts/gpu_check.py --json out.json
    python scripts/gpu_check.py --cases float32,items

Cases (a small conv net, images 3x128x128, the data in memory):
- float32:  pre-batched float32 images (64 a batch, 12 MB; the dataset hands out whole
            batches, `batch_size=None`, so nothing copies them before the step) from
            pageable memory, no workers: the host-to-device copy is the only input work.
            Expected: verdict `transfer`, advice pin_memory and uint8_payload.
- uint8:    the same batches as uint8, normalized on the device: a quarter of the
            payload; expected: an isolated transfer under half of float32's.
- pinned:   float32 again with pin_memory=True: the copy overlaps (non_blocking);
            expected: a transfer cost below the unpinned one, no pin_memory advice.
- workers:  per-sample float32 images collated by 2 workers, pageable: each 12 MB batch
            crosses processes (shared memory) and then the bus; expected: `handoff` or
            `transfer` leads (what carries the batch), advice uint8_payload.
- items:    a step that calls .item() three times: expected sync count 3 per step.
- mutating: a step that changes its batch in place, with an optimizer whose state is
            on the CPU before the run: the points run (fresh copies on the device, the
            state moved and restored); expected: no point failed, the state back on CPU.
- tail:     FakeData PIL images through ToTensor + Normalize, 2 workers (issue 58 item 6):
            expected: the device tail built and matched on CUDA, its syncs counted, and
            measured by the advice's check (helps, no gain or slower: not "not measured").
- decode:   an ImageFolder of 256 JPEGs of 500x375 written here (RandomResizedCrop(128),
            flip, ToTensor, Normalize; 4 workers; issue 58 item 3): expected: decode built
            on the device (nvJPEG, `device` "cuda"), matched within a grey level, measured.

Prints, per case, the verdict, the transfer cost (ms per batch, bisection and isolated),
the sync count per step, and whether the expectation held. Exits 1 if one did not, 2
without CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bisect_pipeline import bisect

N, SIZE, BATCH = 1024, 128, 64


class Images(Dataset):
    def __init__(self, dtype: torch.dtype) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 256, (N, 3, SIZE, SIZE), dtype=torch.uint8, generator=g)
        self.dtype = dtype
        self.targets = torch.arange(N) % 10

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        x = self.data[i]
        return (x.float() / 255 if self.dtype == torch.float32 else x), int(self.targets[i])


class Batches(Dataset):
    """Whole batches of images, slices of one tensor in memory (a view each: no copy)."""

    def __init__(self, dtype: torch.dtype) -> None:
        base = Images(torch.uint8)
        self.data = base.data.float() / 255 if dtype == torch.float32 else base.data
        self.targets = base.targets

    def __len__(self) -> int:
        return N // BATCH

    def __getitem__(self, i: int):
        return self.data[i * BATCH:(i + 1) * BATCH], self.targets[i * BATCH:(i + 1) * BATCH]


def batched(dtype, pin):
    return DataLoader(Batches(dtype), batch_size=None, shuffle=True, num_workers=0, pin_memory=pin)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(256, 10))


def default_case(dtype, pin, step=None, optimizer=None):
    m = model()
    loader = DataLoader(Images(dtype), batch_size=BATCH, shuffle=True, num_workers=2, pin_memory=pin,
                        multiprocessing_context="fork")
    return m, loader, step, optimizer


def uint8_step(m):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def step(batch):
        x, y = batch
        x = x.float().div_(255)  # normalized on the device
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return step, opt


def items_step(m):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def step(batch):
        x, y = batch
        opt.zero_grad(set_to_none=True)
        out = m(x)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        for _ in range(3):
            loss.item()  # a host-device sync each
    return step, opt


def mutating_step(m):
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    m(torch.zeros(2, 3, SIZE, SIZE)).sum().backward()
    opt.step()  # momentum buffers on the CPU, before the model is moved

    def step(batch):
        x, y = batch
        x.mul_(0.5)  # in place: the cached batch must not be changed for good
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return step, opt


def fix_case(name: str) -> DataLoader:
    """The pipelines of the fixes' cases (torchvision's transforms on PIL images)."""
    from torchvision import datasets, transforms as T

    norm = T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    if name == "tail":
        ds = datasets.FakeData(N, (3, SIZE, SIZE), 10, transform=T.Compose([T.ToTensor(), norm]))
        return DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, multiprocessing_context="fork")
    import os
    import tempfile

    from PIL import Image
    root = os.path.join(tempfile.gettempdir(), "gpu_check_jpegs")
    g = torch.Generator().manual_seed(0)
    for i in range(256):
        path = os.path.join(root, f"c{i % 10}", f"{i}.jpg")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            small = torch.rand(1, 3, 12, 16, generator=g) * 255
            img = nn.functional.interpolate(small, size=(375, 500), mode="bilinear")[0] + \
                torch.randn(3, 375, 500, generator=g) * 8
            Image.fromarray(img.clamp(0, 255).byte().permute(1, 2, 0).numpy()).save(path, quality=90)
    tf = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    return DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=BATCH, shuffle=True, num_workers=4,
                      multiprocessing_context="fork")


def run_case(name: str, max_seconds: float) -> tuple:
    m, step, opt = model(), None, None
    if name in ("tail", "decode"):
        loader = fix_case(name)
    elif name in ("float32", "pinned"):
        loader = batched(torch.float32, name == "pinned")
    elif name == "uint8":
        step, opt = uint8_step(m)
        loader = batched(torch.uint8, False)
    elif name == "workers":
        m, loader, step, opt = default_case(torch.float32, False)
    elif name == "items":
        step, opt = items_step(m)
        loader = default_case(torch.float32, True)[1]
    else:
        step, opt = mutating_step(m)
        loader = default_case(torch.float32, True)[1]
    t0 = time.perf_counter()
    r = bisect(m, loader, step=step, optimizer=opt, device="cuda", max_seconds=max_seconds)
    transfer = r.stage("transfer")
    iso = r.to_dict()["isolated"].get("transfer") or {}  # the document's form
    out = {"case": name, "verdict": r.bottleneck, "wall_s": round(time.perf_counter() - t0, 1),
           "transfer_ms": None if transfer.sec_per_batch is None else round(transfer.sec_per_batch * 1e3, 2),
           "transfer_real": transfer.significant, "isolated_transfer_ms": iso.get("ms_per_batch"),
           "gb_per_s": iso.get("gb_per_s"), "syncs_per_step": r.syncs.per_step if r.syncs is not None else None,
           "advice": [a.kind for a in r.advice], "statuses": {p.point: p.status for p in r.points},
           "stages_ms": {st.stage: None if st.sec_per_batch is None else round(st.sec_per_batch * 1e3, 2)
                         for st in r.verdict.stages},
           "rates": {p.point: None if r.rate(p.point) is None else round(r.rate(p.point)) for p in r.points}}
    checked = r.verification.fixes if r.verification is not None else ()
    out["fixes"] = {f.kind: {"status": f.status, "matches": f.matches, "device": f.device, "reason": f.reason,
                             "mean_levels": None if f.level is None or f.mean_difference is None else
                             round(f.mean_difference / f.level, 3),
                             "syncs": (f.syncs or {}).get("per_step")} for f in checked or ()}
    out["checked"] = {a.kind: None if a.verified is None else
                      {"status": a.verified.status, "speedup": a.verified.speedup} for a in r.advice}
    if opt is not None and name == "mutating":
        out["state_on_cpu_after"] = all(v.device.type == "cpu" for st in opt.state.values() for v in st.values()
                                        if isinstance(v, torch.Tensor))
    return out, r.to_dict()


def expectations(rows: dict) -> list:
    """(case, what was expected, whether it held)."""
    out = []
    f = rows.get("float32")
    if f:
        out.append(("float32", "verdict transfer, pin_memory and uint8_payload advice",
                    f["verdict"] == "transfer" and {"pin_memory", "uint8_payload"} <= set(f["advice"])))
    if rows.get("workers"):
        w = rows["workers"]
        out.append(("workers", "handoff or transfer leads, uint8_payload advice",
                    w["verdict"] in ("handoff", "transfer") and "uint8_payload" in w["advice"]))
    if f and rows.get("uint8"):
        u = rows["uint8"]
        out.append(("uint8", "isolated transfer < 1/2 of float32's",
                    (u["isolated_transfer_ms"] or 1e9) < 0.5 * (f["isolated_transfer_ms"] or 0)))
    if f and rows.get("pinned"):
        p = rows["pinned"]
        out.append(("pinned", "transfer below the unpinned one, no pin_memory advice",
                    (p["transfer_ms"] or 0) < (f["transfer_ms"] or 0) and "pin_memory" not in p["advice"]))
    if rows.get("items"):
        out.append(("items", "3 syncs per step", rows["items"]["syncs_per_step"] is not None
                    and rows["items"]["syncs_per_step"] >= 3))
    if rows.get("mutating"):
        m = rows["mutating"]
        out.append(("mutating", "no point failed, optimizer state back on the CPU",
                    all(s in ("ok", "skipped", "unavailable") for s in m["statuses"].values())
                    and m.get("state_on_cpu_after")))
    for name, kind, on in (("tail", "device_tail", None), ("decode", "decode", "cuda")):
        row = rows.get(name)
        if row:
            fix = row["fixes"].get(kind) or {}
            checked = row["checked"].get(kind) or {}
            out.append((name, f"{kind} built and matched{' on ' + on if on else ''}, measured by the check",
                        fix.get("status") == "ok" and bool(fix.get("matches")) and (on is None or fix.get("device") == on)
                        and checked.get("status") in ("helps", "no gain", "slower")))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="float32,uint8,pinned,workers,items,mutating")
    ap.add_argument("--max-seconds", type=float, default=40.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check.", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    rows, reports = {}, {}
    for name in args.cases.split(","):
        rows[name], reports[name] = run_case(name, args.max_seconds)
        r = rows[name]
        print(f"{name:9s} verdict {r['verdict']!s:12s} transfer {r['transfer_ms']} ms (real {r['transfer_real']}), "
              f"isolated {r['isolated_transfer_ms']} ms at {r['gb_per_s']} GB/s, syncs/step {r['syncs_per_step']}, "
              f"advice {r['advice']}, wall {r['wall_s']} s\n          stages (ms/batch) {r['stages_ms']}  "
              f"samples/s {r['rates']}  statuses {r['statuses']}\n          fixes {r['fixes']}  "
              f"checked {r['checked']}", flush=True)
    checks = expectations(rows)
    for case, what, ok in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {case}: {what}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                       "checks": checks, "reports": reports}, f, indent=2)
    return 0 if all(ok for _, _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
