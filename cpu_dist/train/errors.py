"""Errors of training itself that a user causes and fixes (a diverging run), kept apart from
``loop`` so that ``job`` can name them without importing torch on PS ranks."""

from __future__ import annotations


class NonFiniteLoss(ArithmeticError):
    """Training diverged; the message names the dense parameters that are not finite."""
