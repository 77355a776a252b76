"""ipucloud: the face of the cloud (CLI, Python SDK, the `up` supervisor)."""

__version__ = "0.1.0"
