"""Scoring an exported model without MPI, a parameter server or the native module.

``python -m cpu_dist.serving DIR --data ... --eval-batches N`` loads an export bundle
(:mod:`cpu_dist.serving.bundle`) and prints one JSON line with ``eval_auc`` and
``eval_logloss`` on the evaluation batches the training job scores.
"""
