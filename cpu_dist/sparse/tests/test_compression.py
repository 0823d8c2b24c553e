"""Compressed PS traffic (proto/ps.proto, Compression; csrc/codec.h): the numpy twin of the
row encodings held equal to the C++ codec bit for bit, the error bounds of one compressed pull
and one compressed push against float32, commits of int8 chunks, the bytes traffic() counts,
and what a shard refuses."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from cpu_dist.sparse import Client, PSError, partition_of
from cpu_dist.sparse._ps import decode_rows, encode_rows
from cpu_dist.sparse.grpc_stubs import token_metadata

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(120)
DIM = 8
MODES = ["none", "fp16", "int8"]
ROW_BYTES = {"none": 4 * DIM, "fp16": 4 + 2 * DIM, "int8": 4 + DIM}
LR = np.float32(0.1)


# ---- the numpy twin of csrc/codec.h ----------------------------------------------------------


def np_encode(rows: np.ndarray, compression: str) -> np.ndarray:
    """uint8 [n, bytes per row], exactly as csrc/codec.h encodes."""
    rows = np.ascontiguousarray(rows, np.float32)
    n, dim = rows.shape
    if compression == "none":
        return rows.astype("<f4").view(np.uint8).reshape(n, 4 * dim)
    if compression == "fp16":  # numpy's float16 cast rounds to nearest, ties to even
        scale = fp16_scale(rows)
        h = (rows * (np.float32(1) / scale)[:, None]).astype("<f2")  # exact, then rounded
        head = scale.astype("<f4").view(np.uint8).reshape(n, 4)
        return np.concatenate([head, h.view(np.uint8).reshape(n, 2 * dim)], axis=1)
    scale = np.abs(rows).max(axis=1) / np.float32(127)  # one float32 division
    safe = np.where(scale > 0, scale, np.float32(1)).astype(np.float64)
    q = np.rint(rows.astype(np.float64) / safe[:, None])  # ties to even
    q = np.where(scale[:, None] > 0, np.clip(q, -127, 127), 0).astype(np.int8)
    head = scale.astype("<f4").view(np.uint8).reshape(n, 4)
    return np.concatenate([head, q.view(np.uint8)], axis=1)


def fp16_scale(rows: np.ndarray) -> np.ndarray:
    """Per row the power of two 2^e with max |x| / 2^e in [2^14, 2^15), e >= -126; 1 for a
    zero row."""
    m_bits = np.abs(rows).view(np.uint32).max(axis=1).astype(np.int64)
    e = np.maximum((m_bits >> 23) - 127 - 14, -126)
    scale = ((e + 127) << 23).astype(np.uint32).view(np.float32)
    return np.where(m_bits == 0, np.float32(1), scale).astype(np.float32)


def np_decode(data: np.ndarray, dim: int, compression: str) -> np.ndarray:
    data = np.ascontiguousarray(data, np.uint8)
    n = data.shape[0]
    if compression == "none":
        return data.view("<f4").reshape(n, dim).astype(np.float32)
    scale = np.ascontiguousarray(data[:, :4]).view("<f4").reshape(n, 1)
    if compression == "fp16":
        h = np.ascontiguousarray(data[:, 4:]).view("<f2").reshape(n, dim)
        return h.astype(np.float32) * scale  # exact: a power of two
    scale = np.ascontiguousarray(data[:, :4]).view("<f4").reshape(n, 1)
    q = np.ascontiguousarray(data[:, 4:]).view(np.int8).astype(np.float32)
    return q * scale.astype(np.float32)  # one float32 multiplication


def roundtrip(rows: np.ndarray, compression: str) -> np.ndarray:
    return np_decode(np_encode(rows, compression), rows.shape[1], compression)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def codec_cases(rng: np.random.Generator) -> np.ndarray:
    """Rows of every kind a codec must get right: magnitudes from subnormal to 1e37, exact
    fp16 midpoints, exact int8 ties, zero rows, a row of one value, negative zero."""
    dim = 16
    mags = 10.0 ** rng.uniform(-9, 30, (400, 1))
    normal = (rng.standard_normal((400, dim)) * mags).astype(np.float32)
    # Midpoints between adjacent finite halves (exact in float32): ties of the fp16 rounding.
    h = rng.integers(0, 0x7BFF, (100, dim)).astype(np.uint16)
    lo = h.view(np.float16).astype(np.float64)
    hi = (h + 1).view(np.float16).astype(np.float64)
    mid = (((lo + hi) / 2) * rng.choice([-1, 1], (100, dim))).astype(np.float32)
    # int8 ties: max 127 (scale 1), values k + 0.5.
    ties = (rng.integers(-126, 126, (50, dim)) + 0.5).astype(np.float32)
    ties[:, 0] = 127.0
    special = np.zeros((10, dim), np.float32)
    special[1] = -0.0
    special[2] = 3.0
    special[3, 5] = 1e-45  # the smallest subnormal float32: int8's scale underflows to 0
    special[4] = np.float32(65519.99)
    special[5, :] = 5.960464477539063e-08 / 2  # half of fp16's smallest subnormal: a tie to 0
    special[6] = rng.standard_normal(dim) * 1e-39  # a subnormal int8 scale
    special[7] = rng.standard_normal(dim) * 3e-36  # around the smallest normal scale
    special[8] = rng.standard_normal(dim) * 1e37  # a large fp16 scale (2^108 or so)
    special[9] = rng.standard_normal(dim) * 1e-6  # an embedding gradient: fp16's scale 2^-34
    return np.concatenate([normal, mid, ties, special]).astype(np.float32)


@pytest.mark.parametrize("compression", MODES)
def test_codec_equals_its_numpy_twin_bit_for_bit(compression):
    rows = codec_cases(np.random.default_rng(1))
    enc = encode_rows(rows, compression)
    assert enc.dtype == np.uint8 and enc.shape == (
        len(rows),
        len(np_encode(rows[:1], compression)[0]),
    )
    assert np.array_equal(enc, np_encode(rows, compression))
    dec = decode_rows(enc, rows.shape[1], compression)
    assert np.array_equal(bits(dec), bits(np_decode(enc, rows.shape[1], compression)))


def test_fp16_on_every_half_and_a_dense_sweep_of_floats():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = halves[(halves & 0x7C00) != 0x7C00]
    for scale in (1.0, 2.0**-40, 2.0**100):  # every half at three scales
        head = np.broadcast_to(np.array([scale], "<f4").view(np.uint8), (len(finite), 4))
        enc = np.concatenate([head, finite.view(np.uint8).reshape(-1, 2)], axis=1)
        dec = decode_rows(enc, 1, "fp16")[:, 0]
        want = finite.view(np.float16).astype(np.float32) * np.float32(scale)
        assert np.array_equal(bits(dec), bits(want))
    # Every 1021st float32 bit pattern up to the largest magnitude fp16 carries (below
    # 2^127), both signs, as rows of two (so most rows have a smaller second value).
    sweep = np.arange(0, 0x7F000000, 1021, dtype=np.uint32)
    x = np.concatenate([sweep, sweep | 0x80000000]).view(np.float32).reshape(-1, 2)
    assert np.array_equal(encode_rows(x, "fp16"), np_encode(x, "fp16"))


def test_fp16_keeps_gradient_sized_rows_at_full_precision():
    """Plain binary16 flushes 1e-7 to a few subnormal units; the row scale keeps 11 bits."""
    g = (np.random.default_rng(3).standard_normal((200, 64)) * 1e-6).astype(np.float32)
    dec = roundtrip(g, "fp16").astype(np.float64)
    big = np.abs(g) >= np.abs(g).max(axis=1, keepdims=True) / 2**10
    assert np.all(np.abs(dec - g)[big] <= 2.0**-11 * np.abs(g[big]))
    plain = g.astype(np.float16).astype(np.float64)
    assert np.median(np.abs(plain - g) / np.abs(g)) > 50 * np.median(np.abs(dec - g) / np.abs(g))


def test_zero_rows_encode_with_scale_zero():
    enc = encode_rows(np.array([[0.0, -0.0, 0.0]], np.float32), "int8")
    assert enc.tobytes() == bytes(7)


def test_codec_row_sizes_and_refusals():
    x = np.ones((2, 64), np.float32)
    assert [encode_rows(x, m).shape[1] for m in MODES] == [256, 132, 68]
    with pytest.raises(ValueError, match=r"row 1 cannot be encoded as fp16: column 3 is 1\.7"):
        encode_rows(
            np.where(np.arange(128).reshape(2, 64) == 67, 2.0**127, 1).astype(np.float32), "fp16"
        )
    bad = np.ones((1, 4), np.float32)
    bad[0, 2] = np.nan
    for m in MODES:
        with pytest.raises(ValueError, match="column 2 is nan: not finite"):
            encode_rows(bad, m)
    huge = np.full((1, 4), np.finfo(np.float32).max, np.float32)
    with pytest.raises(ValueError, match="beyond int8's range"):
        encode_rows(huge, "int8")
    with pytest.raises(ValueError, match="compression must be 'none', 'fp16' or 'int8'"):
        encode_rows(x, "int4")
    enc = encode_rows(np.ones((1, 4), np.float32), "int8")
    enc[0, 5] = 0x80  # q = -128: no encoder writes it
    with pytest.raises(ValueError, match="column 1 is -128"):
        decode_rows(enc, 4, "int8")
    enc[0, :4] = np.array([-1.0], "<f4").view(np.uint8)
    with pytest.raises(ValueError, match="int8 scale is -1"):
        decode_rows(enc, 4, "int8")
    one = np.array([1.0], "<f4").view(np.uint8)
    inf_half = np.concatenate([one, np.array([0x00, 0x7C] * 4, np.uint8)])[None]
    with pytest.raises(ValueError, match="not finite"):
        decode_rows(inf_half, 4, "fp16")
    for scale in (3.0, 0.0, -1.0, 2.0**113):  # no power of two in [2^-126, 2^112]
        enc = encode_rows(np.ones((1, 4), np.float32), "fp16")
        enc[0, :4] = np.array([scale], "<f4").view(np.uint8)
        with pytest.raises(ValueError, match="fp16 scale is"):
            decode_rows(enc, 4, "fp16")


# ---- pulls -----------------------------------------------------------------------------------


def filled(cluster, n_keys: int, dim: int, seed: int = 0) -> np.ndarray:
    """Sets rows of magnitudes 1e-7..1e3 (per row) in the cluster; returns their keys."""
    keys = np.arange(n_keys, dtype=np.int64) * 7 - 300
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((n_keys, dim)) * 10.0 ** rng.uniform(-7, 3, (n_keys, 1))
    cl = cluster.client()
    cl.push(keys, cl.pull(keys) - target.astype(np.float32), 1.0)  # w - (w - target)
    return keys


def test_one_compressed_pull_is_within_the_bound_of_its_encoding(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    keys = filled(c, 3000, DIM)
    x = c.client().pull(keys)
    fp16 = c.client(compression="fp16").pull(keys)
    int8 = c.client(compression="int8", max_keys_per_rpc=97).pull(keys)
    # What the shard sends is the codec's encoding of its float32 rows, nothing else.
    assert np.array_equal(bits(fp16), bits(roundtrip(x, "fp16")))
    assert np.array_equal(bits(int8), bits(roundtrip(x, "int8")))
    # fp16: relative 2^-11 per value for normal halves (|x| >= 2^-14 * the row's scale),
    # 2^-25 * scale absolute below them; the scale puts the row's max in [2^14, 2^15).
    err16 = np.abs(x.astype(np.float64) - fp16)
    scale16 = fp16_scale(x).astype(np.float64)[:, None]
    normal = np.abs(x) >= 2.0**-14 * scale16
    assert normal.sum() > 1000 and (~normal).sum() > 0
    assert np.all(err16[normal] <= 2.0**-11 * np.abs(x[normal]))
    assert np.all(err16 <= 2.0**-25 * scale16 + 2.0**-11 * np.abs(x))
    # int8: |x - x'| <= scale / 2 per value, scale = row max / 127 (plus x'_c's own rounding).
    scale = (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float64)[:, None]
    err8 = np.abs(x.astype(np.float64) - int8)
    assert np.all(err8 <= scale / 2 + np.spacing(np.abs(int8)).astype(np.float64))
    assert np.any(err8 > scale / 4)  # the bound is not vacuous


@pytest.mark.parametrize("compression", ["fp16", "int8"])
def test_compressed_pulls_with_duplicates_parts_and_multi_slice_replies(
    cluster_factory, compression
):
    dim = 64
    c = cluster_factory(num_shards=2, dim=dim)
    keys = filled(c, 30000, dim, seed=3)
    x = c.client().pull(keys)
    want = roundtrip(x, compression)
    whole = c.client(compression=compression, max_keys_per_rpc=30000, channels_per_shard=1)
    assert np.array_equal(bits(whole.pull(keys)), bits(want))  # 1 MB replies: many slices
    parts = c.client(compression=compression, max_keys_per_rpc=13)
    pick = np.concatenate([keys[::-3], keys[:50], [123456789]]).astype(np.int64)
    got = parts.pull_async(pick).wait(60)
    absent = c.client().pull(np.array([123456789], np.int64))
    expect = roundtrip(np.concatenate([x[::-1][::3], x[:50], absent]), compression)
    assert np.array_equal(bits(got), bits(expect))


def test_per_call_compression_and_uncompressed_dumps(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    keys = filled(c, 500, DIM)
    plain = c.client()
    cl = c.client(compression="int8")
    assert cl.compression == "int8" and plain.compression == "none"
    x = plain.pull(keys)
    assert np.array_equal(bits(cl.pull(keys, compression="none")), bits(x))  # evaluation pulls
    assert np.array_equal(bits(cl.pull_async(keys, compression="none").wait(20)), bits(x))
    assert np.array_equal(bits(plain.pull(keys, compression="fp16")), bits(roundtrip(x, "fp16")))
    assert np.array_equal(bits(cl.pull(keys)), bits(roundtrip(x, "int8")))
    for a, b in zip(cl.dump(), plain.dump()):  # dumps are never compressed
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="compression must be"):
        cl.pull(keys, compression="int4")
    with pytest.raises(ValueError, match="compression must be"):
        c.client(compression="INT8")


# ---- pushes and commits ----------------------------------------------------------------------


def gradients(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, dim)) * 10.0 ** rng.uniform(-3, 1, (n, 1))).astype(np.float32)


@pytest.mark.parametrize("compression", ["fp16", "int8"])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_one_compressed_push_applies_its_decoded_gradient(cluster_factory, compression, optimizer):
    keys = np.arange(0, 4000, 3, dtype=np.int64)
    g = gradients(len(keys), DIM, seed=5)
    packed = cluster_factory(num_shards=2, dim=DIM)
    decoded = cluster_factory(num_shards=2, dim=DIM)
    exact = cluster_factory(num_shards=2, dim=DIM)
    packed.client(compression=compression, max_keys_per_rpc=100).push(keys, g, LR, optimizer)
    decoded.client().push(
        keys, decode_rows(encode_rows(g, compression), DIM, compression), LR, optimizer
    )
    exact.client().push(keys, g, LR, optimizer)
    a, b, e = packed.client().dump(), decoded.client().dump(), exact.client().dump()
    for got, want in zip(a, b):  # the float32 push of the decoded gradient, bit for bit
        assert np.array_equal(got, want)
    if optimizer == "sgd" and compression == "int8":  # within lr * scale / 2 of float32's
        scale = (np.abs(g).max(axis=1) / np.float32(127)).astype(np.float64)[:, None]
        ulp = np.spacing(np.abs(e[1])).astype(np.float64)
        assert np.all(np.abs(a[1].astype(np.float64) - e[1]) <= LR * scale / 2 + 2 * ulp)


def test_int8_commit_of_two_ranks_is_the_float32_sum_of_the_decoded_gradients(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    ref = cluster_factory(num_shards=2, dim=DIM)
    k0 = np.arange(0, 600, dtype=np.int64)
    k1 = np.arange(300, 900, dtype=np.int64)  # 300..599 from both ranks
    g0, g1 = gradients(600, DIM, 7), gradients(600, DIM, 8)
    w0 = c.client().pull(np.arange(900, dtype=np.int64))
    ranks = [c.client(compression="int8", max_keys_per_rpc=37) for _ in range(2)]
    hs = [
        ranks[1].commit_async(9, 0, 1, 2, k1, g1, LR),
        ranks[0].commit_async(9, 0, 0, 2, k0, g0, LR),
    ]
    for h in hs:
        h.wait(30)
    assert ranks[0].wait_committed(9, 0, 30) == 0
    d0, d1 = (decode_rows(encode_rows(g, "int8"), DIM, "int8") for g in (g0, g1))
    plain = ref.client()
    plain.commit(9, 0, 1, 2, k1, d1, LR)
    plain.commit(9, 0, 0, 2, k0, d0, LR)
    keys, values, _ = c.client().dump()
    ref_keys, ref_values, _ = plain.dump()
    assert np.array_equal(keys, ref_keys) and np.array_equal(bits(values), bits(ref_values))
    # The shard's arithmetic (section 5 of DESIGN.md) on the decoded rows: sum in rank order,
    # divide by W, one SGD step.
    total = np.zeros((900, DIM), np.float32)
    total[k0] = d0
    total[k1] = total[k1] + d1
    expect = w0 - LR * (total / np.float32(2))
    assert np.array_equal(bits(values), bits(expect))


def test_values_an_encoding_cannot_carry_are_refused_before_sending(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client(compression="fp16")
    k = np.array([5, 6, 7], np.int64)
    g = np.ones((3, DIM), np.float32)
    g[1, 2] = 2e38
    with pytest.raises(
        ValueError, match=r"key 6 in push \(row 1\): column 2 is 2e\+38: beyond fp16"
    ):
        cl.push(k, g, 0.1)
    msg = r"key 6 in commit of session 1 step 0 rank 0 \(row 1\): column 2 is 2e\+38"
    with pytest.raises(ValueError, match=msg):
        cl.commit_async(1, 0, 0, 1, k, g, 0.1)
    assert cl.traffic()["keys_pushed"] == 0 and c.rows() == 0
    g[1, 2] = np.nextafter(np.float32(2.0**127), np.float32(0))  # the largest fp16 carries
    cl.push(k, g, 1.0)
    # A row beyond fp16's range cannot be pulled as fp16; as float32 it can.
    plain = c.client()
    plain.push(np.array([99], np.int64), np.full((1, DIM), -3e38, np.float32), 1.0)
    with pytest.raises(PSError, match="OUT_OF_RANGE: the row of key 99 cannot be pulled as fp16"):
        cl.pull(np.array([5, 99], np.int64))
    assert plain.pull(np.array([99], np.int64))[0, 0] > 2.9e38


# ---- traffic ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", MODES)
def test_traffic_counts_the_encoded_bytes_exactly(cluster_factory, compression):
    c = cluster_factory(num_shards=1, dim=DIM)
    cl = c.client(compression=compression)
    per_key = 8 + ROW_BYTES[compression]
    out_before = c.servers[0].stats()["bytes_out"]
    cl.pull(np.array([1, 2, 2, 3, 1], np.int64))  # 3 distinct keys cross the wire
    assert cl.traffic()["bytes_pulled"] == 3 * per_key
    # What the shard sent: the values field (tag, 1-byte length, the encoded rows).
    assert c.servers[0].stats()["bytes_out"] - out_before == 2 + 3 * ROW_BYTES[compression]
    g = np.ones((3, DIM), np.float32)
    cl.commit(1, 0, 0, 1, np.array([7, 7, 8], np.int64), g, 0.1)
    cl.push(np.array([5, 5, 6], np.int64), g, 0.1)  # merged into 2 rows
    cl.pull(np.array([9], np.int64), compression="none")  # evaluation pulls are float32
    assert cl.traffic() == dict(
        bytes_pulled=3 * per_key + 8 + 4 * DIM,
        bytes_pushed=5 * per_key,
        keys_pulled=4,
        keys_pushed=5,
        retries=0,
    )


def test_int8_moves_under_0_3_of_float32s_bytes_for_a_job(cluster_factory):
    dim = 64
    moved = {}
    for mode in ("none", "int8"):
        c = cluster_factory(num_shards=2, dim=dim)
        workers = [c.client(compression=mode) for _ in range(2)]
        rng = np.random.default_rng(11)
        for step in range(4):
            handles = []
            for rank, cl in enumerate(workers):
                keys = np.unique(rng.integers(0, 200000, 4096))
                cl.pull(keys)
                g = gradients(len(keys), dim, step)
                handles.append(cl.commit_async(3, step, rank, 2, keys, g, 0.05))
            for h in handles:  # traffic counts a chunk once its acknowledgement is in
                h.wait(30)
        moved[mode] = sum(
            cl.traffic()["bytes_pulled"] + cl.traffic()["bytes_pushed"] for cl in workers
        )
    assert moved["int8"] <= 0.3 * moved["none"]
    assert moved["int8"] / moved["none"] == pytest.approx((8 + 4 + dim) / (8 + 4 * dim))


# ---- committed steps seen by pulls ------------------------------------------------------------


def test_a_pull_that_names_a_session_reports_the_least_committed_step(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client()
    keys = np.arange(200, dtype=np.int64)
    on1 = keys[partition_of(keys) % 2 == 1]  # shard_of(k, 2)
    assert 0 < len(on1) < len(keys)
    assert cl.last_pull_committed() is None  # no pull named a session yet
    cl.pull(keys, session=77)
    assert cl.last_pull_committed() == -1  # the shards never saw session 77
    h = cl.pull_async(keys)
    h.wait(10)
    assert h.committed_step() is None  # no session named
    for step in range(3):
        cl.commit(77, step, 0, 1, keys, np.ones((200, DIM), np.float32), 0.1)
    # Shard 1 alone moves on: a client of shard 1 only commits steps 3 and 4 there (shard 0
    # never hears of them), so shard 0 stays at 2 and shard 1 reaches 4.
    only1 = Client([c.addresses[1]], TOKEN, DIM, timeout_s=20)
    for step in (3, 4):
        only1.commit(77, step, 0, 1, on1[:1], np.ones((1, DIM), np.float32), 0.1)
    h = cl.pull_async(keys, session=77, compression="int8")
    h.wait(20)
    assert h.committed_step() == 2  # the minimum over the shards the pull touched
    rows = cl.pull(keys, session=77)
    assert cl.last_pull_committed() == 2
    assert np.array_equal(bits(rows), bits(cl.pull(keys)))  # naming a session changes no row
    cl.pull(on1, session=77)
    assert cl.last_pull_committed() == 4  # only shard 1 touched
    cl.pull(keys)
    assert cl.last_pull_committed() == 4  # a pull without a session leaves it
    cl.pull(np.zeros(0, np.int64), session=77)
    assert cl.last_pull_committed() is None  # touched no shard
    only1.close()


# ---- what a shard refuses ----------------------------------------------------------------------


@pytest.fixture
def raw(cluster_factory, pb):
    c = cluster_factory(num_shards=1, dim=4)
    cl = c.client()
    cl.push(np.arange(5, dtype=np.int64), np.ones((5, 4), np.float32), 0.1)
    channel = grpc.insecure_channel(c.addresses[0])
    yield cl, pb[1].ParameterServerStub(channel), pb[0]
    channel.close()


def refused(call, code, fragment):
    with pytest.raises(grpc.RpcError) as ei:
        call()
    assert ei.value.code() == code, ei.value.details()
    assert fragment in ei.value.details(), ei.value.details()


def test_the_shard_refuses_bad_encodings_and_changes_nothing(raw):
    cl, stub, pb = raw
    md = token_metadata(TOKEN)
    IA = grpc.StatusCode.INVALID_ARGUMENT
    before = [a.copy() for a in cl.dump()]
    keys = np.array([1, 2], np.int64).tobytes()
    good = encode_rows(np.ones((2, 4), np.float32), "int8")
    neg = good.copy()
    neg[1, :4] = np.array([-1.0], "<f4").view(np.uint8)
    q128 = good.copy()
    q128[1, 5] = 0x80
    push = dict(table=b"embedding", dim=4, keys=keys, lr=0.1)
    commit = dict(push, session=4, step=0, rank=0, world_size=1, chunk_index=0, chunk_count=1)
    INT8, FP16 = pb.COMPRESSION_INT8, pb.COMPRESSION_FP16
    cases = [
        (
            stub.Pull,
            pb.PullRequest(table=b"embedding", dim=4, keys=keys, compression=7),
            "unknown compression 7",
        ),
        (
            stub.Push,
            pb.PushRequest(**push, grads=good.tobytes(), compression=7),
            "unknown compression 7",
        ),
        (
            stub.Push,
            pb.PushRequest(**push, grads=good.tobytes()),
            "expected 32 (2 keys x dim 4 x 4)",
        ),
        (
            stub.Push,
            pb.PushRequest(**push, grads=b"\0" * 32, compression=INT8),
            "expected 16 (2 keys x (4 + dim 4) as int8)",
        ),
        (
            stub.Push,
            pb.PushRequest(**push, grads=neg.tobytes(), compression=INT8),
            "grads of key 2 in push are no valid int8 row: int8 scale is -1",
        ),
        (
            stub.Push,
            pb.PushRequest(**push, grads=q128.tobytes(), compression=INT8),
            "key 2 in push are no valid int8 row: column 1 is -128",
        ),
        (
            stub.Push,
            pb.PushRequest(
                **push, grads=bytes(([0, 0, 0x80, 0x3F] + [0, 0x7C] * 4) * 2), compression=FP16
            ),
            "grads of key 1 in push are no valid fp16 row: column 0 is inf: not finite",
        ),
        (
            stub.Commit,
            pb.CommitRequest(**commit, grads=q128.tobytes(), compression=INT8),
            "grads of key 2 in session 4 step 0 rank 0 are no valid int8 row",
        ),
    ]
    for call, req, fragment in cases:
        refused(lambda: call(req, timeout=10, metadata=md), IA, fragment)
    assert cl.committed_step(4) == -1
    assert all(np.array_equal(a, b) for a, b in zip(cl.dump(), before))
    # A well-formed int8 push goes through.
    stub.Push(
        pb.PushRequest(**push, grads=good.tobytes(), compression=INT8), timeout=10, metadata=md
    )


def test_the_committed_step_field_is_present_only_when_asked_for(raw):
    cl, stub, pb = raw
    md = token_metadata(TOKEN)
    keys = np.array([1, 2], np.int64).tobytes()
    plain = stub.Pull(pb.PullRequest(table=b"embedding", dim=4, keys=keys), timeout=10, metadata=md)
    assert not plain.HasField("committed_step") and len(plain.values) == 32
    cl.commit(8, 0, 0, 1, np.array([1], np.int64), np.ones((1, 4), np.float32), 0.1)
    asked = stub.Pull(
        pb.PullRequest(
            table=b"embedding", dim=4, keys=keys, session=8, compression=pb.COMPRESSION_FP16
        ),
        timeout=10,
        metadata=md,
    )
    assert (
        asked.HasField("committed_step")
        and asked.committed_step == 0
        and len(asked.values) == 2 * (4 + 2 * 4)
    )
    empty = stub.Pull(pb.PullRequest(table=b"embedding", dim=4, session=9), timeout=10, metadata=md)
    assert empty.committed_step == -1 and empty.values == b""
