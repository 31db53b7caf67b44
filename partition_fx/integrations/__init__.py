"""Partitioned training inside the tools you already use: ``integrations.lightning`` (a ``LightningModule``, the
``lightning`` extra). Each module imports its library when it is imported, and says which extra to install when
the library is missing."""
