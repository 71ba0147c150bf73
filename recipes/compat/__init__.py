"""The recipes' compatibility layer: the one place in ``recipes`` that touches Lightning's private names
(``recipes.compat.internals``); ``lightning_modules`` and ``datamodules`` never import it."""
