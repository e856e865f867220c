"""The operator's console: one static page that reads a conversation through the JSON API."""
