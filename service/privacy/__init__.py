"""Privacy: export of everything about a person, real erasure, personal-data policy."""
