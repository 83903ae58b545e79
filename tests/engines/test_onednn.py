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


@pytest.mark.slow
def test_the_bundled_embedder_loads_set_up_for_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default a user gets: the embedder's linear layers packed, torch on all CPUs but one, the same vectors."""
    from flyteplugins_batcher.engines import EmbeddingModel
    from flyteplugins_batcher.engines._cpu_threads import usable_cpus

    if torch.cuda.is_available():
        pytest.skip("on a GPU the embedder is left as it is")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        model = EmbeddingModel().load()
        packed = [module for module in model.modules() if "forward" in vars(module)]
        assert packed and all(type(module) is torch.nn.Linear for module in packed)
        assert torch.get_num_threads() <= max(1, usable_cpus() - 1)
        [vector] = model.encode(["a small feline"], normalize_embeddings=True, convert_to_tensor=True)
        for module in packed:
            del module.forward  # PyTorch's own layers again
        [expected] = model.encode(["a small feline"], normalize_embeddings=True, convert_to_tensor=True)
        prepack_linears(model)  # as the process's shared embedder was loaded
    finally:
        torch.set_num_threads(before)
    assert torch.allclose(vector, expected, atol=1e-5)
