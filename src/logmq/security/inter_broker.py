"""What a broker presents to the others on the inter-broker listener, checked at start.

Kafka's model: the inter-broker listener's truststore checks the others, its keystore is
this broker's client certificate, and a SASL listener's ``sasl.mechanism.inter.broker
.protocol`` logs in with the ``username`` and ``password`` of that mechanism's JAAS
config on the listener. A setting that cannot work stops the start naming the setting.
"""

from __future__ import annotations

from logmq.errors import InvalidConfigError
from logmq.security.listeners import listener_setting
from logmq.security.settings import CLIENT_MECHANISMS, SecuritySettings, jaas_options


def inter_broker_client_properties(
    settings: SecuritySettings, props: dict[str, str], *, replicated: bool = True
) -> dict[str, str] | None:
    """The client properties (librdkafka's names, which ``ClientSecurity.from_properties``
    reads) of what this broker presents on the inter-broker listener, as Kafka configures
    it (None: PLAINTEXT, or a broker alone with no login of its own): the
    listener's truststore to check the others, its own keystore as a client certificate,
    and for SASL ``sasl.mechanism.inter.broker.protocol`` with the ``username`` and
    ``password`` options of that mechanism's JAAS config on that listener.

    A broker alone (no ``--quorum-voters``) dials no other: without a login of its own
    it needs none. In a cluster a login or truststore that cannot work stops the start
    with the setting to give, instead of brokers that never reach each other."""
    sec = settings.of(settings.inter_broker_listener)
    listener = sec.listener
    if listener.protocol == "PLAINTEXT":
        return None
    source = (
        f" (its {listener.protocol} and settings are Kafka listener "
        f"{listener.inherited_from}'s; listener.name.{listener.inherited_from.lower()}.* "
        "settings count for it too)"
        if listener.inherited_from
        else ""
    )
    client: dict[str, str] = {"security.protocol": listener.protocol}
    if listener.tls and sec.tls is not None:
        tls = sec.tls.settings
        if tls.truststore_location:
            client["ssl.ca.location"] = tls.truststore_location
        elif replicated and not tls.truststore_certificates:
            raise InvalidConfigError(
                f"brokers connect to each other on listener {listener}{source} and check "
                "each other's certificates against ssl.truststore.location: set it to the "
                "CA that signed the brokers' certificates"
            )
        if tls.keystore_location:
            client["ssl.certificate.location"] = tls.keystore_location
            client["ssl.key.location"] = tls.keystore_location
        if tls.key_password:
            client["ssl.key.password"] = tls.key_password
        client["ssl.endpoint.identification.algorithm"] = tls.endpoint_identification_algorithm
    if listener.sasl:
        mechanism = (
            listener_setting(props, listener, "sasl.mechanism.inter.broker.protocol") or "PLAIN"
        ).upper()
        options = jaas_options(props, listener, mechanism)
        if not options.get("username") and not replicated:
            return None
        if replicated and (mechanism not in sec.mechanisms or not options.get("username")):
            usable = [m for m in sec.mechanisms if m in CLIENT_MECHANISMS]
            mech = mechanism if mechanism in sec.mechanisms or not usable else usable[0]
            prefix = (
                f"listener.name.{listener.inherited_from.lower()}."
                if listener.inherited_from
                else listener.prefix
            )
            problem = (
                f"sasl.mechanism.inter.broker.protocol {mechanism} is not enabled there "
                f"(it offers {', '.join(sec.mechanisms) or 'none'})"
                if mechanism not in sec.mechanisms
                else f"no username is set for {mechanism}"
            )
            raise InvalidConfigError(
                f"brokers log in to each other on listener {listener}{source}, and "
                f"{problem}: set sasl.mechanism.inter.broker.protocol={mech} and the "
                f"broker's username and password in {prefix}{mech.lower()}.sasl.jaas.config "
                '(... required username="broker" password="...";)'
            )
        client.update(
            {
                "sasl.mechanism": mechanism,
                "sasl.username": options["username"],
                "sasl.password": options.get("password", ""),
            }
        )
    return client
