"""Examples of what a user brings: their own model (``models.py``). Not part of the installed package."""
