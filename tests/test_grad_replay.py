"""The advantage-prioritized replay buffer: eviction, capacity, composition, sampling law,
determinism and resume."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

from gradient.maths.replay import AdvantageReplayBuffer, ReplayConfig, ReplayItem


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def payloads(items) -> list:
    return [it.payload for it in items]


def test_eviction_by_age_by_hand():
    buf = AdvantageReplayBuffer(ReplayConfig(tau_max=2))
    for v in range(4):
        buf.add([(f"v{v}", 1.0)], version=v)
    # At version 4 the ages are 4, 3, 2, 1; only ages <= tau_max = 2 survive.
    assert buf.evict(4) == 2
    assert payloads(buf.items) == ["v2", "v3"]
    assert buf.evict(4) == 0
    assert buf.evict(5) == 1 and payloads(buf.items) == ["v3"]


def test_capacity_drops_the_earliest_added():
    buf = AdvantageReplayBuffer(ReplayConfig(capacity=3))
    buf.add([(i, 1.0) for i in range(5)], version=0)
    assert payloads(buf.items) == [2, 3, 4]
    buf.add([(5, 1.0)], version=1)
    assert payloads(buf.items) == [3, 4, 5]


def test_priorities_by_hand():
    # |A| + eps = [1e-6, 1, 4, 9] (plus eps), alpha 0.5: weights ~ [0.001, 1, 2, 3], sum 6.001.
    buf = AdvantageReplayBuffer(ReplayConfig(alpha=0.5, eps=1e-6))
    buf.add([("a", 0.0), ("b", 1.0), ("c", -4.0), ("d", 9.0)], version=0)
    w = torch.tensor([1e-6, 1 + 1e-6, 4 + 1e-6, 9 + 1e-6], dtype=torch.float64).sqrt()
    assert torch.allclose(buf.priorities(), w / w.sum(), rtol=1e-14)
    # alpha 0 is uniform.
    flat = AdvantageReplayBuffer(ReplayConfig(alpha=0.0))
    flat.add([("a", 0.0), ("b", 5.0)], version=0)
    assert flat.priorities().tolist() == [0.5, 0.5]


def test_sampling_frequency_follows_priority():
    """Statistical: 6000 single draws with a fixed generator; the empirical frequencies must
    match p_i = sqrt(|A_i| + eps) / sum ~ [0.0002, 1/6, 2/6, 3/6] within 0.03 (the standard
    error is at most 0.0065), a loose tolerance that a uniform or |A|-proportional sampler
    (1/4 each, or [0, 1/14, 4/14, 9/14]) misses by far."""
    buf = AdvantageReplayBuffer(ReplayConfig(alpha=0.5))
    buf.add([(0, 0.0), (1, 1.0), (2, -4.0), (3, 9.0)], version=0)
    g = gen(0)
    counts = [0, 0, 0, 0]
    for _ in range(6000):
        (item,) = buf.sample(1, g)
        counts[item.payload] += 1
    freq = [c / 6000 for c in counts]
    for f, p in zip(freq, [0.0, 1 / 6, 2 / 6, 3 / 6]):
        assert abs(f - p) < 0.03, freq
    assert len(buf) == 4  # sampling consumed nothing


def test_sampling_is_without_replacement_and_deterministic():
    buf = AdvantageReplayBuffer(ReplayConfig())
    buf.add([(i, float(i) - 5) for i in range(10)], version=0)
    all_ten = buf.sample(10, gen(3))
    assert sorted(payloads(all_ten)) == list(range(10))
    assert payloads(buf.sample(4, gen(7))) == payloads(buf.sample(4, gen(7)))
    assert buf.sample(0, gen(0)) == []
    with pytest.raises(ValueError, match="cannot sample 11"):
        buf.sample(11, gen(0))


def test_compose_keeps_all_fresh_and_adds_replay_after_warmup():
    buf = AdvantageReplayBuffer(ReplayConfig(tau_max=10, warmup_updates=2))
    g = gen(0)
    fresh = [[(f"{v}.{i}", 1.0 + i) for i in range(4)] for v in range(4)]
    # Versions 0 and 1 are warmup: only the fresh rollouts, which are stored.
    for v in (0, 1):
        out = buf.compose(fresh[v], 0.5, v, g)
        assert payloads(out) == payloads(ReplayItem(p, a, v) for p, a in fresh[v])
        assert all(it.birth_version == v for it in out)
    assert len(buf) == 8
    # Version 2: all 4 fresh first, then round(0.5 * 4) = 2 replayed from earlier versions.
    out = buf.compose(fresh[2], 0.5, 2, g)
    assert payloads(out[:4]) == payloads(ReplayItem(p, a, 2) for p, a in fresh[2])
    assert len(out) == 6 and all(it.birth_version < 2 for it in out[4:])
    assert len(set(payloads(out))) == 6 and len(buf) == 12
    # Half rounds up: 0.5 * 5 fresh asks for 3; a ratio beyond the buffer takes all it has.
    five = [(f"x{i}", 1.0) for i in range(5)]
    assert len(buf.compose(five, 0.5, 3, g)) == 5 + 3
    small = AdvantageReplayBuffer(ReplayConfig(warmup_updates=0))
    small.add([("old", 1.0)], version=0)
    assert payloads(small.compose(five, 2.0, 1, g)) == [f"x{i}" for i in range(5)] + ["old"]


def test_compose_evicts_stale_rollouts_before_replaying():
    buf = AdvantageReplayBuffer(ReplayConfig(tau_max=1, warmup_updates=0))
    buf.add([("stale", 5.0)], version=0)
    buf.add([("recent", 1.0)], version=1)
    # At version 2 "stale" is 2 > tau_max = 1 updates old and can no longer be drawn.
    out = buf.compose([("new", 1.0)], 10.0, 2, gen(0))
    assert payloads(out) == ["new", "recent"]
    assert payloads(buf.items) == ["recent", "new"]


def test_state_dict_round_trip_with_torch_save_and_json():
    cfg = ReplayConfig(capacity=100)
    buf = AdvantageReplayBuffer(cfg)
    buf.add([({"ids": torch.arange(3) + i, "old_logp": torch.full((3,), -0.5 * i)}, i - 2.0)
             for i in range(5)], version=4)
    blob = io.BytesIO()
    torch.save(buf.state_dict(), blob)
    blob.seek(0)
    back = AdvantageReplayBuffer(cfg)
    back.load_state_dict(torch.load(blob, weights_only=True))
    assert [(it.advantage, it.birth_version) for it in back.items] == \
        [(it.advantage, it.birth_version) for it in buf.items]
    assert all(torch.equal(a.payload["ids"], b.payload["ids"]) and
               torch.equal(a.payload["old_logp"], b.payload["old_logp"])
               for a, b in zip(buf.items, back.items))
    # Same contents and generator state: the same draw after resume.
    assert [it.advantage for it in back.sample(3, gen(5))] == \
        [it.advantage for it in buf.sample(3, gen(5))]
    # JSON works when the payloads are JSON-safe.
    plain = AdvantageReplayBuffer(cfg)
    plain.add([([1, 2], 0.5), ("text", -1.5)], version=7)
    again = AdvantageReplayBuffer(cfg)
    again.load_state_dict(json.loads(json.dumps(plain.state_dict())))
    assert again.items == plain.items
    # A smaller capacity on resume keeps the latest items.
    tight = AdvantageReplayBuffer(ReplayConfig(capacity=1))
    tight.load_state_dict(plain.state_dict())
    assert payloads(tight.items) == ["text"]


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="tau_max"):
        ReplayConfig(tau_max=-1)
    with pytest.raises(ValueError, match="capacity"):
        ReplayConfig(capacity=0)
    with pytest.raises(ValueError, match="eps"):
        ReplayConfig(eps=0.0)
    buf = AdvantageReplayBuffer(ReplayConfig())
    with pytest.raises(ValueError, match="finite"):
        buf.add([("x", math.nan)], version=0)
    with pytest.raises(ValueError, match="version"):
        buf.add([("x", 1.0)], version=1.5)
    with pytest.raises(ValueError, match="replay_ratio"):
        buf.compose([("x", 1.0)], -0.5, 0, gen(0))
    with pytest.raises(ValueError, match="items"):
        buf.load_state_dict({"rollouts": []})
    with pytest.raises(ValueError, match="malformed"):
        buf.load_state_dict({"items": [{"payload": 1, "advantage": 0.5}]})
