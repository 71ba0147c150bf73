"""Lightning hook plumbing that every other package of ``recipes`` may use (it imports none of them).

- ``forwarding``: ``ForwardingCallback``, one callback that forwards each Lightning hook only to the members that
  need it (the base of the callback group, the loop doctor and a doctor check used alone).
"""

from recipes.hooks.forwarding import HOOKS, ForwardingCallback, defined_hooks, defines

__all__ = ["HOOKS", "ForwardingCallback", "defined_hooks", "defines"]
