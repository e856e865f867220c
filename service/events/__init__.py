"""Events: what happened, rewritten by the historian into absolute, searchable facts."""
