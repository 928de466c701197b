"""The Kafka protocol door: Kafka's wire protocol over the broker's services.

kio (Kafka's message types) imports ``hypothesis.strategies`` whenever hypothesis is
installed, to register test strategies for its types. A broker never uses them, and
that import is about 0.3 s and 20 MB of every start where hypothesis happens to be
installed (any development or CI environment). So kio is first imported here with
hypothesis hidden, unless something in this process has imported hypothesis already
(a test run that wants kio's strategies keeps them).
"""

import sys

if "hypothesis" not in sys.modules:
    sys.modules["hypothesis"] = None  # type: ignore[assignment]  # import fails fast
    try:
        import kio.static.primitive  # noqa: F401
    finally:
        del sys.modules["hypothesis"]
