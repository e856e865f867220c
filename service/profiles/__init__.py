"""Profiles: the bot's current picture of a person, a group, or a person within a group."""
