"""#32 item 17: `help(Client.submit_job)` showed an `operation` object and no parameters. Every SDK
method read from the class is a function with its real parameters and a docstring, on both clients."""

from __future__ import annotations

import inspect
import pydoc

import ipucloud
from ipucloud.sdk._api import Operations


def methods() -> list[str]:
    return [
        name
        for ops in Operations.__mro__  # one class per area (`_ops_*.py`, `_webhooks.py`)
        for name, value in vars(ops).items()
        if not name.startswith("_") and hasattr(value, "build")
    ]


def test_help_shows_a_submission_s_parameters_and_what_they_mean() -> None:
    text = pydoc.render_doc(ipucloud.Client.submit_job, renderer=pydoc.plaintext)
    assert "submit_job(self, spec:" in text and "-> 'Job'" in text
    params = inspect.signature(ipucloud.Client.submit_job).parameters
    for name in ("model", "steps", "ipus", "machine", "prefer", "preemptible", "session", "idempotency_key"):
        assert name in params and name in text, name
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert '`prefer` ("time" or "cost"' in text
    est = inspect.signature(ipucloud.Client.estimate).parameters
    assert {"prefer", "max_runtime_s", "serve_batch_sizes"} <= set(est)
    assert "array" in inspect.signature(ipucloud.Client.submit_array).parameters


def test_every_method_read_from_either_client_class_has_a_signature_and_a_docstring() -> None:
    names = methods()
    assert len(names) > 80
    for cls in (ipucloud.Client, ipucloud.AsyncClient):
        for name in names:
            fn = getattr(cls, name)
            assert inspect.isfunction(fn), (cls.__name__, name)
            assert (fn.__doc__ or "").strip(), f"{cls.__name__}.{name} has no docstring"
            assert next(iter(inspect.signature(fn).parameters)) == "self", name
    assert str(inspect.signature(ipucloud.AsyncClient.iter_jobs).return_annotation) == "AsyncIterator[Job]"
    # Read from a client, the same method with its parameters (no `self`) and the same words.
    c = ipucloud.Client("http://cloud.test", "k")
    assert list(inspect.signature(c.submit_job).parameters)[:2] == ["spec", "name"]
    assert c.submit_job.__doc__ == ipucloud.Client.submit_job.__doc__
