"""Declarative pipeline definitions: ordered stages with named outputs, placed only when run."""
