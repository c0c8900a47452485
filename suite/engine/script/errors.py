"""What ends or refuses a watched run: ``Stop`` at the boundary after the last step compared, and
the errors a script that cannot be checked raises."""

from __future__ import annotations


class ScriptError(Exception):
    """The script cannot be checked (it does not import, builds no strategy, draws no distributed
    dataset); the message is one line naming the script."""


class Unsupported(BaseException):
    """The script does what the check cannot run (serves as a cluster's task); a BaseException,
    so that the script's ``except Exception`` does not take it for its own error."""


class WrongKind(Unsupported):
    """A parameter-server script (it builds a ParameterServerStrategy or a ClusterCoordinator) run
    for a synchronous spec, or a synchronous one for a parameter-server spec (the harness knows
    the script's kind from the spec's)."""


class Stop(BaseException):
    """Raised at the boundary after the last compared step (a BaseException: a script's
    ``except Exception`` does not catch it)."""
