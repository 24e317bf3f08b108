"""shmring: collective communication between the processes of one machine,
over one POSIX shared-memory segment.

The compiled core lives in ``shmring._shmring``; everything public is
re-exported here, so ``import shmring`` is all a user needs. Layers that
depend on optional packages (``shmring.torch``, the torch.distributed
backend) are separate submodules, imported only on request.
"""

from ._shmring import *  # noqa: F401,F403
from ._shmring import __version__  # noqa: F401
