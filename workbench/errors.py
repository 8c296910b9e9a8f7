"""The one exception type users see: every message names the problem and the fix."""


class WorkbenchError(Exception):
    """Bad input or an environment problem, explained. The CLI prints it without a traceback."""


class ArtifactError(WorkbenchError):
    """An artifact (run directory, trace, report) that cannot be read as it is."""
