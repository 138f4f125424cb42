"""The user's state as it was after the run (state.py): parameters, buffers, grads,
train flags, optimizer state, RNGs and threads, whatever happened; the optimizer's
state follows its parameters to the device for the run."""

import random

import numpy as np
import pytest
import torch
from torch import nn

from bisect_pipeline import bisect
from bisect_pipeline.pipeline import state
from conftest import planted

CUDA = torch.cuda.is_available()


def _stepped():
    model = nn.Linear(4, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(model.parameters())
    for opt in (sgd, adam):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
    return model, sgd, adam


def test_an_optimizers_state_already_with_its_parameters_is_left_as_it_is():
    model, sgd, adam = _stepped()
    keep = {id(v) for opt in (sgd, adam) for st in opt.state.values() for v in st.values()}
    for opt in (sgd, adam):
        state._move_optimizer_state(opt)
    assert keep == {id(v) for opt in (sgd, adam) for st in opt.state.values() for v in st.values()}


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_optimizers_state_follows_its_parameters_and_counters_stay():
    model, sgd, adam = _stepped()
    model.to("cuda")  # the same Parameter objects, now on CUDA; the state stays on the CPU
    for opt in (sgd, adam):
        state._move_optimizer_state(opt)
    w = model.weight
    assert sgd.state[w]["momentum_buffer"].is_cuda
    assert adam.state[w]["exp_avg"].is_cuda and adam.state[w]["exp_avg_sq"].is_cuda
    assert not adam.state[w]["step"].is_cuda  # a 0-d counter: where non-capturable Adam needs it


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_on_cuda_an_optimizer_with_cpu_state_trains_and_is_restored():
    model, loader = planted("augment", 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.ones(8, 16)).sum().backward()
    opt.step()  # momentum buffers on the CPU
    before = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    report = bisect(model, loader, optimizer=opt, device="cuda", max_seconds=20)
    assert report.point("device").status == "ok", str(report)
    after = opt.state_dict()["state"][0]
    assert all(torch.equal(after[k].cpu(), v) and after[k].device.type == "cpu" for k, v in before.items())


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_cuda_rng_is_restored_even_when_cuda_was_not_initialised_first():
    # (run in a fresh process would be exact; here: the states as the run found them)
    model, loader = planted("augment", 0)
    before = torch.cuda.get_rng_state_all()
    bisect(model, loader, device=f"cuda:{torch.cuda.device_count() - 1}", max_seconds=10)
    assert all(torch.equal(a, b) for a, b in zip(before, torch.cuda.get_rng_state_all()))


def test_preserved_puts_everything_back_even_after_an_error():
    model, sgd, _ = _stepped()
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    opt_before = {k: v["momentum_buffer"].clone() for k, v in sgd.state.items()}
    torch.manual_seed(5)
    np.random.seed(6)
    random.seed(7)
    rng = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="in the run"):
        with state.preserved(model, sgd):
            model.train()
            for _ in range(3):
                model(torch.randn(5, 4)).sum().backward()
                sgd.step()
            torch.rand(3), np.random.rand(3), random.random()
            torch.set_num_threads(threads + 1)
            raise RuntimeError("in the run")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert all(torch.equal(sgd.state[p]["momentum_buffer"], b) for p, b in opt_before.items())
    assert not model.training
    assert torch.equal(torch.get_rng_state(), rng[0]) and np.array_equal(np.random.get_state()[1], rng[1])
    assert random.getstate() == rng[2] and torch.get_num_threads() == threads
