"""User code that tests write to files of their own, as a user would: one copy for the unit and
the real-job tests."""

from __future__ import annotations

# A torchmetrics.Metric of a user's (``--metric FILE:MeanPrediction``): the mean probability.
USER_METRIC = """
import torch
from torchmetrics import Metric


class MeanPrediction(Metric):
    def __init__(self):
        super().__init__()
        zero = torch.tensor(0.0, dtype=torch.float64)
        self.add_state("total", default=zero, dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, preds, target):
        self.total += preds.sum()
        self.count += preds.numel()

    def compute(self):
        return self.total / self.count
"""
