"""The kit's programs on NVIDIA Dynamo's own runtime (``--runtime dynamo``).

With ``--runtime dynamo`` (or ``RuntimeConfig(runtime="dynamo")``) a component creates Dynamo's
``DistributedRuntime`` instead of ours: its ``--discovery``/``--request-plane``/``--nats-url``
become Dynamo's arguments and ``DYN_*`` environment (`DynamoPlanes`, printed once at start), an
engine's model is registered with Dynamo's ``register_model``, and the same engine serves
Dynamo's request dicts, so ``python -m dynamo.frontend`` lists and serves it. Needs NVIDIA
Dynamo's Python packages: ``python3 -m dynamo_nb install dynamo``. See docs/dynamo.md.

- ``runtime.py``: `DynamoRuntime`, Dynamo's ``DistributedRuntime`` with the part of ours a
  component's ``main`` uses;
- ``planes.py``: `DynamoPlanes`, our runtime flags as Dynamo's arguments and ``DYN_*`` environment;
- ``worker.py``: an engine served as a Dynamo worker, its model registered with ``register_model``;
- ``kv_publisher.py``: `DynamoKvEvents`, an engine's KV events to Dynamo's KV router;
- ``frontend.py``: `launch_dynamo_frontend`, Dynamo's own frontend started from Python.

Example::

    python components/hf_worker.py --runtime dynamo --discovery file:///tmp/kv
    DYN_DISCOVERY_BACKEND=file DYN_FILE_KV=/tmp/kv DYN_REQUEST_PLANE=tcp DYN_EVENT_PLANE=zmq \\
        python -m dynamo.frontend --http-host 127.0.0.1 --http-port 8000
"""

from __future__ import annotations

from .frontend import DynamoFrontend, launch_dynamo_frontend
from .kv_publisher import DynamoKvEvents
from .planes import DynamoPlanes
from .runtime import DynamoEndpoint, DynamoRuntime, DynamoServer
from .worker import serve_engine_on_dynamo

__all__ = [
    "DynamoEndpoint",
    "DynamoFrontend",
    "DynamoKvEvents",
    "DynamoPlanes",
    "DynamoRuntime",
    "DynamoServer",
    "launch_dynamo_frontend",
    "serve_engine_on_dynamo",
]
