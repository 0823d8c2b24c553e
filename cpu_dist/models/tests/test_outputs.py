"""A model's output shape (``cpu_dist.models.outputs.logits_of``): logits ``[B]`` or ``[B, 1]``
(TorchRec's own model classes return ``[B, 1]``) train alike; anything else is one error naming
the model and the shape.  The job, the reference and serving call this one function; the
reference's own use is tested beside it (``reference/tests/test_model_outputs.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_dist.models.factory import ModelError
from cpu_dist.models.outputs import logits_of

pytestmark = pytest.mark.timeout(60)


def test_logits_b_and_b1_are_taken_anything_else_is_named():
    x = torch.arange(4.0, requires_grad=True)
    assert logits_of(x, 4, "m") is x
    column = x.reshape(4, 1) * 2
    out = logits_of(column, 4, "m")
    assert out.shape == (4,)
    out.sum().backward()  # the gradient flows back through the view
    np.testing.assert_array_equal(x.grad.numpy(), [2.0] * 4)
    with pytest.raises(
        ModelError, match=r"model 'm': .* shape \[4, 2\] .* expected \[B\] or \[B, 1\]"
    ):
        logits_of(torch.zeros(4, 2), 4, "m")
    with pytest.raises(ModelError, match=r"shape \[3\] for a batch of 4 rows"):
        logits_of(torch.zeros(3), 4, "m")
    with pytest.raises(ModelError, match=r"model 'm': forward returned a tuple"):
        logits_of((torch.zeros(4),), 4, "m")
