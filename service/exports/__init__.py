"""Exports written by a job: large exports kept for a while, then fetched and pruned."""
