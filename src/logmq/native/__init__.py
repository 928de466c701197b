"""The native front door: logmq's own protocol (length-prefixed msgpack frames, used by
logmq's clients and between brokers), as a handler table over the broker's services.

Its codec is net/codec.py (``NativeWire``); every request passes through the same
pipeline as the Kafka door's (net/pipeline.py) before one of these handlers sees it.
"""
