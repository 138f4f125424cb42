"""The device tail written against the user's script (patch_tail.py, through patch.make).

The pytorch/examples MNIST script's shape (its Compose list, its train and test loops, its
`data.to(device)`), over FakeData: the diff applies with `git apply`, splits the list
where it is built, applies the tail in both loops, and the patched script prints the same
losses as the original (ToTensor's scaling and Normalize on the batch are the same
arithmetic). Shapes it cannot rewrite safely say why and write nothing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from bisect_pipeline.advise import patch, patch_tail
from test_patch import apply, untouched_lines_kept

FIX = {"moved": ("ToTensor's scaling", "Normalize"), "kept": ("PILToTensor",), "path": "[0]"}
TAIL = {"fix": "device_tail"}

MNIST = textwrap.dedent('''\
    import argparse
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.optim as optim
    from torchvision import datasets, transforms


    class Net(nn.Module):
        def __init__(self):
            super(Net, self).__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, 1)
            self.fc1 = nn.Linear(8 * 13 * 13, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            return F.log_softmax(self.fc1(torch.flatten(x, 1)), dim=1)


    def train(args, model, device, train_loader, optimizer, epoch):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            print('Train Epoch: {} [{}]\\tLoss: {:.8f}'.format(epoch, batch_idx, loss.item()))


    def test(model, device, test_loader):
        model.eval()
        test_loss = 0
        with torch.no_grad():
            for data, target in test_loader:
                data, target = data.to(device), target.to(device)
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
        print('Test set: Average loss: {:.8f}'.format(test_loss / len(test_loader.dataset)))


    def main():
        parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
        parser.add_argument('--batch-size', type=int, default=16, metavar='N')
        args = parser.parse_args()
        torch.manual_seed(1)
        device = torch.device("cpu")
        train_kwargs = {'batch_size': args.batch_size}
        test_kwargs = {'batch_size': 32}

        transform=transforms.Compose([
            transforms.ToTensor(),
            transforms.Normalize((0.1307,), (0.3081,))
            ])
        dataset1 = datasets.FakeData(64, (1, 28, 28), 10, transform=transform)
        dataset2 = datasets.FakeData(32, (1, 28, 28), 10, transform=transform, random_offset=7)
        train_loader = torch.utils.data.DataLoader(dataset1,**train_kwargs)
        test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)

        model = Net().to(device)
        optimizer = optim.Adadelta(model.parameters(), lr=1.0)
        train(args, model, device, train_loader, optimizer, 1)
        test(model, device, test_loader)


    if __name__ == '__main__':
        main()
''')


def make(source: str, fix: dict = FIX) -> patch.Patch:
    return patch.make(source, path="main.py", line=None, settings=TAIL, fix=fix)


def run(tmp_path, name: str, source: str) -> str:
    (tmp_path / name).write_text(source)
    out = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_mnist_example_gets_its_list_split_and_the_tail_in_both_loops(tmp_path):
    p = make(MNIST)
    (change,) = p.changes
    assert change.how == "lines" and not p.reason
    after = apply(tmp_path, MNIST, p, name="main.py")
    untouched_lines_kept(MNIST, after, p.diff)
    assert "transforms.PILToTensor()\n        ])" in after and "transforms.Normalize((0.1307,), (0.3081,))\n        ])" \
        not in after
    assert ("device_tail = transforms.Compose([transforms.ConvertImageDtype(torch.float32), "
            "transforms.Normalize((0.1307,), (0.3081,))])") in after
    assert after.count("data, target = device_tail(data.to(device)), target.to(device)") == 2  # train and test
    assert "(lines 23, 37)" in change.text and "split at line 52" in change.text


def test_the_patched_mnist_script_prints_the_original_s_losses(tmp_path):
    p = make(MNIST)
    after = apply(tmp_path, MNIST, p, name="main.py")
    before_out = run(tmp_path, "original.py", MNIST)
    assert "Test set: Average loss:" in before_out
    assert run(tmp_path, "patched.py", after) == before_out


def test_shapes_it_cannot_rewrite_safely_say_why_and_write_nothing():
    two = MNIST.replace("dataset2 = datasets.FakeData(32, (1, 28, 28), 10, transform=transform",
                        "dataset2 = datasets.FakeData(32, (1, 28, 28), 10, transform=transforms.Compose(["
                        "transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])")
    named = MNIST.replace("transforms.Normalize((0.1307,), (0.3081,))\n", "transforms.Normalize(args.mean, args.std)\n")
    batch = MNIST.replace("data, target = data.to(device), target.to(device)", "data, target = data.cuda(), target")
    for source, why in ((two, "2 Compose([...]) list(s)"), (named, "takes names the top of the module does not know"),
                        (batch, "no training loop moves its batch")):
        p = make(source)
        assert p.diff == "" and p.changes[0].how == "not applied" and why in p.reason, p.reason
    p = make(MNIST, fix=dict(FIX, path="['image']"))
    assert p.diff == "" and "only a batch's first part" in p.reason


def test_a_v2_tail_keeps_its_dtype_from_the_imports(tmp_path):
    v2 = MNIST.replace("from torchvision import datasets, transforms",
                       "from torchvision import datasets\nfrom torchvision.transforms import v2 as transforms")
    v2 = v2.replace("transforms.ToTensor(),", "transforms.ToImage(),\n        transforms.ToDtype(torch.float32, scale=True),")
    p = make(v2, fix={"moved": ("ToDtype", "Normalize"), "kept": ("ToImage",), "path": "[0]"})
    after = apply(tmp_path, v2, p, name="main.py")
    assert ("device_tail = transforms.Compose([transforms.ToDtype(torch.float32, scale=True), "
            "transforms.Normalize((0.1307,), (0.3081,))])") in after
    assert "transforms.ToImage()\n        ])" in after  # kept as written: no PILToTensor where ToTensor was not split
    assert run(tmp_path, "patched.py", after) == run(tmp_path, "original.py", v2)


def test_the_user_s_transforms_are_read_back_from_the_fix():
    assert patch_tail.originals(FIX) == ["ToTensor", "Normalize"]
    assert patch_tail.originals({"moved": ("ToDtype", "Normalize"), "kept": ("ToImage", "RandomResizedCrop")}) == [
        "ToImage", "RandomResizedCrop", "ToDtype", "Normalize"]
