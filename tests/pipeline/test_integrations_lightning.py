"""Lightning end to end through the CLI: an entry file returns a LightningModule with a
LightningDataModule, or a module with its own train_dataloader(). The step is the
module's training_step with the optimizer of configure_optimizers, run without a
Trainer (zero_grad, training_step, backward, optimizer.step)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from bisect_pipeline import BisectError, bisect
from conftest import FAST_PLAN, all_measured, assert_names, cli_in_process, expected_statuses

pytestmark = pytest.mark.e2e  # end to end on real loaders: not in the fast subset

L = pytest.importorskip("lightning")

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENTRY = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    from torch import nn
    from torch.utils.data import DataLoader
    import lightning as L
    from conftest import CLASSES, FEATURES, LONG_EPOCHS, PlantedDataset, Sleep, SleepLayer

    class Module(L.LightningModule):
        def __init__(self, augment_ms=0.0):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(SleepLayer(2.0), nn.Linear(FEATURES, CLASSES))
            self.augment_ms = augment_ms
            self.seen_dtypes = set()

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen_dtypes.add(x.dtype)
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return {{"loss": loss}}

        def on_after_batch_transfer(self, batch, dataloader_idx):
            x, y = batch  # the loader yields float64 inputs: the module converts them on the device
            return x.float(), y

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            return {{"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}}

        def train_dataloader(self):
            ds = PlantedDataset(transform=Sleep(self.augment_ms))
            ds.data = ds.data.double()
            return DataLoader(ds, batch_size=8, shuffle=True)

    class Data(L.LightningDataModule):
        def __init__(self, load_ms):
            super().__init__()
            self.load_ms = load_ms

        def setup(self, stage):
            self.train = PlantedDataset(n=LONG_EPOCHS, load_ms=self.load_ms, transform=Sleep(0.0))
            self.train.data = self.train.data.double()

        def train_dataloader(self):
            return DataLoader(self.train, batch_size=8, shuffle=True, num_workers=2,
                              multiprocessing_context="fork")

    def module_and_datamodule():
        return Module(), Data(load_ms=10.0)

    def module_alone():
        return Module(augment_ms=6.0)
""")



def cli(tmp_path, func, *args):
    entry = tmp_path / "lit_entry.py"
    entry.write_text(ENTRY.format(tests=TESTS))
    out = tmp_path / "result.json"
    r = cli_in_process("--entry", f"{entry}:{func}", "--json", str(out), "--max-seconds", "20", "--verify-seconds",
                       "0", "--device", "cpu", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), r




def test_module_with_datamodule_from_the_cli(tmp_path):
    doc, r = cli(tmp_path, "module_and_datamodule")
    assert {p["point"]: p["status"] for p in doc["points"]} == expected_statuses(doc["loader"], doc["device"]), r.stdout
    assert_names(doc, "load", r.stdout)
    assert doc["loader"]["num_workers"] == 2  # the datamodule's train_dataloader(), set up for "fit"


def _module_class(tmp_path):
    import importlib.util

    path = tmp_path / "lit_mod.py"
    path.write_text(ENTRY.format(tests=TESTS))
    spec = importlib.util.spec_from_file_location("lit_mod", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_module_alone_brings_its_train_dataloader_and_is_restored(tmp_path):
    mod = _module_class(tmp_path)
    module = mod.Module(augment_ms=6.0)
    module.eval()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    report = bisect(module, device="cpu", max_seconds=8, plan=FAST_PLAN, verify_seconds=0)  # no loader: train_dataloader()
    assert {p.point: p.status for p in report.points} == all_measured(report), str(report)
    assert_names(report, "augment")
    assert module.seen_dtypes == {torch.float32}  # on_after_batch_transfer ran before training_step
    assert not module.training  # the train flag the step set is undone
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_manual_optimization_asks_for_a_step(tmp_path):
    mod = _module_class(tmp_path)
    module = mod.Module()
    module.automatic_optimization = False
    with pytest.raises(BisectError, match="manual optimization"):
        bisect(module, module.train_dataloader(), device="cpu", max_seconds=6, plan=FAST_PLAN, verify_seconds=0)
