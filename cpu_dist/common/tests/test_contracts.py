"""The numpy optimizer oracle against the PS formula written out by hand.  (The hash and
row_init twins are held to the native module in cpu_dist/sparse/tests/test_contracts.py.)"""

import numpy as np
import pytest

from cpu_dist.common.contracts import sparse_update

pytestmark = pytest.mark.timeout(30)


def test_sparse_update_matches_the_ps_formula():
    g = np.array([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    w = np.ones((2, 3), dtype=np.float32)
    s = np.array([1.0, 4.0], dtype=np.float32)
    sparse_update("rowwise_adagrad", w, s, g, 0.1)
    s0 = np.float32(1.0) + np.float32((0.25 + 1.0 + 4.0) / 3)
    assert s[0] == pytest.approx(s0, rel=1e-7) and s[1] == 4.0
    np.testing.assert_allclose(w[0], 1.0 - 0.1 / (np.sqrt(s0) + 1e-8) * g[0], rtol=1e-6)
    np.testing.assert_array_equal(w[1], 1.0)
    sparse_update("sgd", w, None, g, 0.5)
    np.testing.assert_allclose(w[1], 1.0)
    with pytest.raises(ValueError):
        sparse_update("adam", w, s, g, 0.1)
