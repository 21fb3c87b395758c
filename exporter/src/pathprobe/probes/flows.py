"""The health of a continuous prober's flows (source ports), kept apart so that one broken
member of an ECMP group shows as a partially failing path."""

from __future__ import annotations

from collections import deque


class FlowHealth:
    """Recent outcomes of one flow (one source port): a flow whose recent probes are
    mostly lost is failing, which one broken member of an ECMP group looks like."""

    RECENT, MIN_OUTCOMES, FAILING_RATIO = 32, 4, 0.5

    def __init__(self) -> None:
        self.outcomes: deque[bool] = deque(maxlen=self.RECENT)  # True: lost
        self.lost = 0  # of the outcomes kept

    def record(self, lost: bool) -> None:
        if len(self.outcomes) == self.RECENT:
            self.lost -= self.outcomes[0]
        self.outcomes.append(lost)
        self.lost += lost

    def loss_ratio(self) -> float:
        return self.lost / len(self.outcomes) if self.outcomes else 0.0

    def failing(self) -> bool:
        return len(self.outcomes) >= self.MIN_OUTCOMES and self.loss_ratio() >= self.FAILING_RATIO
