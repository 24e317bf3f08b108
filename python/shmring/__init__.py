"""shmring: collective communication between the processes of one machine,
over one POSIX shared-memory segment.

The compiled core lives in ``shmring._shmring``; everything public is
re-exported here, so ``import shmring`` is all a user needs. Layers that
depend on optional packages (``shmring.torch``, the torch.distributed
backend) are separate submodules, imported on request (``shmring.torch``
also at once when torch is already imported, which registers the backend).
"""

from ._shmring import *  # noqa: F401,F403
from ._shmring import __version__  # noqa: F401


def _register_torch_backend():
    # When torch is already imported, register the torch.distributed backend
    # "shmring" at once (cheap then); otherwise `import shmring.torch` does
    # it, so a plain `import shmring` never pays for importing torch.
    import sys
    if "torch" not in sys.modules:
        return
    try:
        from . import torch as _  # noqa: F401
    except ImportError:
        pass  # built without the backend, or torch without distributed
    except Exception as e:  # never let the optional layer break `import shmring`
        import warnings
        warnings.warn(f"shmring: the torch.distributed backend was not registered: {e}")


_register_torch_backend()
del _register_torch_backend
