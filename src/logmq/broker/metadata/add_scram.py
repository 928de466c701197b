"""``--add-scram`` on a cluster that already exists.

The cluster's first controller writes the option's users with the cluster id, as
``kafka-storage format --add-scram`` does. Kafka ignores the option afterwards; a user who
adds one to a broker's command line and restarts it expects the user to be there. So once
the broker is ready, each (user, mechanism) the option names and the metadata lacks is
created through the controller, as a normal metadata change that keeps any credential
written in the meantime (several brokers may be given the same option: the first one
creates it). One that exists is never changed: if its password is not the option's, the
broker says so once, with how to change it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from logmq.broker.metadata.security_admin import SecurityAdmin
from logmq.cluster.metadata_image import MetadataImage
from logmq.security.scram import AddScramUser

log = logging.getLogger("logmq.security")


async def apply_add_scram(
    admin: SecurityAdmin, image: Callable[[], MetadataImage], users: Sequence[AddScramUser]
) -> None:
    """Create the users the metadata lacks; warn about those whose stored credential
    is not the option's. Never raises for a refusal: it is logged and the broker serves."""
    latest = {(u.name, u.mechanism): u for u in users}  # the last one given wins, as at format
    for user in latest.values():
        stored = image().security.scram_credential(user.name, user.mechanism)
        if stored is None:
            # one request per credential: a request may name a user only once
            result = (
                await admin.alter_scram([(user.name, user.credential)], [], keep_existing=True)
            )[user.name]
            if not result.ok:
                log.warning(
                    "--add-scram: could not create the %s credential of user %r: %s",
                    user.mechanism,
                    user.name,
                    result.message or result.error.name,
                )
                continue
            stored = image().security.scram_credential(user.name, user.mechanism)
            if stored == user.credential:  # the controller audits it (security_changes.py)
                log.info("--add-scram: created the %s user %r", user.mechanism, user.name)
                continue
        if stored is None or user.same_secret(stored):
            continue  # written from this option (at format, or by another broker)
        log.warning(
            "--add-scram %s=[name=%s,...]: user %r already has a %s credential, with another "
            "password than this option's; the existing credential is kept (--add-scram only "
            "creates users). "
            "Change it with `logmq user add %s --mechanism %s` or Kafka's "
            "AlterUserScramCredentials (kafka-configs.sh --alter --entity-type users "
            "--entity-name %s --add-config '%s=[password=...]')",
            user.mechanism,
            user.name,
            user.name,
            user.mechanism,
            user.name,
            user.mechanism,
            user.name,
            user.mechanism,
        )
