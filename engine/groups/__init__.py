"""Worker groups and their transport: the Batch, dispatch protocols, local and Ray backends, process groups."""
