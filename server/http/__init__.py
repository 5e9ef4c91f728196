"""The HTTP front end."""
