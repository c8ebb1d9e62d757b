"""skyforge's Python data API gives the C++ SDK's answers (skyforge/data.hpp), index for index."""
import numpy as np
import pytest

import skyforge


def test_generator_stream_and_bounded_draws_match(oracle):
    for seed in (0, 1, 42, 2**63 + 5, 2**64 - 1):
        rng = skyforge.Rng(seed)
        assert [rng.next() for _ in range(20)] == oracle("next", seed, 20)
    bounds = [1, 2, 3, 7, 10, 1000, 2**32 + 1, 2**63 + 1, 2**64 - 1]
    rng = skyforge.Rng(123)
    assert [rng.below(b) for b in bounds] == oracle("below", 123, *bounds)


def test_golden_values_of_the_sdk():  # the same pins as tests/sdk/test_sdk_data.cpp
    assert skyforge.permutation(10, True, 42).tolist() == [9, 1, 4, 2, 8, 7, 6, 5, 3, 0]
    assert skyforge.permutation(1000, True, 7)[:8].tolist() == [11, 528, 114, 853, 63, 201, 711, 240]
    assert skyforge.shard_indices(100, 1, 4, True, 2024)[:6].tolist() == [61, 13, 21, 62, 47, 57]


@pytest.mark.parametrize("n", [0, 1, 2, 10, 97, 1000, 60000])
@pytest.mark.parametrize("seed", [0, 42, 2**64 - 1])
def test_permutations_match(oracle, n, seed):
    assert skyforge.permutation(n, True, seed).tolist() == oracle("permutation", n, 1, seed)
    assert skyforge.permutation(n, False, seed).tolist() == list(range(n))


@pytest.mark.parametrize("n,total", [(0, 3), (2, 3), (10, 3), (100, 4), (60000, 7)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_match_and_cover(oracle, n, total, shuffle):
    parts = []
    for node in range(total):
        mine = skyforge.shard_indices(n, node, total, shuffle, 2024)
        assert mine.dtype == np.int64
        assert mine.tolist() == oracle("shard", n, node, total, int(shuffle), 2024)
        parts.extend(mine.tolist())
    assert sorted(parts) == list(range(n))


@pytest.mark.parametrize("size,world", [(10, 3), (12, 4), (3, 5), (1000, 8)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_matches_epoch_by_epoch(oracle, size, world, drop_last):
    for rank in range(world):
        s = skyforge.DistributedSampler(size, num_replicas=world, rank=rank, shuffle=True, seed=7, drop_last=drop_last)
        for epoch in (0, 1, 5):
            s.set_epoch(epoch)
            want = oracle("sampler", size, rank, world, 1, 7, int(drop_last), epoch)
            assert list(s) == want
            assert len(s) == len(want)


def test_shard_of_arrays_keeps_rows_together_views_unless_shuffled():
    x = np.arange(20).reshape(10, 2)
    y = np.arange(10) * 10
    xs, ys = skyforge.shard(x, y, node=1, total_nodes=3)
    assert np.shares_memory(xs, x), "unshuffled: a view"
    assert xs.tolist() == [[8, 9], [10, 11], [12, 13]] and ys.tolist() == [40, 50, 60]
    xs, ys = skyforge.shard(x, y, shuffle=True, seed=42, node=1, total_nodes=3)
    idx = skyforge.shard_indices(10, 1, 3, True, 42)
    assert not np.shares_memory(xs, x)
    assert (xs[:, 0] // 2).tolist() == idx.tolist() and (ys // 10).tolist() == idx.tolist()
    assert skyforge.shard(["a", "b", "c"], node=2, total_nodes=3) == ["c"]
    assert skyforge.shard(7, node=0, total_nodes=2).tolist() == [0, 1, 2, 3]


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="differ in length"):
        skyforge.shard(np.zeros(3), np.zeros(4), node=0, total_nodes=1)
    with pytest.raises(ValueError, match="node 3 is not below total_nodes 3"):
        skyforge.shard_indices(5, 3, 3)
    with pytest.raises(ValueError, match="rank 2 is not below num_replicas 2"):
        skyforge.DistributedSampler(5, num_replicas=2, rank=2)


def test_outside_a_pool_instance_info_says_so(monkeypatch):
    monkeypatch.delenv("SKYFORGE_NODE", raising=False)
    with pytest.raises(skyforge.NotOnANode, match="not on a skyforge node"):
        skyforge.instance_info()
    with pytest.raises(skyforge.NotOnANode):
        skyforge.shard(np.zeros(4))  # node and total default to instance_info()
