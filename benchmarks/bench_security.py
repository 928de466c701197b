"""What TLS, SASL and ACLs cost on logmq's Kafka door (issue 28).

Starts its own ``logmq-server`` processes (temp data dirs, free ports, a throwaway PKI from
``logmq.testing.certs``) configured through ``--override`` with Kafka's property names, and
measures with confluent-kafka clients on 127.0.0.1, each client in its own process:

1. **throughput**: produce, then consume (``assign()``, timed from the first record) of
   100 B and 10 KB records on the PLAINTEXT, SSL and SASL_SSL (SCRAM-SHA-512) listeners of
   one broker, with the broker's CPU seconds per GB (from /proc/PID/stat; bytes counted as
   bench_kafka.py counts them: 170 B per 100 B record, 10,070 B per 10 KB record). The
   issue's target: SSL consume of 10 KB records at >= 50 % of PLAINTEXT's throughput.
2. **connect**: new authenticated clients per second: N sequential confluent-kafka
   AdminClients each doing one ``list_topics`` (client start-up included, its teardown
   not; one untimed first), with SCRAM-SHA-512 over SASL_SSL and SASL_PLAINTEXT, and SSL
   and PLAINTEXT alone for comparison; plus the broker's CPU milliseconds per set-up and,
   on SASL listeners, the logins per set-up from the broker's ``logmq_sasl_logins_total``
   (librdkafka often opens a second connection once Metadata names the broker).
3. **acl**: produce and consume of 100 B records on SASL_PLAINTEXT (SCRAM-SHA-512, a
   user that is not a super user) on two brokers with the same settings, one without an
   authorizer and one with StandardAuthorizer and ``--acls`` ACLs (literal and prefixed,
   for other principals, some naming the benchmark's topic) created through
   ``AdminClient.create_acls`` as the super user; the difference in percent.

Usage: ``python benchmarks/bench_security.py [--records N] [--quick] [--cases a,b]
[--connections N] [--acls N] [--list] [--json]``. ``--cases`` keeps the cases whose
name contains one of the comma-separated substrings (``--list`` prints the names); a
consume case whose produce case is filtered out still fills its topic, untimed. Speed
goals are reported here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import BrokerProcess, free_port  # noqa: E402

# Client scripts: argv = conf (JSON), topic, records, record size.
PRODUCER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import KafkaError, KafkaException, Producer
    conf, topic, n, size = json.loads(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:5])
    def on_error(err):
        if err.fatal() or err.code() == KafkaError._AUTHENTICATION:
            raise KafkaException(err)
    p = Producer({**conf, "acks": "1", "linger.ms": 5, "batch.size": 1 << 20,
                  "queue.buffering.max.messages": 2_000_000, "compression.type": "none",
                  "error_cb": on_error})
    value = b"x" * size
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(120)
    secs = time.perf_counter() - start
    if left:
        sys.exit(f"{left} records not delivered within 120 s")
    print(json.dumps({"records_per_sec": n / secs, "mb_per_sec": n * size / secs / 1e6}))
    """
)

