"""An encoder on the CPU: torch's threads as vLLM's CPU build sizes them, and its linear layers on oneDNN's
prepacked kernel (`encoder_on_cpu`, where the embedder and the Transformers cross-encoder load).

A small encoder (all-MiniLM-L6-v2, a cross-encoder) spends about three quarters of its CPU forward
pass in its linear layers (`aten::addmm`). PyTorch's CPU wheels run a float32 `addmm` on MKL, which is
tuned for Intel processors: on an AMD EPYC (this project's machine) it took about twice as long as
oneDNN's kernel over the same weights, reordered once into oneDNN's blocked layout
(`torch.ops.mkldnn._linear_pointwise`, which `torch.compile`'s CPU freezing runs; vLLM's CPU build
runs its linear layers on oneDNN too).
The answers agree to float error (about 3e-6 on a layer's outputs). So `prepack_linears` swaps each
float32 `torch.nn.Linear` of a model on the CPU for that call, unless `BATCHER_ONEDNN_LINEAR=0`, or
the torch build has no oneDNN, where the model stays as it is.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flyteplugins_batcher.engines._cpu_threads import size_encoder_threads

logger = logging.getLogger("flyteplugins_batcher.engines")

SWITCH = "BATCHER_ONEDNN_LINEAR"
"""`0` keeps PyTorch's own linear layers (MKL's or OpenBLAS's `addmm`)."""


def encoder_on_cpu(torch: Any, model: Any) -> None:
    """Set an encoder (a sentence embedder, a sequence classifier) up to run on the CPU: torch's threads
    (`size_encoder_threads`: all CPUs but one, unless `OMP_NUM_THREADS` says otherwise) and its linear layers
    (`prepack_linears`)."""
    size_encoder_threads(torch)
    prepack_linears(model)


def prepack_linears(model: Any) -> int:
    """Run each float32 `torch.nn.Linear` of a CPU model for inference on oneDNN's prepacked kernel; how many.

    The layer keeps its `weight` and `bias` (its state dict is unchanged); only its `forward` changes.
    Nothing changes on a GPU, for other dtypes, with `BATCHER_ONEDNN_LINEAR=0`, or without oneDNN.

    Example:
        ```python
        model = SentenceTransformer("all-MiniLM-L6-v2", device="cpu")
        prepack_linears(model)  # 36: its six layers' query, key, value, output and two feed-forward layers
        ```
    """
    import torch

    if os.environ.get(SWITCH, "1") == "0" or not _onednn_linear_available(torch):
        return 0
    packed = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module) is torch.nn.Linear and _packable(torch, module.weight):
                module.forward = _packed_forward(torch, module)
                packed += 1
    logger.debug("%d linear layers on oneDNN's prepacked kernel", packed)
    return packed


def _packable(torch: Any, weight: Any) -> bool:
    return weight is not None and weight.device.type == "cpu" and weight.dtype == torch.float32


def _onednn_linear_available(torch: Any) -> bool:
    mkldnn = torch.ops.mkldnn
    return bool(torch.backends.mkldnn.is_available()) and all(
        hasattr(mkldnn, name) for name in ("_reorder_linear_weight", "_linear_pointwise")
    )


def _packed_forward(torch: Any, layer: Any) -> Any:
    """The layer's forward on its weight reordered once for oneDNN (the input's shape may vary: no size hint)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach())
    bias = None if layer.bias is None else layer.bias.detach()

    def forward(inputs: Any) -> Any:
        return torch.ops.mkldnn._linear_pointwise(inputs, packed, bias, "none", [], "")

    return forward
