"""Native door over TLS: produce and consume 10 KB records with logmq's own asyncio
clients, PLAINTEXT against SSL, a fresh broker for each run, twice each, alternating.

    python benchmarks/bench_native_tls.py [--records N]

Prints MB/s and the broker's CPU seconds per GB (issue 28, docs/benchmarks.md).
"""

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from logmq.client import AsyncAdmin, AsyncConsumer, AsyncProducer
from logmq.client.admin import NewTopic
from logmq.client.security import ClientSecurity
from logmq.testing.certs import make_ca, make_cert
from tests.harness import BrokerProcess


def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


async def run(b, sec, n, size):
    async with AsyncAdmin(b.bootstrap, security=sec) as admin:
        await admin.create_topics([NewTopic("t")])
    v = b"x" * size
    c0, t0 = cpu(b.pid), time.monotonic()
    async with AsyncProducer(b.bootstrap, security=sec, linger_ms=5) as p:
        from logmq.client.producer import BufferFullError

        i = 0
        while i < n:
            try:
                p.send("t", v)
                i += 1
            except BufferFullError:
                await asyncio.sleep(0.002)
        await p.flush()
    pt, pc = time.monotonic() - t0, cpu(b.pid) - c0
    got = 0
    async with AsyncConsumer(b.bootstrap, security=sec, auto_offset_reset="earliest") as c:
        c.assign([("t", 0)])
        c0, t0 = cpu(b.pid), time.monotonic()
        while got < n:
            got += len(await c.poll(1.0))
    ct, cc = time.monotonic() - t0, cpu(b.pid) - c0
    gb = n * size / 1e9
    return n * size / pt / 1e6, pc / gb, n * size / ct / 1e6, cc / gb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="logmq-native-tls-") as d:
        measure(d, opts.records)


def measure(d: str, n: int) -> None:
    ca = make_ca(d + "/pki")
    cert = make_cert(ca, d + "/pki", "127.0.0.1")
    tls = [
        "--override", "listener.security.protocol.map=NATIVE:SSL,PLAINTEXT:PLAINTEXT",
        "--override", "ssl.keystore.type=PEM",
        "--override", f"ssl.keystore.location={cert.keystore_path}",
    ]  # fmt: skip
    client = ClientSecurity.from_properties(
        {"security.protocol": "SSL", "ssl.ca.location": str(ca.cert_path)}
    )
    for i, proto in enumerate(("PLAINTEXT", "SSL", "PLAINTEXT", "SSL")):
        args, sec = (tls, client) if proto == "SSL" else ([], None)
        broker = BrokerProcess(f"{d}/{i}/data", extra_args=args, log_level="warning").start()
        try:
            r = asyncio.run(run(broker, sec, n, 10_000))
        finally:
            broker.stop()
        print(
            f"{proto:10s} produce {r[0]:7.0f} MB/s {r[1]:.2f} s/GB   "
            f"consume {r[2]:7.0f} MB/s {r[3]:.2f} s/GB",
            flush=True,
        )


if __name__ == "__main__":
    main()
