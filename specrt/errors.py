"""User-facing errors: one class per kind of problem, each with a one-line message.

The command line prints `error: <message>` and exits with code 2 for any SpecrtError; other
exceptions are internal errors (exit code 1). All are ValueError subclasses so that an app that
embeds the API can catch bad input with `except ValueError`.
"""


# control characters (a newline in a tensor name read from a hostile file) shown escaped: a message stays one line
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]}


class SpecrtError(ValueError):
    """Base of every error a user can act on. Its message is one line: control characters that came from a
    file (a name, a key) are shown escaped."""

    def __init__(self, message="", *args):
        super().__init__(str(message).translate(_ESCAPES), *args)


class SourceError(SpecrtError):
    """The conversion source is missing, unreadable, corrupt or of an unsupported architecture."""


class BundleError(SpecrtError):
    """A bundle is missing, corrupt, from a newer schema, or does not match its manifest."""


class OutputPathError(SpecrtError):
    """The output path exists (and --force was not given) or cannot be written."""


class ValidationError(SpecrtError):
    """A converted graph disagrees with the torch reference beyond the precision's tolerance."""


class CatalogError(SpecrtError):
    """A catalog name is unknown or its files could not be fetched."""
