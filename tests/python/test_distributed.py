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
