"""The notebook layer: what makes a notebook's cells also a program, one layer above the kit.

- `component_program` (``component_program.py``): `EngineProgram`, `HandlerProgram`,
  `RoutingPolicy`, a component declared in cells; `find_component`, `load_component` and
  `load_router_policy` (the component a ``.py`` file or a notebook declares, loaded where a file
  is expected: ``--router-policy FILE[:NAME]``).
- `export` (``export.py``): the nbconvert preprocessors that drop notebook-only cells when a
  notebook becomes a script (installed into the environment's ``etc/jupyter``).
- `claims` (``claims.py``): a notebook's measured sentences as checks (`claim`, `within`).

What the layers below use in a kernel lives below them: `dynamo_nb.jupyter` (`in_notebook`, the
notebook-only tag, `PngDisplay`), `dynamo_nb.launch.programs` (a notebook as a program: its export
cached by code and checked) and `dynamo_nb.launch.declarations` (which component a file declares).
Importing this package loads none of its modules.

Example:
    >>> from dynamo_nb.notebook.claims import within
    >>> within(10.4, 10.0, 0.05)
    True
"""
