"""The CLI's TLS and SASL settings: -X, --command-config (a Java properties file as
kafka-*.sh take) and the environment, and their precedence."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from logmq.client.security import ClientSecurity, java_names
from logmq_cli.client_security import client_security, parse_property, read_properties
from logmq_cli.main import cli

JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="admin" password="admin-secret";'
)


def test_java_properties_are_read_as_java_reads_them(tmp_path):
    path = tmp_path / "client.properties"
    path.write_text(
        "# a comment\n"
        "! another\n"
        "\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism : SCRAM-SHA-512\n"
        "ssl.truststore.location   /etc/ca.pem\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="admin" \\\n'
        '    password="a=b\\u00e9";\n'
        "escaped\\=key=x\\ty\n"
        "empty=\n"
    )
    props = read_properties(str(path))
    assert props == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.truststore.location": "/etc/ca.pem",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="admin" password="a=bé";'
        ),
        "escaped=key": "x\ty",
        "empty": "",
    }


def test_the_java_clients_names_are_librdkafkas(tmp_path):
    props = java_names(
        {
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": "/ca.pem",
            "ssl.keystore.location": "/me.pem",
            "sasl.jaas.config": JAAS,
        }
    )
    assert props == {
        "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/me.pem",
        "ssl.key.location": "/me.pem",
        "sasl.username": "admin",
        "sasl.password": "admin-secret",
    }
    with pytest.raises(ValueError, match="convert the truststore to PEM"):
        java_names({"ssl.truststore.type": "JKS", "ssl.truststore.location": "/ca.jks"})
    with pytest.raises(ValueError, match=r"sasl\.jaas\.config"):
        java_names({"sasl.jaas.config": "not a jaas config"})


def test_x_over_file_over_environment(tmp_path):
    path = tmp_path / "admin.properties"
    path.write_text(
        f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config={JAAS}\n"
    )
    env = {
        "LOGMQ_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LOGMQ_SASL_USERNAME": "from-env",
        "LOGMQ_SASL_PASSWORD": "env-secret",
    }
    sec = client_security((), None, env)
    assert (sec.sasl_username, sec.sasl_mechanism) == ("from-env", "PLAIN")
    # the file's JAAS login replaces the environment's user
    sec = client_security((), str(path), env)
    assert (sec.sasl_username, sec.sasl_password) == ("admin", "admin-secret")
    assert sec.sasl_mechanism == "SCRAM-SHA-512"
    # and -X the file's
    sec = client_security((("sasl.username", "alice"), ("sasl.password", "x")), str(path), env)
    assert (sec.sasl_username, sec.sasl_password) == ("alice", "x")
    assert client_security((), None, {}) is None


def test_a_file_with_other_client_settings_is_read_with_a_note(tmp_path, capsys):
    path = tmp_path / "c.properties"
    path.write_text("security.protocol=PLAINTEXT\nclient.id=tool\nrequest.timeout.ms=5\n")
    sec = client_security((), str(path), {})
    assert sec is not None and sec.protocol == "PLAINTEXT"
    assert "ignoring client.id, request.timeout.ms" in capsys.readouterr().err


def test_x_takes_only_security_properties():
    assert parse_property("sasl.username=alice") == ("sasl.username", "alice")
    assert parse_property("sasl.password=a=b") == ("sasl.password", "a=b")
    with pytest.raises(click.BadParameter, match="not a client security property"):
        parse_property("linger.ms=5")
    with pytest.raises(click.BadParameter, match="key=value"):
        parse_property("security.protocol")


@pytest.fixture
def seen(monkeypatch) -> list[ClientSecurity | None]:
    """The security every Admin that ``logmq topic list`` opens was given."""
    from logmq_cli import topic as topic_cli

    got: list[ClientSecurity | None] = []

    class RecordingAdmin:
        def __init__(self, bootstrap: str, *, request_timeout_ms: int, security=None) -> None:
            got.append(security)

        def __enter__(self) -> RecordingAdmin:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def list_topics(self, internal: bool = False) -> list[str]:
            return []

        def list_topic_listings(self, internal: bool = False) -> list:
            return []

    monkeypatch.setattr(topic_cli, "Admin", RecordingAdmin)
    return got


def test_the_options_go_before_or_after_the_subcommand(seen, tmp_path):
    path = tmp_path / "admin.properties"
    path.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.jaas.config={JAAS}\n")
    runner = CliRunner()
    env = {"LOGMQ_SECURITY_PROTOCOL": None, "LOGMQ_SASL_USERNAME": None}
    for args in (
        ["--command-config", str(path), "topic", "list"],
        ["topic", "list", "--command-config", str(path)],
        ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.username=admin", "topic", "list"],
        ["topic", "list", "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.username=admin"],
    ):
        result = runner.invoke(cli, args, env=env)
        assert result.exit_code == 0, (args, result.output)
    assert [(s.protocol, s.sasl_username) for s in seen] == [("SASL_PLAINTEXT", "admin")] * 4
    # the subcommand's -X adds to (and wins over) the group's
    seen.clear()
    args = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.username=a"]
    result = runner.invoke(cli, [*args, "topic", "list", "-X", "sasl.username=b"], env=env)
    assert result.exit_code == 0, result.output
    assert [(s.protocol, s.sasl_username) for s in seen] == [("SASL_PLAINTEXT", "b")]


def test_the_security_settings_are_in_the_help():
    out = CliRunner().invoke(cli, ["--help"]).output
    names = ["-X KEY=VALUE", "--command-config", "LOGMQ_SECURITY_PROTOCOL"]
    names += ["LOGMQ_SASL_USERNAME", "LOGMQ_SASL_PASSWORD", "LOGMQ_SSL_CA_LOCATION"]
    for name in names:
        assert name in out, name
    sub = CliRunner().invoke(cli, ["topic", "list", "--help"]).output
    assert "-X KEY=VALUE" in sub and "--command-config" in sub
