"""Right after a broker dies, requests any broker can answer go to the live ones.

Three real brokers; one is killed with SIGKILL and, at once, before the cluster has
fenced it (it is still a leader and still listed in the metadata), commands are run
with every broker's address, the dead one first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from logmq import Admin
from tests.faults.processes import Cluster

DEADLINE = 120  # seconds; a hung CLI fails the test instead of hanging the suite


LOGMQ = [sys.executable, "-m", "logmq_cli.main"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LOGMQ, "-b", bootstrap, *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=DEADLINE,
    )


@pytest.fixture
def trio(tmp_path):
    with Cluster(3, tmp_path / "cluster", proxied=False) as cluster:
        yield cluster


@pytest.mark.timeout(300)
def test_commands_use_the_live_brokers_right_after_one_dies(trio):
    bootstrap = trio.bootstrap
    # On a new cluster the offsets topic is created by the first group request: the
    # listing waits for it instead of failing with COORDINATOR_NOT_AVAILABLE.
    listed = cli(bootstrap, "group", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    created = cli(bootstrap, "topic", "create", "t", "--partitions", "3", "-r", "3")
    assert created.returncode == 0, created.stderr
    with Admin(bootstrap) as admin:
        leaders = {p.partition: p.leader for p in admin.describe_topics(["t"])["t"].partitions}
        for n in range(6):  # groups on several coordinators, some on the victim
            admin.commit_group_offsets(f"g{n}", {("t", 0): 0})
    victim = leaders[0]

    trio.kill(victim)

    # All at once, so that each meets the dead broker before the cluster fences it.
    commands = [
        ["group", "list"],
        ["topic", "describe", "t"],
        ["topic", "list"],
        ["cluster", "describe"],
    ]
    running = [
        subprocess.Popen(
            [*LOGMQ, "-b", bootstrap, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for args in commands
    ]
    for args, proc in zip(commands, running, strict=True):
        _, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 0, (args, err)
        assert "NETWORK_EXCEPTION" not in err
    with Admin(bootstrap) as admin:  # the dead broker may be the first address
        desc = admin.describe_topics(["t"])["t"]
        assert len(desc.partitions) == 3
    # every group is listed, those the dead broker coordinated once they have moved
    listed = cli(bootstrap, "group", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(g["group_id"] for g in json.loads(listed.stdout)) == [f"g{n}" for n in range(6)]
