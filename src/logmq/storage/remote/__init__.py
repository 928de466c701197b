"""The remote tier (KIP-405): closed segments copied to object storage and read back.

One concept per module: ``store`` is the few async calls a back end offers (S3 or a
directory), ``segment_metadata`` the facts the metadata quorum keeps about each copied
segment, ``planner`` the sans-IO decisions (what to copy, expire, delete locally),
``segment_files`` how one segment's files become objects and a manifest, ``reader``
and ``chunk_cache`` how a fetch below the local log start is answered.
"""
