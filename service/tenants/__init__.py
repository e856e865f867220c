"""Tenants, their API keys and their per-tenant settings."""
