"""The change written against the user's script (patch.py).

Each form of `DataLoader(...)` call gets a diff that `git apply --check` accepts on a copy
of the script; the patched script, run, builds a loader with the new settings; every line
the diff does not touch is byte for byte the original's. A value from the script's
argparse parser gets its flag instead of a diff.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from torch.utils.data import DataLoader

from bisect_pipeline.advise import patch

NEW = {"num_workers": 1, "persistent_workers": True}


def line_of(source: str, marker: str) -> int:
    """The line of the source holding `marker` (where the frame says the loader was made)."""
    return next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)


def apply(tmp_path, source: str, p: patch.Patch, name: str = "train.py") -> str:
    """The patched text, through `git apply` on a copy: the diff must apply cleanly."""
    work = tmp_path / "copy"
    work.mkdir(exist_ok=True)
    (work / name).write_bytes(source.encode())
    (tmp_path / "p.diff").write_text(p.diff)
    check = subprocess.run(["git", "apply", "--check", str(tmp_path / "p.diff")], cwd=work, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr + p.diff
    subprocess.run(["git", "apply", str(tmp_path / "p.diff")], cwd=work, check=True)
    return (work / name).read_bytes().decode()


def built_loader(source: str, func: str = "make") -> DataLoader:
    """The loader the (patched) script builds, by calling `func` in it."""
    namespace: dict = {"__name__": "patched"}
    exec(compile(source, "train.py", "exec"), namespace)
    return namespace[func]()


def untouched_lines_kept(before: str, after: str, diff: str) -> None:
    """Every line the diff does not remove is in the patched text, in order, byte for byte."""
    removed = {ln[1:] for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")}
    kept = [ln for ln in before.splitlines(keepends=True) if ln.rstrip("\r\n") not in removed]
    it = iter(after.splitlines(keepends=True))
    assert all(any(k == a for a in it) for k in kept)


FORMS = {
    "positional dataset, one line": ('''
        import torch
        def make():
            ds = list(range(8))
            return torch.utils.data.DataLoader(ds, batch_size=2, num_workers=0)
        ''', "DataLoader(ds"),
    "keywords over several lines": ('''
        from torch.utils.data import DataLoader
        def make():
            ds = list(range(8))
            loader = DataLoader(
                ds,
                batch_size=2,
                shuffle=True,
            )
            return loader
        ''', "loader = DataLoader("),
    "several lines, no trailing comma": ('''
        from torch.utils.data import DataLoader
        def make():
            ds = list(range(8))
            loader = DataLoader(
                ds,
                batch_size=2)
            return loader
        ''', "loader = DataLoader("),
    "**kwargs": ('''
        from torch.utils.data import DataLoader
        def make():
            kwargs = {"batch_size": 2}
            return DataLoader(list(range(8)), **kwargs)
        ''', "return DataLoader"),
    "a subclass": ('''
        from torch.utils.data import DataLoader
        class MyLoader(DataLoader):
            pass
        def make():
            return MyLoader(list(range(8)), batch_size=2,  # comment kept
                            num_workers=2)
        ''', "return MyLoader"),
    "super().__init__ of a subclass": ('''
        from torch.utils.data import DataLoader
        class MyLoader(DataLoader):
            def __init__(self, ds, **kw):
                super().__init__(ds, **kw)
        def make():
            return MyLoader(list(range(8)), batch_size=2)
        ''', "super().__init__"),
    "a call inside a nested function": ('''
        import torch
        def make():
            def build(ds):
                return torch.utils.data.DataLoader(ds, 2)
            return build(list(range(8)))
        ''', "return torch.utils"),
    "no argument after the dataset, in a method": ('''
        import torch.utils.data as tud
        class Data:
            def loader(self):
                return tud.DataLoader(list(range(8)))
        def make():
            return Data().loader()
        ''', "return tud.DataLoader"),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_gets_a_diff_that_applies_and_builds_the_loader_with_the_settings(tmp_path, form):
    code, marker = FORMS[form]
    source = textwrap.dedent(code).lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, marker), settings=NEW)
    assert p.reason is None and not p.flags and p.diff.startswith("--- a/train.py\n+++ b/train.py\n")
    after = apply(tmp_path, source, p)
    loader = built_loader(after)
    assert (loader.num_workers, loader.persistent_workers) == (1, True)
    assert (loader.batch_size, len(loader.dataset)) == (built_loader(source).batch_size, 8)  # the rest as it was
    untouched_lines_kept(source, after, p.diff)
    assert {c.how for c in p.changes} == {"keyword"}


def test_keywords_added_one_per_line_keep_the_calls_style():
    source = textwrap.dedent(FORMS["keywords over several lines"][0]).lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, "loader = DataLoader("), settings=NEW)
    assert "         shuffle=True,\n+        num_workers=1,\n+        persistent_workers=True,\n     )" in p.diff
    one = textwrap.dedent(FORMS["positional dataset, one line"][0]).lstrip()
    p = patch.make(one, path="train.py", line=line_of(one, "DataLoader(ds"), settings=NEW)
    assert "+    return torch.utils.data.DataLoader(ds, batch_size=2, num_workers=1, persistent_workers=True)" in p.diff


def test_a_kwargs_dict_written_in_the_scope_is_changed_where_the_key_is(tmp_path):
    source = textwrap.dedent('''
        from torch.utils.data import DataLoader
        def make():
            kwargs = {"batch_size": 2, "num_workers": 3}
            kwargs.update(dict(persistent_workers=False))
            return DataLoader(list(range(8)), **kwargs)
        ''').lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, "return DataLoader"), settings=NEW,
                   current={"num_workers": 3, "persistent_workers": False})
    assert p.diff.endswith('-    kwargs = {"batch_size": 2, "num_workers": 3}\n'
                           '-    kwargs.update(dict(persistent_workers=False))\n'
                           '+    kwargs = {"batch_size": 2, "num_workers": 1}\n'
                           '+    kwargs.update(dict(persistent_workers=True))\n'
                           '     return DataLoader(list(range(8)), **kwargs)\n')
    loader = built_loader(apply(tmp_path, source, p))
    assert (loader.num_workers, loader.persistent_workers) == (1, True)


def test_a_dict_key_that_is_not_in_effect_is_overridden_at_the_call(tmp_path):
    # the pytorch/examples MNIST form: workers in a dict merged only on an accelerator
    source = textwrap.dedent('''
        from torch.utils.data import DataLoader
        def make(accel=False):
            train_kwargs = {"batch_size": 2}
            if accel:
                accel_kwargs = {"num_workers": 4, "persistent_workers": True}
                train_kwargs.update(accel_kwargs)
            return DataLoader(list(range(8)), **train_kwargs)
        ''').lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, "return DataLoader"), settings=NEW,
                   current={"num_workers": 0, "persistent_workers": False})
    assert "**dict(train_kwargs, num_workers=1, persistent_workers=True)" in p.diff
    loader = built_loader(apply(tmp_path, source, p))
    assert (loader.num_workers, loader.persistent_workers) == (1, True)


ARGPARSE = '''
    import argparse
    import torch
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("-j", "--workers", default=0, type=int)
    parser.add_argument("--j", dest="j", type=int, default=2)
    parser.add_argument("--pin-mem", action="store_true")
    parser.add_argument("--persistent", action=argparse.BooleanOptionalAction, default=False)

    def make():
        args = parser.parse_args(["x"])
        return torch.utils.data.DataLoader(list(range(8)), batch_size=2,
                                           num_workers={value}, pin_memory=args.pin_mem,
                                           persistent_workers=args.persistent)
    '''


@pytest.mark.parametrize("value, flag, rerun", [
    ("args.workers", ("-j", "1"), "python train.py data -j 1 --persistent --pin-mem"),
    ("args.j", ("--j", "1"), "python train.py data -j 4 --j 1 --persistent --pin-mem"),
    ("int(args.workers)", ("-j", "1"), "python train.py data -j 1 --persistent --pin-mem")])
def test_a_value_from_the_scripts_argparse_gets_its_flag_not_a_diff(value, flag, rerun):
    source = textwrap.dedent(ARGPARSE.replace("{value}", value)).lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, "DataLoader("),
                   settings={"num_workers": 1, "pin_memory": True, "persistent_workers": True})
    assert p.diff == ""
    assert p.flags == flag + ("--persistent", "--pin-mem")
    workers = next(c for c in p.changes if c.setting == "num_workers")
    assert workers.how == "flag" and workers.text.endswith(f"rerun with {' '.join(flag)}")
    assert p.command(["train.py", "data", "-j", "4"]) == rerun


def test_the_flag_replaces_every_spelling_of_it_in_the_command_line():
    source = textwrap.dedent(ARGPARSE.replace("{value}", "args.workers")).lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, "DataLoader("),
                   settings={"num_workers": 1, "persistent_workers": False})
    for argv in (["t.py", "d", "-j", "4"], ["t.py", "d", "-j4"], ["t.py", "--workers=4", "d"],
                 ["t.py", "--workers", "4", "d", "--persistent"]):
        assert patch.with_flags(argv, p.changes)[1:] in (["d", "-j", "1", "--no-persistent"],)
    assert patch.with_flags(["t.py", "d", "--pin-mem"], p.changes) == ["t.py", "d", "--pin-mem", "-j", "1",
                                                                     "--no-persistent"]


def test_a_store_true_flag_cannot_turn_a_setting_off_so_the_expression_is_replaced(tmp_path):
    source = textwrap.dedent(ARGPARSE.replace("{value}", "args.workers")).lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, "DataLoader("), settings={"pin_memory": False})
    assert p.flags == () and p.diff.endswith(
        "-                                       num_workers=args.workers, pin_memory=args.pin_mem,\n"
        "+                                       num_workers=args.workers, pin_memory=False,\n"
        "                                        persistent_workers=args.persistent)\n")
    assert built_loader(apply(tmp_path, source, p)).pin_memory is False


def test_the_threads_go_at_the_top_of_main_with_torch_imported(tmp_path):
    source = textwrap.dedent('''
        from torch.utils.data import DataLoader


        def main():
            """Train."""
            loader = DataLoader(list(range(8)), batch_size=2)
            return loader
        ''').lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, "DataLoader(list"), settings={"torch_num_threads": 1})
    assert '     """Train."""\n+    import torch\n+    torch.set_num_threads(1)\n     loader = DataLoader' in p.diff
    after = apply(tmp_path, source, p)
    import torch

    before = torch.get_num_threads()
    try:
        built_loader(after, "main")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_set_num_threads_already_there_is_changed_and_without_main_the_line_follows_the_imports():
    there = "import torch\ntorch.set_num_threads(4)\nloader = torch.utils.data.DataLoader([1])\n"
    p = patch.make(there, path="t.py", line=3, settings={"torch_num_threads": 1})
    assert "-torch.set_num_threads(4)\n+torch.set_num_threads(1)\n" in p.diff
    none = '"""Doc."""\nimport torch as th\nloader = th.utils.data.DataLoader([1])\n'
    p = patch.make(none, path="t.py", line=3, settings={"torch_num_threads": 2})
    assert " import torch as th\n+th.set_num_threads(2)\n loader" in p.diff


def test_a_hugging_face_trainer_gets_its_training_arguments():
    source = textwrap.dedent('''
        from transformers import Trainer, TrainingArguments
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8,
                                 dataloader_num_workers=0)
        trainer = Trainer(model=None, args=args)
        trainer.train()
        ''').lstrip()
    p = patch.make(source, path="t.py", line=line_of(source, "trainer.train()"), settings=NEW)
    assert p.diff.endswith("-                         dataloader_num_workers=0)\n"
                           "+                         dataloader_num_workers=1,\n"
                           "+                         dataloader_persistent_workers=True)\n"
                           " trainer = Trainer(model=None, args=args)\n trainer.train()\n")
    parsed = "from transformers import HfArgumentParser, TrainingArguments\n" \
             "(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\ntrainer.train()\n"
    p = patch.make(parsed, path="t.py", line=3, settings={"num_workers": 2})
    assert p.diff == "" and p.flags == ("--dataloader_num_workers", "2")


def test_a_lightning_datamodule_gets_the_argument_of_the_call_that_builds_it(tmp_path):
    source = textwrap.dedent('''
        import argparse
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--workers", type=int, default=2)

        class Data:  # a LightningDataModule
            def __init__(self, batch_size=2, workers=4):
                self.num_workers = workers
            def train_dataloader(self):
                return torch.utils.data.DataLoader(list(range(8)), num_workers=self.num_workers)

        def make(argv=()):
            args = parser.parse_args(list(argv))
            return Data(batch_size=2).train_dataloader()
        ''').lstrip()
    p = patch.make(source, path="train.py", line=line_of(source, "return torch.utils"), settings={"num_workers": 1})
    assert ("-    return Data(batch_size=2).train_dataloader()\n"
            "+    return Data(batch_size=2, workers=1).train_dataloader()") in p.diff
    assert built_loader(apply(tmp_path, source, p)).num_workers == 1
    flagged = source.replace("Data(batch_size=2)", "Data(batch_size=2, workers=args.workers)")
    p = patch.make(flagged, path="train.py", line=line_of(flagged, "return torch.utils"), settings={"num_workers": 1})
    assert p.diff == "" and p.flags == ("--workers", "1")
    cli = source.replace("return Data(batch_size=2).train_dataloader()", "LightningCLI(None, Data)").replace(
        "class Data:", "class Data(LightningDataModule):")
    p = patch.make(cli, path="train.py", line=line_of(cli, "return torch.utils"), settings={"num_workers": 1})
    assert p.flags == ("--data.workers", "1")


def test_unicode_and_crlf_lines_are_kept_byte_for_byte(tmp_path):
    source = ("# -*- coding: utf-8 -*-\r\nimport torch\r\ndef make():\r\n"
              "    name = 'données'; return torch.utils.data.DataLoader(list(range(8)), batch_size=2)\r\n")
    p = patch.make(source, path="train.py", line=4, settings=NEW)
    after = apply(tmp_path, source, p)
    assert after == source.replace("batch_size=2)", "batch_size=2, num_workers=1, persistent_workers=True)")


def test_what_cannot_be_patched_says_why():
    assert "could not be parsed" in patch.make("def (:\n", path="t.py", line=1, settings=NEW).reason
    p = patch.make("x = 1\n", path="t.py", line=1, settings=NEW)
    assert p.empty and p.reason == "no call at t.py:1"
    p = patch.make("import torch\n", path="t.py", line=None, settings=NEW)
    assert p.reason == "where the loader was created is not known"
    # a library's factory: its keywords changed, none added that it may not take
    factory = "from timm.data import create_loader\nloader = create_loader(ds, batch_size=2, num_workers=4)\n"
    p = patch.make(factory, path="t.py", line=2, settings={"num_workers": 1, "prefetch_factor": 4})
    assert "num_workers=1)" in p.diff and "prefetch_factor" not in p.diff
    assert [c.how for c in p.changes] == ["keyword", "not applied"]
    assert "create_loader(...) does not show prefetch_factor" in p.changes[1].text


def test_a_setting_already_as_asked_is_unchanged_and_env_is_a_prefix():
    source = "import torch\nloader = torch.utils.data.DataLoader([1], num_workers=1)\n"
    p = patch.make(source, path="t.py", line=2, settings={"num_workers": 1, "env": {"MALLOC_TRIM_THRESHOLD_": "-1"}})
    assert p.diff == "" and [c.how for c in p.changes] == ["unchanged", "env"]
    assert p.command(["t.py", "--epochs", "3"]) == "MALLOC_TRIM_THRESHOLD_=-1 python t.py --epochs 3"

