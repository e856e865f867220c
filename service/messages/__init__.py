"""The raw chat stream (archival memory), its embedding and its extraction triggers."""
