"""Dense linear layer through torch.matmul: the cuBLAS baseline other GEMMs are measured against."""

import torch
from torch import Tensor


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """Return x @ weight.T for weight stored (out_features, in_features), as nn.Linear does."""
    return torch.matmul(x, weight.T)
