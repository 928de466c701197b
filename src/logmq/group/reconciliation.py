"""How a ConsumerGroup moves its members towards the target assignment, in safe steps.

The assignor computes every member's *target*; a member is then walked towards it so
that no partition ever has two owners (see docs/consumer-groups.md for the rule):

* a member first gives up what it must lose and keeps the rest, fetching throughout;
* a partition goes to its new owner only once no other member holds it, i.e. its old
  owner reported it no longer owns it, left, or was expired.

A mixin so that group/consumer_group.py keeps to membership, queries and persistence;
it works on the group's members, targets and holders and marks what it changes dirty.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import TYPE_CHECKING

from .assignors import Assignor, TopicPartition
from .model import Member, MemberState


class ReconciliationMixin:
    """Mixed into ConsumerGroup: target assignment and reconciliation of its members."""

    # provided by ConsumerGroup
    assignor: Assignor
    group_epoch: int
    assignment_epoch: int
    _topic_partitions: Mapping[str, int]
    _assigned_metadata: dict[str, int]
    _members: dict[str, Member]
    _target: dict[str, frozenset[TopicPartition]]
    _holder: dict[TopicPartition, str]
    _dirty: set[str]

    if TYPE_CHECKING:

        def _rebalance_timeout(self, member: Member) -> int: ...

    def _reconcile(self, member: Member, owned: Set[TopicPartition] | None, now_ms: int) -> None:
        """Move ``member`` one safe step towards its target (see module docstring)."""
        self._dirty.add(member.member_id)
        target = self._target.get(member.member_id, frozenset())
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            # A newer target may want back what is being revoked: nobody else can hold
            # it yet, so the member simply keeps it.
            keep = member.pending_revocation & target
            pending = member.pending_revocation - keep
            if pending and (owned is None or not owned.isdisjoint(pending)):
                if keep:
                    self._set_holdings(member, member.assigned | keep, pending)
                return  # still owns something it must give up
            self._set_holdings(member, member.assigned | keep, frozenset())
            member.revocation_deadline_ms = None
        if member.member_epoch != self.assignment_epoch:
            to_revoke = member.assigned - target
            if to_revoke:
                self._set_holdings(member, member.assigned & target, to_revoke)
                member.state = MemberState.UNREVOKED_PARTITIONS
                member.revocation_deadline_ms = now_ms + self._rebalance_timeout(member)
                return
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch
        free = frozenset(tp for tp in target - member.assigned if tp not in self._holder)
        if free:
            self._set_holdings(member, member.assigned | free, member.pending_revocation)
        if member.assigned == target:
            member.state = MemberState.STABLE
        else:
            member.state = MemberState.UNRELEASED_PARTITIONS

    def _set_holdings(
        self,
        member: Member,
        assigned: frozenset[TopicPartition],
        pending: frozenset[TopicPartition],
    ) -> None:
        for tp in member.assigned | member.pending_revocation:
            if self._holder.get(tp) == member.member_id:
                del self._holder[tp]
        member.assigned, member.pending_revocation = assigned, pending
        for tp in assigned | pending:
            self._holder[tp] = member.member_id
        self._dirty.add(member.member_id)

    def _remove_member(self, member_id: str) -> None:
        member = self._members[member_id]
        self._set_holdings(member, frozenset(), frozenset())
        del self._members[member_id]
        self._target.pop(member_id, None)

    def _subscribed_metadata(self) -> dict[str, int]:
        topics = set().union(*(m.subscribed_topics for m in self._members.values()))
        return {
            t: self._topic_partitions[t]
            for t in sorted(topics)
            if self._topic_partitions.get(t, 0) > 0
        }

    def _bump_and_assign(self) -> None:
        """Membership, subscriptions or metadata changed: new epoch, new target."""
        self.group_epoch += 1
        self._assigned_metadata = self._subscribed_metadata()
        subscriptions = {mid: m.subscribed_topics for mid, m in self._members.items()}
        target = self.assignor.assign(subscriptions, self._assigned_metadata, self._target)
        self._target = {mid: frozenset(target.get(mid, ())) for mid in self._members}
        self.assignment_epoch = self.group_epoch
        self._dirty.update(self._members)
        for member in self._members.values():
            if member.left_temporarily:
                # Nobody consumes for it: what moves away is released at once.
                target = self._target[member.member_id]
                self._set_holdings(member, member.assigned & target, frozenset())
