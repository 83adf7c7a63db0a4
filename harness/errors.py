"""Errors a launcher raises, each naming what is wrong and what to do about it."""


class PrerequisiteMissing(RuntimeError):
    """Something a service needs is not on this machine (a binary, Java, a package, network)."""

    def __init__(self, what: str, how_to_get_it: str) -> None:
        super().__init__(f"missing prerequisite: {what}. To get it: {how_to_get_it}")
        self.what = what
        self.how_to_get_it = how_to_get_it


class ServiceFailed(RuntimeError):
    """A service process exited or did not become ready in time; the message quotes its log."""
