"""Random schedules against the simulated cluster: safety after every step, liveness after healing.

Hypothesis builds schedules of ticks, deliveries in any order, drops, duplicates,
partitions, crashes/restarts, proposals and compactions; ``Cluster.check_invariants`` runs
after every step (election safety, log matching, leader completeness, state-machine safety).
Then the network heals and a leader must be elected and a proposal applied everywhere
within a bounded number of ticks. LOGMQ_SOAK=1 raises the budget.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.replication.sim import Cluster

SOAK = os.environ.get("LOGMQ_SOAK") == "1"
EXAMPLES = 3000 if SOAK else 60
ELECTION_TICKS = 5
LIVENESS_TICKS = 10 * ELECTION_TICKS  # observed worst case is about 2.5 timeouts

CLUSTERS = {
    "one": ([1], []),
    "three": ([1, 2, 3], []),
    "five": ([1, 2, 3, 4, 5], []),
    "three+observer": ([1, 2, 3], [4]),
}


def operations(node_ids: list[int]) -> st.SearchStrategy:
    node = st.sampled_from(node_ids)
    position = st.integers(0, 1_000)
    return st.one_of(
        st.tuples(st.just("tick"), node),
        st.tuples(st.just("tick_all"), st.integers(1, 2 * ELECTION_TICKS)),
        st.tuples(st.just("deliver"), position),
        st.tuples(st.just("deliver_all"), st.just(0)),
        st.tuples(st.just("drop"), position),
        st.tuples(st.just("duplicate"), position),
        st.tuples(st.just("propose"), st.integers(0, 3)),
        st.tuples(
            st.just("isolate"), st.sets(node, min_size=1, max_size=max(1, len(node_ids) - 1))
        ),
        st.tuples(st.just("heal"), st.just(0)),
        st.tuples(st.just("crash"), node),
        st.tuples(st.just("restart"), node),
        st.tuples(st.just("compact"), node),
        st.tuples(st.just("transfer"), node),
    )


def run_schedule(cluster: Cluster, schedule: list[tuple]) -> None:
    counter = 0
    for op, arg in schedule:
        if op == "tick":
            cluster.tick(arg)
        elif op == "tick_all":
            for _ in range(arg):
                cluster.tick_all()
                cluster.deliver_all()
                cluster.check_invariants()
        elif op == "deliver":
            cluster.deliver(arg)
        elif op == "deliver_all":
            cluster.deliver_all()
        elif op == "drop":
            cluster.drop(arg)
        elif op == "duplicate":
            cluster.deliver(arg, keep=True)
        elif op == "propose":
            # Propose at every node that believes it leads: stale leaders must not commit.
            for raft in cluster.leaders():
                values = [b"v%d" % (counter + i) for i in range(1, arg + 2)]
                counter += len(values)
                if len(values) == 1:
                    raft.propose(values[0])
                else:
                    raft.propose_many(values)
                cluster.flush(raft.node_id)
        elif op == "isolate":
            cluster.isolate(arg)
        elif op == "heal":
            cluster.heal()
        elif op == "crash":
            cluster.crash(arg)
        elif op == "restart":
            cluster.restart(arg)
        elif op == "compact":
            cluster.compact(arg)
        elif op == "transfer":
            for raft in cluster.leaders():
                raft.transfer_leadership(arg)
                cluster.flush(raft.node_id)
        cluster.check_invariants()


def check_liveness(cluster: Cluster) -> None:
    cluster.settle(max_ticks=LIVENESS_TICKS)
    cluster.commit_everywhere(b"final", max_ticks=LIVENESS_TICKS)
    cluster.check_invariants()


@pytest.mark.parametrize("shape", sorted(CLUSTERS))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_random_schedules_are_safe_and_live(shape: str, data: st.DataObject) -> None:
    voters, observers = CLUSTERS[shape]
    seed = data.draw(st.integers(0, 2**16), label="seed")
    threshold = data.draw(st.sampled_from([None, 4]), label="snapshot_threshold")
    cluster = Cluster(
        voters,
        observers,
        seed=seed,
        election_ticks=ELECTION_TICKS,
        snapshot_threshold=threshold,
        max_entries_per_message=3,
        max_inflight=4,
    )
    schedule = data.draw(st.lists(operations(voters + observers), max_size=80), label="schedule")
    run_schedule(cluster, schedule)
    check_liveness(cluster)


def random_schedule(rng: random.Random, node_ids: list[int], length: int) -> list[tuple]:
    """A cheap non-shrinking generator for long schedules (seeded, so failures replay)."""
    ops: list[tuple] = []
    for _ in range(length):
        roll = rng.random()
        if roll < 0.35:
            ops.append(("deliver", rng.randrange(1_000)))
        elif roll < 0.55:
            ops.append(("tick", rng.choice(node_ids)))
        elif roll < 0.62:
            ops.append(("tick_all", rng.randint(1, ELECTION_TICKS)))
        elif roll < 0.70:
            ops.append(("drop", rng.randrange(1_000)))
        elif roll < 0.75:
            ops.append(("duplicate", rng.randrange(1_000)))
        elif roll < 0.85:
            ops.append(("propose", rng.randrange(3)))
        elif roll < 0.88:
            k = rng.randint(1, len(node_ids) - 1) if len(node_ids) > 1 else 1
            ops.append(("isolate", set(rng.sample(node_ids, k))))
        elif roll < 0.91:
            ops.append(("heal", 0))
        elif roll < 0.94:
            ops.append(("crash", rng.choice(node_ids)))
        elif roll < 0.96:
            ops.append(("restart", rng.choice(node_ids)))
        elif roll < 0.97:
            ops.append(("transfer", rng.choice(node_ids)))
        else:
            ops.append(("compact", rng.choice(node_ids)))
    return ops


@pytest.mark.parametrize("shape", sorted(CLUSTERS))
def test_long_seeded_schedules(shape: str) -> None:
    voters, observers = CLUSTERS[shape]
    seeds = range(600 if SOAK else 15)
    for seed in seeds:
        rng = random.Random(seed)
        cluster = Cluster(
            voters,
            observers,
            seed=seed,
            election_ticks=ELECTION_TICKS,
            snapshot_threshold=rng.choice([None, 3, 8]),
            max_entries_per_message=2,
            max_inflight=3,
        )
        run_schedule(cluster, random_schedule(rng, voters + observers, 400))
        check_liveness(cluster)
