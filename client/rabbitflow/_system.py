"""Process-wide property sources: ``RABBITFLOW_OPTS`` and ``system_properties``."""

from __future__ import annotations

from ._properties import read_environment

__all__ = ["environment_properties", "explicit_system_properties", "system_properties"]


def environment_properties() -> dict[str, str]:
    """The properties of ``RABBITFLOW_OPTS`` now (read at each factory creation).

    Raises:
        InvalidPropertyError: the variable cannot be parsed.
    """
    return read_environment()


def _seed() -> dict[str, object]:
    try:
        return dict(read_environment())
    except ValueError:
        # A bad RABBITFLOW_OPTS must not break `import rabbitflow`; the
        # factory reports it when it reads the variable again.
        return {}


# Seeded from RABBITFLOW_OPTS at import; applications may change it at run time.
system_properties: dict[str, object] = _seed()
_seeded = dict(system_properties)


def explicit_system_properties() -> dict[str, object]:
    """Entries of ``system_properties`` the application set or changed.

    Entries still equal to their import-time seed only mirror
    ``RABBITFLOW_OPTS``, so the variable's current value decides for them.
    """
    return {
        name: value
        for name, value in system_properties.items()
        if not (name in _seeded and _seeded[name] == value)
    }
