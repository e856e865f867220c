"""The bot's ``end`` call: the turn's memo and observations, handed over in milliseconds."""
