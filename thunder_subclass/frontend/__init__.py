"""Stages that run while thunder interprets the user's code (see ``thunder_subclass.__init__``)."""
