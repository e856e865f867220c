"""The read path: the per-turn memory context and the bot's memory tools."""
