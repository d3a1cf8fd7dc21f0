"""Feedback: ratings of the responses a key received."""
