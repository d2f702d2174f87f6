"""Task data: loading records from lists, files, ``datasets`` and the hub."""
