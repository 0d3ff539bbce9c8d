"""Policy modules named in the settings (`policy_modules`): imported for their
`@register_policy` in the service process and in each worker process.

The workers are spawned, so a policy registered only in the parent (a plug-in, a test's
deliberately slow or raising policy) would be unknown where the audit and the window
replays run; naming its module in the settings makes every process register it the same
way.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence


def import_policy_modules(modules: Sequence[str]) -> None:
    """Import each module (idempotent); a module that does not import is a settings error
    naming it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:
            raise ValueError(
                f"policy_modules: cannot import {name!r}: {type(error).__name__}: {error}"
            ) from error
