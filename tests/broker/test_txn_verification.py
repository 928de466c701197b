"""KIP-890's verification guard: a transactional produce verified with the coordinator
is not appended if the producer's transaction ended on the partition meanwhile (its
marker came between the coordinator's answer and the append), so a late batch never
opens a transaction no coordinator knows of."""

from __future__ import annotations

import asyncio

import pytest

from logmq.broker.coordinator.txn_verification import TxnVerifier, append_guard
from logmq.errors import OK, ErrorCode, LogMQError
from logmq.storage import batch as b
from logmq.storage.config import LogConfig
from logmq.storage.partition_log import PartitionLog
from logmq.storage.txn_state import CONTROL_ABORT, encode_control_batch

PID, TP = 11, ("t", 0)


def txn_batch(seq: int, epoch: int = 0) -> bytes:
    return b.encode_values(
        [b"x"],
        timestamp=1000,
        compression=b.ATTR_TRANSACTIONAL,
        producer_id=PID,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def abort_marker(epoch: int = 0) -> bytes:
    return encode_control_batch(CONTROL_ABORT, producer_id=PID, producer_epoch=epoch, timestamp=1)


class SlowCoordinator:
    """This broker as the coordinator, answering verifications when told to."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.asked = asyncio.Event()

    def coordinator_for(self, txn_id: str) -> tuple[int, str, int]:
        return 1, "127.0.0.1", 0

    async def verify_partitions(self, txn_id, pid, epoch, tps):
        self.asked.set()
        await self.answer.wait()
        return dict.fromkeys(tps, ErrorCode.NONE)


@pytest.fixture
def plog(tmp_path):
    log = PartitionLog(tmp_path / "t-0", LogConfig())
    yield log
    log.close()


def verifier(plog, coordinator) -> TxnVerifier:
    return TxnVerifier(1, coordinator, None, lambda t, p: plog if (t, p) == TP else None)


async def verify_while(plog, between) -> Exception | None:
    """Verify PID's batch on TP; run ``between`` while the coordinator's answer is
    pending; then run the append guard as the produce path does. Its error, if any."""
    coordinator = SlowCoordinator()
    guards: dict = {}
    task = asyncio.create_task(verifier(plog, coordinator).verify("tx", PID, 0, [TP], guards))
    asked = asyncio.create_task(coordinator.asked.wait())
    # the coordinator is asked, or (the transaction open here) the check is done
    await asyncio.wait([task, asked], return_when=asyncio.FIRST_COMPLETED)
    asked.cancel()
    between()
    coordinator.answer.set()
    assert await task == {TP: OK}
    try:
        append_guard(guards)(*TP)
    except LogMQError as e:
        return e
    plog.append(txn_batch(0))
    return None


async def test_a_marker_between_verification_and_append_refuses_the_append(plog):
    err = await verify_while(plog, lambda: plog.append(abort_marker(), control=True))
    assert err is not None and err.code is ErrorCode.INVALID_TXN_STATE
    assert not plog.producer_state.txn.ongoing  # no transaction was opened


async def test_without_a_marker_the_verified_append_goes_ahead(plog):
    assert await verify_while(plog, lambda: None) is None
    assert PID in plog.producer_state.txn.ongoing


async def test_a_transaction_open_here_that_ends_meanwhile_is_not_reopened(plog):
    plog.append(txn_batch(0))  # the transaction is open on the partition already
    err = await verify_while(plog, lambda: plog.append(abort_marker(), control=True))
    assert err is not None and err.code is ErrorCode.INVALID_TXN_STATE
    assert not plog.producer_state.txn.ongoing


async def test_concurrent_verifications_of_one_producer_share_the_guard(plog):
    """A producer pipelines its requests: a second verification must not invalidate
    the first's guard."""
    first: dict = {}
    second: dict = {}
    coordinator = SlowCoordinator()
    coordinator.answer.set()
    v = verifier(plog, coordinator)
    await v.verify("tx", PID, 0, [TP], first)
    await v.verify("tx", PID, 0, [TP], second)
    append_guard(first)(*TP)
    append_guard(second)(*TP)
    plog.append(abort_marker(), control=True)
    with pytest.raises(LogMQError):
        append_guard(first)(*TP)
    third: dict = {}
    await v.verify("tx", PID, 0, [TP], third)  # a new transaction's verification
    append_guard(third)(*TP)
    with pytest.raises(LogMQError):
        append_guard(second)(*TP)  # still refused: it began before the marker
