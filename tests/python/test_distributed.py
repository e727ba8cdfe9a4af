# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.distributed: Gloo ranks (processes; groups of 2, and of 4 in the slow tier)
agree on overflow; without the agreement they drift apart (the test can tell)."""

import math

import gloo_ranks
import pytest
import torch

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="this PyTorch has no Gloo")


def run_ranks(tmp_path, mode, world=2):
    return gloo_ranks.run_ranks("dist_worker.py", tmp_path, world, mode, timeout=120)


WORLDS = [2, pytest.param(4, marks=pytest.mark.slow)]


@pytest.mark.parametrize("world", WORLDS)
def test_an_overflow_on_one_rank_makes_every_rank_skip_and_back_off(tmp_path, world):
    ranks = run_ranks(tmp_path, "bind", world)
    for r in ranks:
        assert r["skips"] == [False, False, False, True, False, False, False, False]
        assert r["scales"] == ranks[0]["scales"]
        assert r["checksum"] == ranks[0]["checksum"]
        assert r["all_reduces"] == 8  # one per step
    assert ranks[0]["scales"][2:4] == [512.0, 256.0]  # grown after 3 clean updates, then backed off


@pytest.mark.parametrize("world", WORLDS)
def test_without_the_agreement_the_ranks_drift_apart(tmp_path, world):
    ranks = run_ranks(tmp_path, "alone", world)
    assert [r["skips"][3] for r in ranks] == [False] * (world - 1) + [True]
    assert ranks[0]["scales"] != ranks[-1]["scales"]
    assert ranks[0]["checksum"] != ranks[-1]["checksum"]


@pytest.mark.parametrize("world", WORLDS)
def test_sharded_ranks_clip_by_the_norm_of_all_gradients(tmp_path, world):
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    (alone,) = run_ranks(tmp_path / "one", "sharded", world=1)
    ranks = run_ranks(tmp_path / "many", "sharded", world=world)
    assert all(r["skips"] == alone["skips"] for r in ranks)
    assert alone["skips"][3] and sum(alone["skips"]) == 1
    for r in ranks:
        finite = [(a, b) for a, b in zip(r["norms"], alone["norms"]) if math.isfinite(b)]
        assert len(finite) == 7
        for a, b in finite:
            assert a == pytest.approx(b, rel=1e-6)
        assert not math.isfinite(r["norms"][3])
        assert r["scale"] == alone["scale"]
        assert r["checksum"] == pytest.approx(alone["checksum"], rel=1e-6)
        assert r["all_reduces"] == 8  # one per iteration: step uses clip_grad_norm_'s flag


def _agree_by_hand(shards, norm_type):
    """What the sharded agreement gives each rank, with the all-reduce done here: each
    rank's payload from the core, reduced as the core asks (SUM or MAX), applied back."""
    from lucid_amp import _C

    flags = [torch.tensor(float(found)) for found, _ in shards]
    partials = [torch.tensor(partial) for _, partial in shards]
    payloads = [_C._norm_agreement_payload(f, p, norm_type) for f, p in zip(flags, partials)]
    reduce_max = payloads[0][1]
    stacked = torch.stack([values for values, _ in payloads])
    reduced = stacked.amax(0) if reduce_max else stacked.sum(0)
    for f, p in zip(flags, partials):
        _C._apply_norm_agreement(reduced, f, p, norm_type)
    return reduce_max, [(f.item(), p.item()) for f, p in zip(flags, partials)]


@pytest.mark.parametrize("norm_type, shards, flag, partial", [
    (2.0, [(0, 9.0), (0, 16.0)], 0.0, 25.0),                   # partials add up
    (2.0, [(0, 9.0), (1, 16.0)], 1.0, 25.0),                   # one rank's overflow
    (1.0, [(1, 2.0), (1, 3.0)], 1.0, 5.0),                     # flags come back as 0 or 1
    (2.0, [(0, 9.0), (0, math.inf)], 0.0, math.inf),           # inf reaches every rank
    (math.inf, [(0, 3.0), (0, 4.0)], 0.0, 4.0),                # largest |g|
    (math.inf, [(1, 3.0), (0, 4.0)], 1.0, 4.0),
    (math.inf, [(0, math.nan), (0, 4.0)], 0.0, math.nan),      # NaN kept through MAX
    (math.inf, [(0, 4.0), (0, math.nan)], 0.0, math.nan),
])
def test_the_sharded_norm_payload_agrees_every_rank(norm_type, shards, flag, partial):
    reduce_max, agreed = _agree_by_hand(shards, norm_type)
    assert reduce_max == math.isinf(norm_type)
    for got_flag, got_partial in agreed:
        assert got_flag == flag
        assert got_partial == partial or (math.isnan(partial) and math.isnan(got_partial))


def test_the_sharded_norm_payload_refuses_bad_operands():
    from lucid_amp import _C

    flag, partial = torch.tensor(0.0), torch.tensor(1.0)
    with pytest.raises(ValueError, match="norm_type must be > 0"):
        _C._norm_agreement_payload(flag, partial, 0.0)
    with pytest.raises(RuntimeError, match="1-element float32 overflow flag"):
        _C._norm_agreement_payload(torch.zeros(2), partial, 2.0)
    with pytest.raises(RuntimeError, match="1-element float32 norm partial"):
        _C._norm_agreement_payload(flag, partial.double(), 2.0)
