"""AlterRemoteSegments over the real path: the broker-side caller, the controller
forwarder, the native handler, the Raft commit and the image every handler reads."""

from __future__ import annotations

from logmq.cluster.controller_api import RemoteSegmentChange
from logmq.errors import ErrorCode, LogMQError
from logmq.native.cluster_api import remote_segment_change, remote_segment_change_body
from logmq.native.remote_segment_updates import RemoteSegmentUpdates
from logmq.net.codec import ApiKey
from logmq.storage.remote.segment_metadata import RemoteSegment, SegmentState
from tests.harness import inprocess_broker
from tests.net.raw_client import RawClient

S = SegmentState


def segment(tid: str, sid: str, base: int, epoch: int) -> RemoteSegment:
    return RemoteSegment(
        tid, 0, sid, base, base + 99, 5_000, 1 << 20, ((epoch, base),), epoch, 1, topic="t"
    )


def test_the_wire_body_round_trips():
    s = segment("tid", "a", 0, 3)
    for change in (
        RemoteSegmentChange.copy_started(s, 3),
        RemoteSegmentChange.state_change("tid", 0, "a", S.COPY_FINISHED, 3, checksum="c"),
    ):
        assert remote_segment_change(remote_segment_change_body(change)) == change


async def test_a_leader_copies_and_deletes_through_the_controller(tmp_path):
    async with (
        inprocess_broker(tmp_path / "d") as br,
        await RawClient.connect(br.port) as client,
    ):
        assert (await client.create_topic("t", 1))["error"] == 0
        image = br.quorum.image
        tid = image.topics["t"].topic_id
        part = image.partition("t", 0)
        assert part.leader == 1
        epoch = part.leader_epoch
        updates = RemoteSegmentUpdates(br.forwarder, 1, lambda: br.quorum.broker_epoch)
        a, b = segment(tid, "a", 0, epoch), segment(tid, "b", 100, epoch)
        outcomes = await updates.submit(
            [
                RemoteSegmentChange.copy_started(b, epoch),
                RemoteSegmentChange.copy_started(a, epoch),
                RemoteSegmentChange.state_change(tid, 0, "a", S.COPY_FINISHED, epoch, checksum="x"),
                RemoteSegmentChange.state_change(tid, 0, "b", S.DELETE_FINISHED, epoch),
                RemoteSegmentChange.copy_started(segment(tid, "c", 200, epoch + 1), epoch + 1),
                RemoteSegmentChange.copy_started(segment("nope", "d", 0, epoch), epoch),
            ]
        )
        assert [o.error for o in outcomes] == [
            ErrorCode.NONE,
            ErrorCode.NONE,
            ErrorCode.NONE,
            ErrorCode.INVALID_REQUEST,  # COPY_STARTED -> DELETE_FINISHED
            ErrorCode.FENCED_LEADER_EPOCH,
            ErrorCode.UNKNOWN_TOPIC_ID,
        ]
        assert "COPY_STARTED -> DELETE_FINISHED" in (outcomes[3].message or "")
        # the answer came once this broker's image held the changes
        segs = br.quorum.image.remote_segments(tid, 0)
        assert [(s.segment_id, s.state) for s in segs] == [
            ("a", S.COPY_FINISHED),
            ("b", S.COPY_STARTED),
        ]
        # a stale registration
        stale = RemoteSegmentUpdates(br.forwarder, 1, lambda: 99)
        (o,) = await stale.submit(
            [RemoteSegmentChange.state_change(tid, 0, "b", S.DELETE_STARTED, epoch)]
        )
        assert o.error is ErrorCode.STALE_BROKER_EPOCH

        # the wire form another broker forwards: answered with the offset to wait for
        body = {
            "broker_id": 1,
            "broker_epoch": br.quorum.broker_epoch,
            "forwarded_by": 2,
            "changes": [
                remote_segment_change_body(
                    RemoteSegmentChange.state_change(tid, 0, "b", S.DELETE_STARTED, epoch)
                )
            ],
        }
        resp = (await client.call(ApiKey.ALTER_REMOTE_SEGMENTS, body)).body
        assert resp["changes"] == [{"error": 0, "message": None}]
        assert resp["metadata_offset"] == br.quorum.image.offset
        assert br.quorum.image.remote_segment(tid, 0, "b").state is S.DELETE_STARTED
        # malformed bodies are INVALID_REQUEST, and the connection stays
        for bad in (
            {"broker_id": 1, "broker_epoch": 1, "changes": "x"},
            {"broker_id": 1, "broker_epoch": 1, "changes": [{**body["changes"][0], "state": 9}]},
            {
                "broker_id": 1,
                "broker_epoch": 1,
                "changes": [
                    {
                        **remote_segment_change_body(RemoteSegmentChange.copy_started(a, epoch)),
                        "segment_id": "e",
                        "segment": {
                            **remote_segment_change_body(
                                RemoteSegmentChange.copy_started(a, epoch)
                            )["segment"],
                            "leader_epochs": [[1, 2, 3]],
                        },
                    }
                ],
            },
        ):
            r = (await client.call(ApiKey.ALTER_REMOTE_SEGMENTS, bad)).body
            assert r["error"] == ErrorCode.INVALID_REQUEST, r

        # the topic goes; its segments stay until deleted
        r = (await client.call(ApiKey.DELETE_TOPICS, {"topics": ["t"]})).body
        assert br.quorum.image.orphaned_remote_partitions() == [(tid, 0)], r
        outcomes = await updates.submit(
            [
                RemoteSegmentChange.state_change(tid, 0, "a", S.DELETE_STARTED, -1),
                RemoteSegmentChange.state_change(tid, 0, "a", S.DELETE_FINISHED, -1),
                RemoteSegmentChange.state_change(tid, 0, "b", S.DELETE_FINISHED, -1),
            ]
        )
        assert [o.error for o in outcomes] == [ErrorCode.NONE] * 3
        assert br.quorum.image.orphaned_remote_partitions() == []


async def test_an_unanswered_request_gives_every_change_its_error():
    class NoController:
        async def run_on_controller(self, api_key, body):
            assert api_key == ApiKey.ALTER_REMOTE_SEGMENTS and len(body["changes"]) == 2
            raise LogMQError("no controller answered", ErrorCode.NOT_CONTROLLER)

    change = RemoteSegmentChange.state_change("t", 0, "a", S.DELETE_STARTED, 1)
    outcomes = await RemoteSegmentUpdates(NoController(), 1, lambda: 1).submit([change] * 2)
    assert [o.error for o in outcomes] == [ErrorCode.NOT_CONTROLLER] * 2


async def test_big_batches_go_in_several_requests():
    sizes = []

    async def run(api_key, body):
        sizes.append(len(body["changes"]))
        return {"error": 0, "changes": [{"error": 0, "message": None}] * len(body["changes"])}

    change = RemoteSegmentChange.state_change("t", 0, "a", S.DELETE_STARTED, 1)
    outcomes = await RemoteSegmentUpdates(run, 1, lambda: 1).submit([change] * 2500)
    assert sizes == [1000, 1000, 500] and len(outcomes) == 2500 and all(o.ok for o in outcomes)
