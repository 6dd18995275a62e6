"""KeyPartitioner remembers hashes; the partition of a key must stay the Java client's."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner

from services.adapters.bus import KeyPartitioner


def test_every_key_lands_where_aiokafkas_default_partitioner_puts_it():
    rng = random.Random(7)
    ours, theirs = KeyPartitioner(), DefaultPartitioner()
    keys = [rng.randbytes(rng.randint(0, 40)) for _ in range(500)] + [b"cohort-1", b"cq-0-3", "名前".encode()]
    for _ in range(3):  # the second and third time from memory
        for key in keys:
            partitions = list(range(rng.randint(1, 64)))
            assert ours(key, partitions, partitions) == theirs(key, partitions, partitions), key


def test_it_forgets_every_key_beyond_its_bound_and_still_answers_the_same(monkeypatch):
    monkeypatch.setattr(KeyPartitioner, "MAX_KEYS", 4)
    ours, theirs = KeyPartitioner(), DefaultPartitioner()
    for i in range(20):
        key = f"uid-{i}".encode()
        assert ours(key, [0, 1, 2], [0, 1, 2]) == theirs(key, [0, 1, 2], [0, 1, 2])
        assert len(ours._hashes) <= 4


def test_no_key_goes_to_an_available_partition():
    assert KeyPartitioner()(None, [0, 1, 2, 3], [2]) == 2
