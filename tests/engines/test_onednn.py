"""An encoder's linear layers on oneDNN's prepacked kernel: the same answers as PyTorch's own, and the switch."""

from __future__ import annotations

import pytest
import torch

from flyteplugins_batcher.engines._onednn import SWITCH, prepack_linears

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16, bias=False), torch.nn.LayerNorm(16)
    ).eval()


@pytest.mark.parametrize("shape", [(3, 7, 32), (1, 1, 32), (40, 32)])
def test_packed_layers_answer_what_pytorchs_do(shape: tuple[int, ...]) -> None:
    plain, packed = encoder(), encoder()
    assert prepack_linears(packed) == 2
    inputs = torch.randn(*shape)
    with torch.inference_mode():
        expected, answered = plain(inputs), packed(inputs)
    assert answered.shape == expected.shape
    assert torch.allclose(answered, expected, atol=1e-5)
    assert packed.state_dict().keys() == plain.state_dict().keys()  # the weights stay where they were


def test_other_dtypes_are_left_alone() -> None:
    model = encoder().to(torch.float64)
    assert prepack_linears(model) == 0
    assert model(torch.randn(2, 32, dtype=torch.float64)).dtype == torch.float64


def test_the_switch_keeps_pytorchs_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "0")
    model = encoder()
    assert prepack_linears(model) == 0
    assert "forward" not in vars(model[0])  # the class's own forward
