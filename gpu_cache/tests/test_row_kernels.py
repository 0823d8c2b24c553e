"""The native CPU kernels give the same bits as the torch ops the CUDA path runs, and refuse
arrays they would only see a copy of."""

import numpy as np
import pytest
import torch

from gpu_cache._metadata import BagPipeCacheMetadata, copy_rows
from gpu_cache.cache_sgd import best_effort_sgd
from gpu_cache.storage import RowStorage

pytestmark = pytest.mark.timeout(60)
DIM = 16


def _filled(native: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    meta, st = BagPipeCacheMetadata(128), RowStorage(2, DIM, "cpu", native=native)
    keys = rng.choice(10_000, size=100, replace=False).astype(np.int64)
    slots, src, _ = meta.admit(keys)
    st.scatter_from(slots, rng.standard_normal((100, DIM)).astype(np.float32), src)
    return meta, st, keys


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_native_sgd_equals_torch_bit_for_bit(world):
    rng = np.random.default_rng(1)
    (m1, native, keys), (m2, torch_path, _) = _filled(True), _filled(False)
    assert native.host_rows is not None and torch_path.host_rows is None
    assert torch.equal(native.rows, torch_path.rows)
    # resident and absent keys, sorted unique like a step's union
    upd = np.unique(np.concatenate([keys[::2], np.arange(20_000, 20_050)]))
    grads = (
        rng.standard_normal((len(upd), DIM)) * 10.0 ** rng.integers(-6, 3, (len(upd), 1))
    ).astype(np.float32)
    n1 = best_effort_sgd(m1, native, upd, grads, 0.037, world)
    n2 = best_effort_sgd(m2, torch_path, upd, grads, 0.037, world)
    assert n1 == n2 == 50
    assert torch.equal(native.rows, torch_path.rows)
    # and both equal the PS's float32 order: w - lr * (g / W)
    slots = m1.lookup(upd)
    hit = slots >= 0
    before = _filled(True)[1].rows.numpy()[slots[hit]]
    want = before - np.float32(0.037) * (grads[hit] / np.float32(world))
    np.testing.assert_array_equal(native.rows.numpy()[slots[hit]], want)


def test_gather_and_scatter_agree_with_torch():
    (m1, native, keys), (_, torch_path, _) = _filled(True), _filled(False)
    slots = m1.lookup(keys[:40])
    a = np.zeros((50, DIM), np.float32)
    b = np.zeros((50, DIM), np.float32)
    pos = np.arange(10, 50)
    native.gather_into(slots, a, pos)
    torch_path.gather_into(slots, b, pos)
    np.testing.assert_array_equal(a, b)
    assert not a[:10].any() and a[10:].any()


def test_copy_rows_refuses_bad_arrays_and_indices():
    src = np.ones((4, DIM), np.float32)
    dst = np.zeros((4, DIM), np.float32)
    with pytest.raises(IndexError, match="destination index 4"):
        copy_rows(src, np.array([0, 1]), dst, np.array([0, 4]))
    assert not dst.any()  # checked before anything was written
    with pytest.raises(TypeError, match="float32"):
        copy_rows(src, np.array([0]), dst.astype(np.float64), np.array([0]))
    with pytest.raises(ValueError, match="C-contiguous"):
        copy_rows(src, np.array([0]), np.zeros((DIM, 4), np.float32).T, np.array([0]))
    with pytest.raises(ValueError, match="same length"):
        copy_rows(src, np.array([0, 1]), dst, np.array([0]))
    ro = np.zeros((4, DIM), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        copy_rows(src, np.array([0]), ro, np.array([0]))
