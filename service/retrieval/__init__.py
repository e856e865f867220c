"""Retrieval shared by every search: lexical terms, rank fusion, time decay, MMR, neighbours."""
