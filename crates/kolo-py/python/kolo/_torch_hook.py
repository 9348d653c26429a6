"""torch's plugin hook for the kolo backend (the package's ``torch.backends`` entry point, which
``import torch`` runs): imports ``kolo.torch``, which registers the backend.

A module of its own that does not import torch, so that the import order does not matter: after
``import kolo.torch``, whose ``import torch`` runs this hook while ``kolo.torch`` is still being
imported, the hook leaves the registration to ``kolo.torch`` (it registers when it is done);
after ``import torch`` it imports ``kolo.torch`` here. A failure never breaks ``import torch``.
"""

import sys


def autoload():
    """Registers the ``"kolo"`` torch.distributed backend, unless ``kolo.torch`` is being imported
    (then it registers itself)."""
    being_imported = sys.modules.get("kolo.torch")
    if being_imported is not None and not getattr(being_imported, "_registered", False):
        return
    try:
        from . import torch as kolo_torch

        kolo_torch.register()
    except Exception as e:  # pragma: no cover - depends on the torch build
        import warnings

        warnings.warn(f"kolo: could not register the torch.distributed backend: {e}")
