"""Where a program file is: `resolve_program`, one rule for `launch`, graphs and notebook programs.

Example:
    >>> from pathlib import Path
    >>> resolve_program("components/frontend.py", Path.cwd()).name
    'frontend.py'
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ConfigError

__all__ = ["resolve_program"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout, in an editable install
_SHARED = Path(sys.prefix) / "share" / "dynamo_nb"  # where a wheel install puts components/


def resolve_program(program: str, cwd: Path) -> Path:
    """The file a relative ``program`` names.

    Looks in ``cwd`` and its parents (so a notebook in ``notebooks/`` finds
    ``components/…``), then in the dynamo_nb checkout (editable install) and in
    ``<prefix>/share/dynamo_nb`` (wheel install). Raises `ConfigError` naming where it looked.
    """
    path = Path(program).expanduser()
    if path.is_absolute():
        candidates = [path]
    else:
        bases = [cwd, *cwd.parents[:3], _PACKAGE_ROOT, _SHARED]
        candidates = [base / path for base in bases]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    where = ", ".join(str(c.parent) for c in candidates)
    raise ConfigError(
        f"{program} not found (looked in {where}): give an absolute path, or one relative to the "
        "working folder (in Python, launch()'s cwd=)"
    )
