"""Lightning's Trainer.fit and Hugging Face's Trainer.train diagnosed with no callback and
no change: under `bisect-pipeline run` (a script) and under `watching()` (in Python). Tiny
models, an augmentation planted at many times every other stage."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from conftest import PLANTED_DATA, assert_names

pytestmark = pytest.mark.e2e

TESTS = os.path.dirname(os.path.abspath(__file__))

COMMON = PLANTED_DATA + textwrap.dedent('''
    from torch import nn
''')

LIGHTNING = COMMON + textwrap.dedent('''
    import lightning as L
    from torch.utils.data import DataLoader

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss
        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)
        def train_dataloader(self):
            return DataLoader(Data(240, 4.0), batch_size=8, shuffle=True)
        def val_dataloader(self):
            return DataLoader(Data(16, 0.0), batch_size=8)

    def fit():
        torch.set_num_threads(1)
        trainer = L.Trainer(max_epochs=500, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Module())

    if __name__ == "__main__":
        fit()
''')

HF = COMMON + textwrap.dedent('''
    from transformers import Trainer, TrainingArguments

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        def forward(self, x, labels=None):
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    def train(out):
        torch.set_num_threads(1)
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, num_train_epochs=500, use_cpu=True,
                                 report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                 dataloader_num_workers=0, gradient_accumulation_steps=2)
        Trainer(model=Model(), args=args, train_dataset=Data(240, 4.0, dicts=True)).train()

    if __name__ == "__main__":
        import sys
        train(sys.argv[1])
''')


def run_script(tmp_path, text: str, *args) -> tuple:
    """`bisect-pipeline run` on `text` in this process (click's runner): the script runs
    as in a fresh interpreter, without starting one and importing the framework again."""
    from click.testing import CliRunner

    from bisect_pipeline.cli import main

    (tmp_path / "train.py").write_text(text)
    out = tmp_path / "r.json"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        r = CliRunner().invoke(main, ["run", "--json", str(out), "--max-seconds", "30", "--verify-seconds", "0",
                                      "train.py", *args])
    finally:
        os.chdir(cwd)
    assert out.exists(), r.stderr[-3000:]
    return r, json.loads(out.read_text())


def module(tmp_path, text: str):
    import importlib.util

    (tmp_path / "mod.py").write_text(text)
    spec = importlib.util.spec_from_file_location("watched_mod", tmp_path / "mod.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["watched_mod"] = mod  # its classes pickle for workers
    spec.loader.exec_module(mod)
    return mod


def test_lightning_trainer_fit_under_run_and_watching(tmp_path):
    pytest.importorskip("lightning")
    r, doc = run_script(tmp_path, LIGHTNING)
    assert r.exit_code == 0, r.stderr[-3000:]
    assert_names(doc, "augment")
    assert doc["source"]["dataset"] == "Data" and len(doc["source"]["loaders"]) >= 2  # the validation loader too
    from bisect_pipeline import watching

    mod = module(tmp_path, LIGHTNING)
    with watching(max_seconds=30, verify_seconds=0) as s:
        mod.fit()
    assert_names(s.report, "augment")


def test_hugging_face_trainer_train_under_run_and_watching(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    r, doc = run_script(tmp_path, HF, str(tmp_path / "hf_out"))
    assert r.exit_code == 0, r.stderr[-3000:]
    assert_names(doc, "augment")
    from bisect_pipeline import watching

    mod = module(tmp_path, HF)
    with watching(max_seconds=30, verify_seconds=0) as s:
        mod.train(str(tmp_path / "hf_out2"))
    assert_names(s.report, "augment")
