"""Per-example subnetworks: every example of a batch through its own subnetwork (and with gradients to its
own partition), as ``PartitionedModel.forward`` runs them when ``subnetwork`` is a tensor.

- ``grouped``: one forward per distinct subnetwork; works for every model.
- ``one_pass``: one forward for the whole batch with per-example output masks and gradient routing; for
  node partitioning of conv/linear layers and norm affines.
- ``routing``: the checked per-example arguments both share.
"""

from .grouped import forward_grouped
from .one_pass import forward_one_pass, supports_one_pass
from .routing import Routing, batch_size, checked_routing

__all__ = ["Routing", "batch_size", "checked_routing", "forward_grouped", "forward_one_pass", "supports_one_pass"]
