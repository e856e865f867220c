"""Re-embedding: every stored vector remade by another embedding model, then one switch."""
