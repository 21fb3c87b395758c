"""The echo prober's recent packets by sequence number, in a ring of compact arrays: a packet's
flow and index in it, and whether it was answered or expired, for the echoes that come after
their packet left the prober's hands (a duplicate, a late echo). Three dicts of the last
thousand packets each, for every peer, were a fair share of the exporter's memory."""

from __future__ import annotations

from array import array

IN_FLIGHT, ANSWERED, EXPIRED = 0, 1, 2


class Recent:
    """The last `size` sequence numbers sent (seq % size its slot; a later seq takes it over)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._seqs = array("q", [-1]) * size
        self._flows = array("i", [0]) * size
        self._indexes = array("q", [0]) * size
        self._states = bytearray(size)

    def sent(self, seq: int, flow: int, index: int) -> None:
        slot = seq % self.size
        self._seqs[slot], self._flows[slot], self._indexes[slot], self._states[slot] = seq, flow, index, IN_FLIGHT

    def mark(self, seq: int, state: int) -> None:
        """`seq` answered or expired; nothing when it is no longer among the recent."""
        slot = seq % self.size
        if self._seqs[slot] == seq:
            self._states[slot] = state

    def state(self, seq: int) -> int | None:
        """IN_FLIGHT, ANSWERED or EXPIRED; None for a seq not among the recent (or never sent)."""
        slot = seq % self.size
        return self._states[slot] if self._seqs[slot] == seq else None

    def flow_index(self, seq: int) -> tuple[int, int] | None:
        """The flow `seq` was sent on and its 1-based index there; None when not among the recent."""
        slot = seq % self.size
        return (self._flows[slot], self._indexes[slot]) if self._seqs[slot] == seq else None
