"""Todos and intentions: things to do or remind at a time, with a lifecycle."""