CONSUMER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Consumer, KafkaError, TopicPartition, OFFSET_BEGINNING
    conf, topic, n, size = json.loads(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:5])
    c = Consumer({**conf, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
                  "queued.max.messages.kbytes": 1 << 20, "queued.min.messages": 1_000_000,
                  "fetch.queue.backoff.ms": 10})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got = nbytes = 0
    start = None  # from the first record: librdkafka's start-up (offset lookup) apart
    last_progress, last_error = time.monotonic(), None
    while got < n:
        batch = c.consume(10000, 1.0)
        for m in batch:
            if m.error() is None:
                if start is None:
                    start = time.perf_counter()
                got += 1
                nbytes += len(m.value())
            elif m.error().code() != KafkaError._PARTITION_EOF:
                last_error = m.error()
        if batch:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > 60:
            sys.exit(f"no records for 60 s after {got} of {n}; last error: {last_error}")
    secs = time.perf_counter() - start
    c.close()
    print(json.dumps({"records_per_sec": got / secs, "mb_per_sec": nbytes / secs / 1e6}))
    """
)

# argv = conf (JSON), set-ups. One AdminClient per set-up, timed from its creation to
# list_topics' answer (TCP, TLS, ApiVersions, SASL, Metadata); its teardown is not timed.
# librdkafka opens the bootstrap connection and, once Metadata names broker 1, often a
# second one to it (both log in): the parent counts the broker's SASL logins.
CONNECTOR = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka.admin import AdminClient
    conf, n = json.loads(sys.argv[1]), int(sys.argv[2])
    AdminClient(conf).list_topics(timeout=15)  # untimed: the broker's first-connection costs
    print("warm", flush=True)
    sys.stdin.readline()  # the parent reads the broker's counters, then says go
    busy = 0.0
    for _ in range(n):
        start = time.perf_counter()
        admin = AdminClient(conf)
        md = admin.list_topics(timeout=15)
        busy += time.perf_counter() - start
        if not md.brokers:
            sys.exit("metadata without brokers")
        del admin
    print(json.dumps({"setups_per_sec": n / busy, "client_ms_per_setup": busy / n * 1e3}))
    """
)

WIRE_BYTES = {100: 170, 10_000: 10_070}  # bytes per record, as bench_kafka.py counts them
SIZE_LABEL = {100: "100 B", 10_000: "10 KB"}
THROUGHPUT_LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL")
CONNECT_LISTENERS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SECURED = ("SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISM = "SCRAM-SHA-512"
ADMIN = ("admin", "admin-secret")  # super user where an authorizer is on
USER = ("bench", "bench-secret")
GROUP = "bench"
PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" user_admin="admin-secret";'
)
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(cmd: list[str]) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class SecuredBroker:
    """A BrokerProcess with PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL Kafka listeners.

    SCRAM-SHA-512 users ``admin`` and ``bench`` are made on first start (``--add-scram``);
    ``authorizer`` turns on StandardAuthorizer with ``admin`` as the super user.
    """

    def __init__(self, pki: dict[str, Any], *, authorizer: bool = False):
        self.pki = pki
        self.ports = {name: free_port() for name in SECURED}
        self.metrics_port = free_port()
        self.proc = BrokerProcess(
            log_level="warning", extra_args=["--metrics-port", str(self.metrics_port)]
        )
        self.ports["PLAINTEXT"] = self.proc.kafka_port
        overrides = {
            "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in self.ports.items()),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki["server"].keystore_path),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(pki["ca"].cert_path),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
            "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
            # the benchmark's own setup (topics, offsets checks) goes through the native
            # listener, PLAINTEXT here: its anonymous principal is a super user too
            "super.users": f"User:{ADMIN[0]};User:ANONYMOUS",
        }
        if authorizer:
            overrides["authorizer.class.name"] = AUTHORIZER
        for key, value in overrides.items():
            self.proc.extra_args += ["--override", f"{key}={value}"]
        for name, password in (ADMIN, USER):
            self.proc.extra_args += [
                "--add-scram",
                f"{MECHANISM}=[name={name},password={password}]",
            ]

    def conf(self, listener: str, user: tuple[str, str] = USER) -> dict[str, Any]:
        """confluent-kafka settings for ``listener`` (SASL ones as ``user``, SCRAM-SHA-512)."""
        conf: dict[str, Any] = {
            "bootstrap.servers": f"127.0.0.1:{self.ports[listener]}",
            "security.protocol": listener,
        }
        if listener.endswith("SSL"):
            conf["ssl.ca.location"] = str(self.pki["ca"].cert_path)
        if listener.startswith("SASL"):
            conf |= {"sasl.mechanism": MECHANISM, "sasl.username": user[0]}
            conf["sasl.password"] = user[1]
        return conf

    def create_topics(self, names: list[str]) -> None:
        from logmq.client import Admin

        with Admin(self.proc.bootstrap) as admin:  # the native door: no SASL, no ACLs
            for name in names:
                admin.create_topic(name, 1)

    def logins(self, listener: str) -> int:
        """Successful SASL logins on ``listener`` so far (``logmq_sasl_logins_total``)."""
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        total = 0.0
        labels = (f'listener="{listener}"', 'outcome="ok"')
        for line in text.splitlines():
            if line.startswith("logmq_sasl_logins_total{") and all(x in line for x in labels):
                total += float(line.rsplit(None, 1)[1])
        return int(total)

    def end_offset(self, topic: str) -> int:
        from logmq.client import Consumer

        with Consumer(self.proc.bootstrap) as c:
            return c.end_offsets([(topic, 0)])[(topic, 0)]

    def log_problems(self) -> list[str]:
        """The broker log's WARNING, ERROR and traceback lines."""
        try:
            lines = self.proc.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        keys = ("WARNING", "ERROR", "CRITICAL", "Traceback")
        return [line for line in lines if any(k in line for k in keys)]

    def __enter__(self) -> SecuredBroker:
        self.proc.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        problems = self.log_problems()
        if problems:
            print(f"broker log {self.proc.log_path}: {len(problems)} problem lines, first 20:",
                  *problems[:20], sep="\n  ", file=sys.stderr)  # fmt: skip
        self.proc.close()


