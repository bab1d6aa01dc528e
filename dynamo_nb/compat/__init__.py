"""Dynamo-shaped APIs on dynamo_nb: run Dynamo's Python programs with one import line changed.

- ``runtime.py``: ``dynamo.runtime`` (``DistributedRuntime``, ``dynamo_worker``,
  ``dynamo_endpoint``, ``Context``, clients whose items have ``.data()``);
- ``llm.py``: ``dynamo.llm``'s ``register_llm``, ``ModelInput``, ``ModelType``.
"""
