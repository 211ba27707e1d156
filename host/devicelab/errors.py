"""User-facing errors: one clear line saying what is wrong and how to fix it."""


class DevicelabError(Exception):
    """An error the user can act on. str(e) is a single line; `detail` is optional extra text
    (e.g. the tail of a failed build log) printed below it."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message.strip().splitlines()[0] if message.strip() else message)
        self.detail = detail


class RetryableError(DevicelabError):
    """A failure of one cell that may succeed when the run is repeated (device gone, link dropped)."""


class NotMeasurable(DevicelabError):
    """The device's own verdict on one cell: it cannot be measured there (recorded as the cell's result, skipped
    with this reason, and not retried)."""


class MemoryKilled(NotMeasurable):
    """The OS killed the payload for its memory (iOS jetsam): on a phone, the RAM verdict itself."""
