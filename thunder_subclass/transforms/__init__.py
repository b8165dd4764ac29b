"""Transforms of the traced program, one a module (see ``thunder_subclass.__init__``)."""
