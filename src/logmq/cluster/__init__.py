"""Cluster metadata: the records, the image and the controller (sans-IO)."""
