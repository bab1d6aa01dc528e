"""Dynamo-shaped APIs on dynamo_nb: run Dynamo's Python programs with one import line changed.

- ``runtime/``: ``dynamo.runtime`` (``DistributedRuntime``, ``dynamo_worker``,
  ``dynamo_endpoint``, ``Context``, clients whose items have ``.data()``; its logging and unary helpers);
- ``llm.py``: ``dynamo.llm``'s names, a table of contents over ``llm_register.py`` (``register_llm``,
  ``ModelInput``, ``ModelType``) and ``llm_unary.py``;
- ``llm_unary.py``: ``dynamo.llm``'s unary helpers (``LLMUnaryClient``, ``UnaryChatModel``,
  ``with_engine_data``).
"""
