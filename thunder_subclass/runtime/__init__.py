"""What runs per call and between calls (see ``thunder_subclass.__init__``)."""
