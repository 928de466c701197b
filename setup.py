"""Only the C extension lives here; all other metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "logmq.storage._recordsv2",
            ["src/logmq/storage/_recordsv2.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "logmq.client._murmur2",
            ["src/logmq/client/_murmur2.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
    ]
)
