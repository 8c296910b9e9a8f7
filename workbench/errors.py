"""The one exception type users see: every message names the problem and the fix."""


class WorkbenchError(Exception):
    """Bad input or an environment problem, explained. The CLI prints it without a traceback."""


class ArtifactError(WorkbenchError):
    """An artifact (run directory, trace, report) that cannot be read as it is."""


class MissingDependency(WorkbenchError, ImportError):
    """An optional package a command needs is not installed. An ImportError too, so code that
    probes for the package (`except ImportError`) still works; the CLI prints the fix."""
