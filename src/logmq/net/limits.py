"""Counts every decoder of either front door refuses, whatever bytes follow them.

Checking a count against the bytes left (which both doors do) stops a small frame from
claiming a huge array, but not a big frame of tiny elements: a compact array of empty
strings takes one byte an element, a msgpack array of nils likewise, so a 100 MB frame
(the default frame limit) could still make the broker build a list of 100 million
objects, several GB of pointers. Kafka 4.4's protocol readers refuse any array or
collection of more than 1,000,000 elements before allocating, and any flexible
version's tagged-field section of more than 10,000 fields; logmq refuses the same on
both doors (kafka/frame_check.py for Kafka's frames, net/codec.py for msgpack bodies),
answering the request as any other malformed one (docs/kafka-compatibility.md,
docs/protocol.md).
"""

from __future__ import annotations

# The most elements one array (or msgpack map) of a request or response may hold.
MAX_ARRAY_ELEMENTS = 1_000_000

# The most arrays, maps and their elements together one msgpack body may hold: the
# per-array limit alone lets a 100 MB frame of empty arrays or maps (one byte each)
# build 100 million Python containers, tens of GB. Bounding the total bounds a body's
# memory to a few hundred MB whatever the frame; the largest bodies the broker sends or
# takes (Metadata of 100,000 partitions, a reassignment of as many) hold about a third.
MAX_BODY_ITEMS = 4_000_000

# The most tagged fields one tagged-field section of a Kafka frame may hold (Kafka's
# flexible versions; msgpack has none).
MAX_TAGGED_FIELDS = 10_000
