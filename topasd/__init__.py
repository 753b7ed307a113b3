"""topasd: the TOPAS scheduler daemon (README.md)."""

from importlib import metadata


def version() -> str:
    """topasd's installed version ("unknown" from a bare checkout)."""
    try:
        return metadata.version("topasd")
    except metadata.PackageNotFoundError:
        return "unknown"
