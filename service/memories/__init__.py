"""Scoped memories: small curated facts the bot acts on, with their full change history."""
