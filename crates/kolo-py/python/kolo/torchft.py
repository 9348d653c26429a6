"""kolo as torchft's CPU process group: :class:`ProcessGroupKolo` is a reconfigurable
``torchft.process_group.ProcessGroupWrapper`` (like torchft's ``ProcessGroupGloo``) whose groups
are kolo's torch backend. torchft's Manager calls ``configure(store_addr, replica_id, rank,
world_size)`` with each new quorum; the group aborts the old kolo communicator (its operations in
flight fail on every rank at once) and connects a new one through the quorum's store::

    from kolo.torchft import ProcessGroupKolo
    manager = torchft.Manager(pg=ProcessGroupKolo(), ...)

Needs ``pip install torchft`` (0.2 or newer).
"""

from datetime import timedelta

from torchft.process_group import ProcessGroupWrapper

from .torch import make_group

__all__ = ["ProcessGroupKolo"]


class ProcessGroupKolo(ProcessGroupWrapper):
    """A reconfigurable process group on kolo (CPU tensors): each ``configure`` makes a new
    :class:`kolo.torch.ProcessGroupKolo` over the quorum's store; ``abort`` ends the current one."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)

    def _create_pg(self, store, rank, world_size):
        return make_group(
            store, rank, world_size, group="torchft", timeout=self._timeout.total_seconds()
        )

    def getBackendName(self):
        return "torchft-kolo"
