"""Bringing another memory system's data into a tenant (``memoria import``)."""
