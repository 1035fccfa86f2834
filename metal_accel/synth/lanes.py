"""Device lanes: work that touches a device (building a problem's model, profiling, proving and timing
candidates) runs one thread at a time per device, so no two measurements on one device overlap.

`metal-accel synth` runs several problems at once, one thread each: a thread holds its device's lane
for all of its problem's work and lends it out only while it waits for LLM answers (`lent`), so the
problems' requests overlap while their device work takes turns.

    lane = lane_for("cuda")
    with lane.hold():          # this problem's device work
        ...
        with lane.lent():      # waiting for answers: other problems may use the device
            ...
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_LANES: dict[str, "DeviceLane"] = {}
_LANES_LOCK = threading.Lock()


class DeviceLane:
    """A lock on one device that knows its holder: re-entrant for it, and lendable while it waits."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._owner: int | None = None

    @property
    def held_here(self) -> bool:
        """Whether the calling thread holds the lane."""
        return self._owner == threading.get_ident()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the lane for the block (at once if this thread holds it already)."""
        if self.held_here:
            yield
            return
        self._lock.acquire()
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None
            self._lock.release()

    @contextmanager
    def lent(self) -> Iterator[None]:
        """Let other threads use the device during the block, if this thread holds the lane; take it back
        (waiting for its current user) after."""
        if not self.held_here:
            yield
            return
        self._owner = None
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            self._owner = threading.get_ident()


def lane_for(device: str) -> DeviceLane:
    """The process's lane for `device` (a backend name: 'cpu', 'cuda', 'mps')."""
    with _LANES_LOCK:
        lane = _LANES.get(device)
        if lane is None:
            lane = _LANES[device] = DeviceLane(device)
        return lane