def connect_case(broker: SecuredBroker, listener: str, n: int) -> dict[str, Any]:
    """N AdminClient set-ups on ``listener``, after one untimed; broker CPU and logins."""
    cmd = [sys.executable, "-c", CONNECTOR, json.dumps(broker.conf(listener)), str(n)]
    sasl = listener.startswith("SASL")
    pid = broker.proc.pid
    assert pid is not None
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "warm":
            raise RuntimeError(f"connect {listener}: {proc.communicate(timeout=30)[1][-2000:]}")
        logins, cpu = broker.logins(listener) if sasl else 0, cpu_seconds(pid)
        out, err = proc.communicate("go\n", timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cpu = cpu_seconds(pid) - cpu
    if proc.returncode != 0:
        raise RuntimeError(f"connect {listener} failed: {err.strip()[-2000:]}")
    row = {"kind": "connect", "listener": listener, "mechanism": MECHANISM if sasl else "",
           "setups": n, **json.loads(out.strip().splitlines()[-1])}  # fmt: skip
    row["broker_cpu_ms_per_setup"] = cpu / n * 1e3
    row["logins"] = broker.logins(listener) - logins if sasl else None
    row["broker_cpu_ms_per_login"] = cpu / row["logins"] * 1e3 if row["logins"] else None
    return row


def make_pki(folder: Path) -> dict[str, Any]:
    from logmq.testing.certs import make_ca, make_cert

    ca = make_ca(folder)
    return {"ca": ca, "server": make_cert(ca, folder, "127.0.0.1", server=True)}


def acl_bindings(count: int, topic: str) -> list[Any]:
    """``count`` ACLs for other principals (mostly literal topics, some prefixed, some
    naming ``topic``), then the benchmark user's own: WRITE and READ on ``topic``, READ on
    its group."""
    from confluent_kafka import admin as ka

    ops = (ka.AclOperation.READ, ka.AclOperation.WRITE, ka.AclOperation.DESCRIBE)
    out = []
    for i in range(count):
        principal = f"User:other{i % 500}"
        perm = ka.AclPermissionType.DENY if i % 97 == 0 else ka.AclPermissionType.ALLOW
        if i % 50 == 0:  # prefixes that match the benchmark's topic, each its own principal
            pattern, name = ka.ResourcePatternType.PREFIXED, topic[: 1 + i % len(topic)]
            principal = f"User:prefixed{i}"
        elif i % 10 == 0:
            pattern, name = ka.ResourcePatternType.PREFIXED, f"team{i % 37}-{'x' * (i % 9)}"
        else:
            pattern, name = ka.ResourcePatternType.LITERAL, f"orders-{i}"
        out.append(
            ka.AclBinding(ka.ResourceType.TOPIC, name, pattern, principal, "*", ops[i % 3], perm)
        )
    mine = f"User:{USER[0]}"
    allow, literal = ka.AclPermissionType.ALLOW, ka.ResourcePatternType.LITERAL
    for rtype, name, op in (
        (ka.ResourceType.TOPIC, topic, ka.AclOperation.WRITE),
        (ka.ResourceType.TOPIC, topic, ka.AclOperation.READ),
        (ka.ResourceType.GROUP, GROUP, ka.AclOperation.READ),
    ):
        out.append(ka.AclBinding(rtype, name, literal, mine, "*", op, allow))
    return out


def load_acls(broker: SecuredBroker, bindings: list[Any]) -> dict[str, Any]:
    """Create ``bindings`` as the super user, 1,000 per CreateAcls; check they are all there."""
    from confluent_kafka import admin as ka

    admin = ka.AdminClient({**broker.conf("SASL_PLAINTEXT", ADMIN), "log_level": 4})
    start = time.perf_counter()
    for i in range(0, len(bindings), 1000):
        for f in admin.create_acls(bindings[i : i + 1000], request_timeout=120).values():
            f.result(timeout=180)
    secs = time.perf_counter() - start
    everything = ka.AclBindingFilter(
        ka.ResourceType.ANY, None, ka.ResourcePatternType.ANY, None, None,
        ka.AclOperation.ANY, ka.AclPermissionType.ANY,
    )  # fmt: skip
    found = len(admin.describe_acls(everything, request_timeout=120).result(timeout=180))
    if found != len(bindings):
        raise RuntimeError(f"created {len(bindings)} ACLs, DescribeAcls lists {found}")
    return {"kind": "acl_setup", "acls": found, "create_seconds": secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, help="100 B records per case (10 KB: a tenth)")
    ap.add_argument("--quick", action="store_true", help="a tenth of the records, 10 set-ups, "
                    "1,000 ACLs (unless given)")  # fmt: skip
    ap.add_argument("--connections", type=int, help="AdminClient set-ups per connect case (50)")
    ap.add_argument("--acls", type=int, help="ACLs for other principals (10,000)")
    ap.add_argument("--rounds", type=int, default=1, help="throughput rounds, the listeners' "
                    "order rotated each round (writeback favours whoever goes first)")  # fmt: skip
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    n_small = opts.records or (20_000 if opts.quick else 200_000)
    counts = {100: n_small, 10_000: max(100, n_small // 10)}
    n_conn = opts.connections or (10 if opts.quick else 50)
    n_acls = opts.acls if opts.acls is not None else (1_000 if opts.quick else 10_000)

    throughput = [
        (f"{op} {SIZE_LABEL[size]} {listener}", op, size, listener)
        for size in (100, 10_000)
        for listener in THROUGHPUT_LISTENERS
        for op in ("produce", "consume")
    ]
    connect = [f"connect {listener}" for listener in CONNECT_LISTENERS]
    acl = [f"acl {state} {op} 100 B" for state in ("off", "on") for op in ("produce", "consume")]
    if opts.list:
        print("\n".join([c[0] for c in throughput] + connect + acl))
        return
    wanted = [s.strip().lower() for s in opts.cases.split(",") if s.strip()]

    def chosen(name: str) -> bool:
        return not wanted or any(s in name.lower() for s in wanted)

    rows: list[dict[str, Any]] = []

    def measure(pid: int, row: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> None:
        before = cpu_seconds(pid)
        result = fn()
        cpu = cpu_seconds(pid) - before
        row |= result
        row["broker_cpu_s_per_gb"] = cpu / (row["records"] * WIRE_BYTES[row["size"]] / 1e9)
        rows.append(row)

    def client(broker: SecuredBroker, script: str, listener: str, topic: str, n: int,
               size: int) -> Callable[[], dict[str, Any]]:  # fmt: skip
        conf = json.dumps(broker.conf(listener))
        return lambda: run([sys.executable, "-c", script, conf, topic, str(n), str(size)])

    def produce_consume(
        broker: SecuredBroker, label: str, cases: list[tuple[str, str, int, str]], round_: int = 0
    ):
        """Each (name, op, size, listener): produce then consume on that listener's topic."""
        pid = broker.proc.pid
        assert pid is not None
        for name, op, size, listener in cases:
            topic = topic_name(listener, size, round_)
            n = counts[size]
            row = {"kind": "throughput", "case": f"{op} {SIZE_LABEL[size]}", "round": round_,
                   "listener": listener, "broker": label, "size": size, "records": n}  # fmt: skip
            if op == "produce":
                fn = client(broker, PRODUCER, listener, topic, n, size)
                if chosen(name):
                    measure(pid, row, fn)
                elif chosen(name.replace("produce", "consume")):
                    fn()  # untimed: the consume case needs the records
                else:
                    continue
                end = broker.end_offset(topic)
                if end != n:
                    raise RuntimeError(f"{topic}: {end} records after producing {n}")
            elif chosen(name):
                measure(pid, row, client(broker, CONSUMER, listener, topic, n, size))

    with tempfile.TemporaryDirectory(prefix="logmq-bench-security-") as tmp:
        pki = make_pki(Path(tmp) / "pki")
        main_cases = [c for c in throughput if chosen(c[0])]
        conn_cases = [c for c in connect if chosen(c)]
        if main_cases or conn_cases:
            with SecuredBroker(pki) as broker:
                rounds = max(1, opts.rounds)
                broker.create_topics(
                    [
                        topic_name(lst, s, r)
                        for r in range(rounds)
                        for s in counts
                        for lst in THROUGHPUT_LISTENERS
                    ]
                )
                for r in range(rounds):
                    produce_consume(broker, "main", rotated(throughput, r), r)
                for name in conn_cases:
                    rows.append(connect_case(broker, name.split()[1], n_conn))
        for state in ("off", "on"):
            cases = [
                (f"acl {state} {op} 100 B", op, 100, "SASL_PLAINTEXT")
                for op in ("produce", "consume")
            ]
            if not any(chosen(c[0]) for c in cases):
                continue
            with SecuredBroker(pki, authorizer=state == "on") as broker:
                broker.create_topics(["sasl-plaintext-100"])
                if state == "on":
                    rows.append(load_acls(broker, acl_bindings(n_acls, "sasl-plaintext-100")))
                produce_consume(broker, f"acl-{state}", cases)
    rows += derived(rows)
    if opts.json:
        print(json.dumps(rows))
        return
    report(rows)


def topic_name(listener: str, size: int, round_: int) -> str:
    suffix = f"-r{round_}" if round_ else ""
    return f"{listener.lower().replace('_', '-')}-{size}{suffix}"


def rotated(cases: list[tuple[str, str, int, str]], r: int) -> list[tuple[str, str, int, str]]:
    """The cases with the listeners' order rotated by ``r`` within each size: every
    listener takes its turn first, when the page cache has the least to write back."""
    order = THROUGHPUT_LISTENERS[r % 3 :] + THROUGHPUT_LISTENERS[: r % 3]
    return sorted(cases, key=lambda c: (c[2], order.index(c[3]), c[1] == "consume"))


def pct(a: float, b: float) -> float | None:
    """``a`` as a percentage of ``b``; None when ``b`` is zero (CPU clock ticks are 10 ms)."""
    return 100 * a / b if b else None


def derived(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each secured listener against PLAINTEXT, and the authorizer's cost, as rows."""
    out: list[dict[str, Any]] = []
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == "throughput":
            runs.setdefault((r["broker"], r["case"], r["listener"]), []).append(r)
    tput = {key: median_row(rs) for key, rs in runs.items()}
    for (broker, case, listener), r in tput.items():
        base = tput.get((broker, case, "PLAINTEXT"))
        if broker == "main" and listener != "PLAINTEXT" and base:
            out.append({
                "kind": "vs_plaintext", "case": case, "listener": listener,
                "throughput_pct": pct(r["records_per_sec"], base["records_per_sec"]),
                "cpu_per_gb_pct": pct(r["broker_cpu_s_per_gb"], base["broker_cpu_s_per_gb"]),
            })  # fmt: skip
    for case in ("produce 100 B", "consume 100 B"):
        off = tput.get(("acl-off", case, "SASL_PLAINTEXT"))
        on = tput.get(("acl-on", case, "SASL_PLAINTEXT"))
        if off and on:
            for metric in ("records_per_sec", "broker_cpu_s_per_gb"):
                out.append({
                    "kind": "acl_cost", "case": case, "metric": metric, "off": off[metric],
                    "on": on[metric], "diff_pct": pct(on[metric] - off[metric], off[metric]),
                })  # fmt: skip
    return out


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A case's rounds as one: the median throughput and CPU per GB."""
    if len(rows) == 1:
        return rows[0]
    return {
        "records_per_sec": statistics.median(r["records_per_sec"] for r in rows),
        "broker_cpu_s_per_gb": statistics.median(r["broker_cpu_s_per_gb"] for r in rows),
    }


def show(value: float | None, spec: str) -> str:
    return "n/a" if value is None else f"{value:{spec}} %"


def report(rows: list[dict[str, Any]]) -> None:
    def kind(k: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["kind"] == k]

    if kind("throughput"):
        print("| case | listener | broker | round | records/s | MB/s | broker CPU s per GB |")
        print("|---|---|---|---:|---:|---:|---:|")
        for r in kind("throughput"):
            print(f"| {r['case']} | {r['listener']} | {r['broker']} | {r.get('round', 0)}"
                  f" | {r['records_per_sec']:,.0f}"
                  f" | {r['mb_per_sec']:,.1f} | {r['broker_cpu_s_per_gb']:.2f} |")  # fmt: skip
        print()
    if kind("vs_plaintext"):
        print("Against PLAINTEXT (medians of the rounds):\n")
        print("| case | listener | throughput vs PLAINTEXT | broker CPU per GB vs PLAINTEXT |")
        print("|---|---|---:|---:|")
        for r in kind("vs_plaintext"):
            print(f"| {r['case']} | {r['listener']} | {show(r['throughput_pct'], '.0f')}"
                  f" | {show(r['cpu_per_gb_pct'], '.0f')} |")  # fmt: skip
        print()
    if kind("connect"):
        print("| connect | mechanism | AdminClient set-ups/s | client ms per set-up"
              " | broker CPU ms per set-up | SASL logins per set-up"
              " | broker CPU ms per login |")  # fmt: skip
        print("|---|---|---:|---:|---:|---:|---:|")
        for r in kind("connect"):
            per = "-" if r["logins"] is None else f"{r['logins'] / r['setups']:.2f}"
            login = r["broker_cpu_ms_per_login"]
            login = "-" if login is None else f"{login:.1f}"
            print(f"| {r['listener']} | {r['mechanism'] or '-'} | {r['setups_per_sec']:,.1f}"
                  f" | {r['client_ms_per_setup']:.1f} | {r['broker_cpu_ms_per_setup']:.1f}"
                  f" | {per} | {login} |")  # fmt: skip
        print()
    for r in kind("acl_setup"):
        print(f"ACLs loaded: {r['acls']:,} in {r['create_seconds']:.1f} s (CreateAcls of 1,000)")
    if kind("acl_cost"):
        print("| SASL_PLAINTEXT | metric | authorizer off | authorizer and ACLs on | difference |")
        print("|---|---|---:|---:|---:|")
        for r in kind("acl_cost"):
            fmt = "{:,.0f}" if r["metric"] == "records_per_sec" else "{:.2f}"
            print(f"| {r['case']} | {r['metric']} | {fmt.format(r['off'])} | {fmt.format(r['on'])}"
                  f" | {show(r['diff_pct'], '+.1f')} |")  # fmt: skip


if __name__ == "__main__":
    main()
